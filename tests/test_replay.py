"""Replayed cases (``autograder.checks._replay``) give every check the verdict and the hint a
run of hypothesis gives: the cases recorded on passing answers are the ones hypothesis draws
on any passing answer (``for_all``'s handed over as values, a state machine's steps and its
rules' draws played back to hypothesis' run of the machine), a failing one falls back to
hypothesis, which finds the same failure and shrinks it, and a record that no longer fits its
check is not used."""

from __future__ import annotations

import contextlib
import importlib
import marshal
import re
import types

import nbformat
import pytest
from conftest import CHAPTERS, REPO
from hypothesis.internal.conjecture import engine
from notebook_variants import fill, from_module, source_named
from subjects import alternative_subjects

from autograder.checks import _replay
from autograder.checks._helpers import verdict_only
from autograder.host.autograde import RECORDER, Grader, Job, Limits
from autograder.table import PARTS

# a chapter of functions and for_all, and one of classes and state machines
REPLAYED = [c for c in CHAPTERS if c.number in ("02", "14")]
# the other state machines' chapters: their mutants' failures compared as first found, not
# shrunk (shrinking each twice would take minutes)
UNSHRUNK = [c for c in CHAPTERS if c.number in ("03", "04")]


def _thorough(chapter, name):
    return getattr(importlib.import_module(PARTS[chapter.name].hidden), f"check_{name}_thoroughly")


def _mutants(chapter):
    return importlib.import_module(PARTS[chapter.name].mutants).MUTANTS


def _passing(chapter) -> list:
    """(TODO, subject) for every differently written correct answer of the chapter."""
    parts = PARTS[chapter.name]
    checks = importlib.import_module(parts.checks)
    alternatives = importlib.import_module(parts.alternatives)
    return [(name, subject) for name in _mutants(chapter)
            for subject in alternative_subjects(checks, alternatives, name)]


def _verdict(check, subject) -> str | None:
    try:
        check(subject)
    except AssertionError as failure:
        # chapter 3's timings of the free pool, measured afresh (no case is drawn for them)
        text = str(failure)
        return re.sub(r"\d+(\.\d+)?", "#", text) if "per call" in text else text
    return None


@pytest.fixture
def records(monkeypatch):
    """Replay with what was recorded in the test; nothing recorded or replayed after it."""
    monkeypatch.setattr(_replay, "_RECORDS", types.MappingProxyType({}))
    monkeypatch.setattr(_replay, "_RECORDING", {})
    return monkeypatch


def _record(chapter, path, monkeypatch) -> None:
    monkeypatch.setenv(_replay.RECORD, str(path))
    for name, subject in _passing(chapter):
        assert _verdict(_thorough(chapter, name), subject) is None
    monkeypatch.delenv(_replay.RECORD)


def _engine_runs(monkeypatch) -> list:
    started = []
    original = engine.ConjectureRunner.__init__

    def counted(self, *args, **kwargs):
        started.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(engine.ConjectureRunner, "__init__", counted)
    return started


@pytest.mark.parametrize("chapter", REPLAYED + UNSHRUNK, ids=lambda c: c.name)
def test_replayed_checks_pass_every_alternative_and_give_every_mutant_its_hint(
        chapter, tmp_path, records):
    found = verdict_only if chapter in UNSHRUNK else contextlib.nullcontext
    recorded = tmp_path / "cases"
    _record(chapter, recorded, records)
    assert _replay.load(recorded)
    assert _replay._RECORDS, "the chapter's checks recorded nothing"
    for run_key, (cases, values) in _replay._RECORDS.items():  # every case kept as values
        assert values is not None and len(values) == len(cases), run_key
    started = _engine_runs(records)
    for name, subject in _passing(chapter):  # replayed: hypothesis' engine never starts
        assert _verdict(_thorough(chapter, name), subject) is None, (name, subject)
    assert not started
    replayed = dict(_replay._RECORDS)
    for name, mutants in _mutants(chapter).items():
        for mutant, _ in mutants:
            records.setattr(_replay, "_RECORDS", types.MappingProxyType({}))
            with found():
                drawn = _verdict(_thorough(chapter, name), mutant)
            records.setattr(_replay, "_RECORDS", types.MappingProxyType(replayed))
            with found():
                assert _verdict(_thorough(chapter, name), mutant) == drawn, (name, mutant)


def test_a_record_that_no_longer_fits_its_check_is_not_replayed(tmp_path, records):
    chapter = REPLAYED[0]
    recorded = tmp_path / "cases"
    _record(chapter, recorded, records)
    written, cases = marshal.loads(recorded.read_bytes())
    # every case of every run drawn one choice short, its value not kept: the check draws
    # past the record
    recorded.write_bytes(marshal.dumps((written, {
        key: (tuple(choices[:-1] for choices in runs), None)
        for key, (runs, _) in cases.items()})))
    assert _replay.load(recorded)
    started = _engine_runs(records)
    name, subject = _passing(chapter)[0]
    assert _verdict(_thorough(chapter, name), subject) is None
    assert started, "a record that does not fit was replayed"
    # recorded by other code, or another hypothesis: not read at all
    recorded.write_bytes(marshal.dumps(("another fingerprint", cases)))
    assert not _replay.load(recorded)
    recorded.write_bytes(b"not a record")
    assert not _replay.load(recorded)


def test_a_state_machine_whose_rules_draw_from_other_samples_is_not_replayed(tmp_path, records):
    """A rule's draw from another sample than the one recorded means the machine's state
    went otherwise: the case is drawn afresh by hypothesis, not played back."""
    chapter = UNSHRUNK[-1]
    recorded = tmp_path / "cases"
    _record(chapter, recorded, records)
    written, cases = marshal.loads(recorded.read_bytes())

    def elsewhere(tape: bytes) -> bytes:
        steps = list(marshal.loads(tape))
        for index, step in enumerate(steps):
            if step[0] == _replay._DRAW:
                steps[index] = (_replay._DRAW,
                                marshal.dumps(("SampledFromStrategy", (99,))), step[2])
                break
        return marshal.dumps(tuple(steps))

    machines = {key for key in cases if key.startswith("stateful")}
    assert machines and all(cases[key][1] is not None for key in machines)
    recorded.write_bytes(marshal.dumps((written, {
        key: (runs, tuple(map(elsewhere, values)) if key in machines else values)
        for key, (runs, values) in cases.items()})))
    assert _replay.load(recorded)
    started = _engine_runs(records)
    for name, subject in _passing(chapter):
        assert _verdict(_thorough(chapter, name), subject) is None
    assert started, "steps drawn from other samples were played back"


def test_state_machines_built_with_other_values_are_told_apart():
    from autograder.hidden.ch03 import _machine
    from course.v0.block_manager import BlockManager

    class Learners(BlockManager):
        pass

    described = _replay._machine(_machine(BlockManager, {"append", "fork"}))
    assert described == _replay._machine(_machine(Learners, {"fork", "append"}))
    assert described != _replay._machine(_machine(BlockManager, {"append"}))
    assert " at 0x" not in described


def test_a_class_records_its_chapters_cases_once_and_its_notebooks_replay_them(tmp_path):
    """Through the grader: a chapter's solution's cases, recorded for a class (at full marks),
    kept in the cache and handed to each kernel; a wrong answer graded with them gets what it
    gets from checks that draw afresh."""
    chapter = REPLAYED[0]
    source = chapter.source.read_text(encoding="utf-8")
    module = importlib.import_module(PARTS[chapter.name].answers["locate"])
    names = list(PARTS[chapter.name].answers)
    mutant = _mutants(chapter)["locate"][2][0]
    # the learner's cell asks whether it was handed cases, and whether it can read them
    asks = ("\nimport os\nprint('handed cases:', bool(os.environ.get('KV_COURSE_CASES')),"
            " os.path.exists(os.environ.get('KV_COURSE_CASES', '')))\n")
    wrong = fill(REPO / "exercises" / f"{chapter.name}.ipynb", tmp_path / "wrong.ipynb",
                 {**from_module(module, names), "locate": source_named(mutant, "locate") + asks})
    told = []

    def graded(grader: Grader) -> list:
        outcome = grader.autograde(Job(chapter.name, source, "learner", "wrong.ipynb",
                                       nbformat.read(wrong, as_version=4)))
        told.append({output.get("text", "").strip() for cell in outcome.executed.cells
                     for output in cell.get("outputs", []) if "handed cases" in
                     output.get("text", "")})
        return [(t.id, t.points, t.message) for t in outcome.result.tests]

    drawing = Grader(Limits(), cache=tmp_path / "drawing")
    replaying = Grader(Limits(), cache=tmp_path / "replaying")
    replaying.record_cases(chapter.name, source)
    kept = replaying.cases(chapter.name)
    assert kept is not None and marshal.loads(kept.read_bytes())[1]
    assert drawing.cases(chapter.name) is None  # nothing recorded there
    assert graded(replaying) == graded(drawing)
    # replayed with the cases read at arming and gone before the learner's first cell
    assert told == [{"handed cases: True False"}, {"handed cases: False False"}]


def test_a_chapter_whose_checks_draw_nothing_is_recorded_once_as_nothing(tmp_path, monkeypatch):
    chapter = next(c for c in CHAPTERS if c.number == "01")  # its checks draw no cases
    source = chapter.source.read_text(encoding="utf-8")
    grader = Grader(Limits(), cache=tmp_path)
    graded = []
    autograde = Grader.autograde
    monkeypatch.setattr(Grader, "autograde", lambda self, job: graded.append(job) or
                        autograde(self, job))
    grader.record_cases(chapter.name, source)
    assert len(graded) == 1 and graded[0].learner == RECORDER
    assert grader.cases(chapter.name) is None
    grader.record_cases(chapter.name, source)
    assert len(graded) == 1, "the solution was graded again for a record of nothing"
