"""The grading CLI end to end: real nbgrader, real kernels, learner notebooks right and wrong.

Every chapter: the solutions get full marks, the released exercise zero, and a differently
written correct solution full marks. Chapter 1 also carries the pipeline's own cases: wrong
answers, stderr, warnings, emptied test cells, damaged files, time limits, a class gradebook.
"""

from __future__ import annotations

import csv
import importlib
import json
import sys
import time
import warnings
from pathlib import Path

import nbformat
import pytest
from attacks import KINDS, attacked, attacks_in, stopped_by_the_seal
from conftest import CHAPTERS, grade, graded_together, max_points, selected
from mutants import ch01 as mutants
from notebook_variants import (
    borrowed,
    class_solution,
    fill,
    from_module,
    given_cells_edited,
    source_named,
)

from autograder.host.chapters import EXERCISES
from autograder.table import PARTS
from course.experiments import kv_sizing

pytestmark = pytest.mark.pipeline

CHAPTER = "01_kv_cache_sizing"
FUNCTIONS = list(mutants.MUTANTS)
FULL_MARKS = 18.0


def _stderr_writer(lengths, capacity_tokens, block_size):
    print("debugging output", file=sys.stderr)
    blocks_left = capacity_tokens // block_size
    for admitted, length in enumerate(lengths):
        blocks_left -= (length + block_size - 1) // block_size
        if blocks_left < 0:
            return admitted
    return len(lengths)


def _warner(num_layers, num_kv_heads, head_dim, bytes_per_element):
    warnings.warn("a library warning", UserWarning, stacklevel=1)
    return 2 * num_layers * num_kv_heads * head_dim * bytes_per_element


def _five_notebooks(chapter, repo: Path, folder: Path) -> list[Path]:
    """The instructor's solution (every cell a learner is given to change edited), the
    unfilled exercise, a differently written correct one, one whose every TODO borrows the
    course's own answer, and one whose every TODO reaches for what the checks know
    (``tests/attacks.py``, the kinds taken in turn from one of the chapter's own)."""
    exercise = repo / "exercises" / f"{chapter.name}.ipynb"
    parts = PARTS[chapter.name]
    alternative = importlib.import_module(parts.alternatives)
    names = list(importlib.import_module(parts.mutants).MUTANTS)
    checks = importlib.import_module(parts.checks)
    if hasattr(checks, "SUBJECT"):  # a class built up in steps: the whole alternative class
        whole = class_solution(alternative, alternative.ALTERNATIVES[-1].__name__,
                               checks.SUBJECT)
        solutions = dict.fromkeys(names, whole)
    else:
        solutions = from_module(alternative, names)
    edited = folder / "solution" / f"{chapter.name}.ipynb"
    given_cells_edited(chapter.source, edited)
    return [edited, exercise,
            fill(exercise, folder / "alternative" / f"{chapter.name}.ipynb", solutions),
            borrowed(exercise, folder / "borrowed" / f"{chapter.name}.ipynb", chapter.source),
            attacked(exercise, chapter.source, folder / "attacked" / f"{chapter.name}.ipynb",
                     first=2 * CHAPTERS.index(chapter))]


@pytest.fixture(scope="module")
def every_chapter(request, repo, tmp_path_factory):
    """Each chapter's five notebooks, all graded by one `grade` command, as an instructor
    grades a folder of a class's notebooks (the chapters this run selects): chapter name ->
    (the five results, in order; what was printed for the solution)."""
    folder = tmp_path_factory.mktemp("chapters")
    return graded_together({chapter.name: _five_notebooks(chapter, repo, folder / chapter.name)
                            for chapter in selected(request, "chapter")}, folder / "report.json")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.name)
def test_solution_full_exercise_zero_alternative_full_borrowed_zero(chapter, every_chapter):
    """The instructor's solution (earlier chapters' answers used as the notebook intends),
    every cell a learner is given to change edited, and a differently written correct one get
    full marks; the unfilled exercise and one whose every TODO borrows the course's own answer
    (imported, aliased through importlib, wrapped, partial, a method copied, delegated to,
    inherited) get zero, each test saying why."""
    (solution, unfilled, other, borrower, _), shown = every_chapter[chapter.name]
    names = list(importlib.import_module(PARTS[chapter.name].mutants).MUTANTS)
    full = max_points(chapter)
    assert full > 0 and len(solution["tests"]) == 2 * len(names)  # visible + hidden per TODO
    assert (solution["score"], solution["max_score"]) == (full, full)
    assert all(t["passed"] and t["message"] == "" for t in solution["tests"])
    assert (unfilled["score"], unfilled["max_score"]) == (0, full)
    assert all("is not written yet" in t["message"] for t in unfilled["tests"])
    assert other["score"] == full, [t["message"] for t in other["tests"] if not t["passed"]]
    assert borrower["score"] == 0, [t["id"] for t in borrower["tests"] if t["passed"]]
    assert all("course's own" in t["message"] for t in borrower["tests"]), [
        t["message"] for t in borrower["tests"] if "course's own" not in t["message"]]
    assert solution["chapter"] == chapter.name
    assert "interpreter" in solution["runtime"] or "CUDA" in solution["runtime"]
    assert set(solution) == {"learner", "notebook", "chapter", "timestamp", "status", "error",
                             "runtime", "score", "raw_score", "penalty", "max_score",
                             "language", "tests"}
    assert solution["penalty"] == 0 and solution["raw_score"] == solution["score"]
    assert solution["language"] == "en"
    assert set(solution["tests"][0]) == {"id", "points", "max_points", "passed", "message",
                                         "sealed"}
    assert f"score: {full:g} / {full:g}" in shown and "graded on " in shown, shown


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.name)
def test_every_todo_reaching_for_what_the_checks_know_scores_zero(chapter, every_chapter):
    """Frames walked, tracebacks and generators climbed, the garbage collector searched, the
    hidden checks found in the loaded modules, imported under a computed name, loaded afresh
    from their file or read and run, a result equal to anything: every test scores zero."""
    attacker = every_chapter[chapter.name][0][4]
    stopped_by_the_seal(attacker, attacks_in(Path(attacker["notebook"])))


def test_the_seal_stopped_every_kind_of_attack_that_found_something(every_chapter):
    """Over the chapters, each kind of attack but the always-equal result (which finds
    nothing to stop) was failed by the seal (``autograder.seal``) somewhere."""
    if len(every_chapter) < len(CHAPTERS):
        pytest.skip("only some chapters were selected")
    stopped = set()
    for results, _ in every_chapter.values():
        stopped |= stopped_by_the_seal(results[4], attacks_in(Path(results[4]["notebook"])))
    assert set(KINDS) - {"always_equal"} <= stopped, stopped


def test_the_attacks_of_the_chapters_take_every_kind(tmp_path):
    """Over the chapters' TODOs, the attacks take every kind at least once."""
    seen = set()
    for index, chapter in enumerate(CHAPTERS):
        exercise = EXERCISES / f"{chapter.name}.ipynb"
        seen |= set(attacks_in(attacked(exercise, chapter.source, tmp_path / chapter.name,
                                        first=2 * index)).values())
    assert seen == set(KINDS)


@pytest.fixture(scope="module")
def batch(repo, tmp_path_factory):
    """One `grade` call over a batch of learners' notebooks, as an instructor would run it."""
    folder = tmp_path_factory.mktemp("batch")
    exercise = repo / "exercises" / f"{CHAPTER}.ipynb"
    reference = from_module(kv_sizing, FUNCTIONS)
    mixed = dict(reference,
                 kv_bytes_per_sequence=source_named(mutants._query_heads, "kv_bytes_per_sequence"),
                 requests_fit_paged=source_named(_stderr_writer, "requests_fit_paged"))
    warned = dict(reference, kv_bytes_per_token=source_named(_warner, "kv_bytes_per_token"))
    tampered = nbformat.read(exercise, as_version=4)
    for cell in tampered.cells:  # a learner "passes" every test by emptying the test cells
        if cell.metadata.get("nbgrader", {}).get("grade"):
            cell.source = "pass"
    (folder / "tampered").mkdir()
    nbformat.write(tampered, folder / "tampered" / f"{CHAPTER}.ipynb")
    corrupt = folder / f"{CHAPTER}-corrupt.ipynb"
    corrupt.write_text('{"cells": [', encoding="utf-8")
    notebooks = {
        "corrupt": corrupt,
        "mixed": fill(exercise, folder / "mixed" / f"{CHAPTER}.ipynb", mixed),
        "warned": fill(exercise, folder / "warned" / f"{CHAPTER}.ipynb", warned),
        "tampered": folder / "tampered" / f"{CHAPTER}.ipynb",
    }
    report = folder / "report.json"
    done = grade("grade", *notebooks.values(), "--json", report)
    results = json.loads(report.read_text()) if report.exists() else []
    by_notebook = {r["notebook"]: r for r in results}
    graded = {name: by_notebook.get(str(path)) for name, path in notebooks.items()}
    return done, graded


def _scores(result: dict) -> dict[str, float]:
    return {t["id"]: t["points"] for t in result["tests"]}


def test_a_damaged_notebook_is_reported_and_the_rest_are_graded(batch):
    done, graded = batch
    assert done.returncode == 1
    errors = done.stderr.strip().splitlines()
    assert len(errors) == 1 and "corrupt notebook, not valid JSON" in errors[0]
    assert graded["corrupt"]["status"] == "not graded" and graded["corrupt"]["tests"] == []
    assert "corrupt notebook, not valid JSON" in graded["corrupt"]["error"]
    assert all(graded[name]["status"] == "graded" for name in ["mixed", "warned", "tampered"])


def test_wrong_answers_lose_exactly_their_tests_with_their_hints(batch):
    _, graded = batch
    result = graded["mixed"]
    lost = {t["id"]: t["message"] for t in result["tests"] if not t["passed"]}
    assert set(lost) == {"test_kv_bytes_per_sequence", "test_kv_bytes_per_sequence_hidden",
                         "test_requests_fit_paged", "test_requests_fit_paged_hidden"}
    assert "You counted query heads" in lost["test_kv_bytes_per_sequence"]
    assert "wrote to stderr" in lost["test_requests_fit_paged"]
    assert result["score"] == FULL_MARKS - 6


def test_a_library_warning_on_stderr_does_not_zero_a_test(batch):
    _, graded = batch
    assert graded["warned"]["score"] == FULL_MARKS


def test_emptied_test_cells_are_restored_from_the_source(batch):
    _, graded = batch
    result = graded["tampered"]
    assert result["score"] == 0
    assert all("is not written yet" in t["message"] for t in result["tests"])


def test_the_printed_report_has_a_line_per_test_and_the_runtime(batch):
    done, graded = batch
    assert "graded on " in done.stdout
    for test in graded["mixed"]["tests"]:
        assert test["id"] in done.stdout
    assert "score: 12 / 18" in done.stdout
    assert "hint: kv_bytes_per_sequence(config=<Llama-3-8B" in done.stdout


@pytest.mark.parametrize(("name", "content", "expected"), [
    ("missing.ipynb", None, "no such file"),
    ("01_kv_cache_sizing.ipynb", '{"cells": [', "corrupt notebook, not valid JSON"),
    ("01_kv_cache_sizing.ipynb", "", "the file is empty"),
    ("01_kv_cache_sizing.txt", "{}", "not a notebook"),
    ("99_not_a_chapter.ipynb", json.dumps({"cells": [], "metadata": {}, "nbformat": 4,
                                           "nbformat_minor": 5}),
     "not a notebook of this course's chapters"),
], ids=["missing", "corrupt-json", "empty", "wrong-extension", "unknown-chapter"])
def test_a_file_that_cannot_be_graded_gets_one_clear_line(tmp_path, name, content, expected):
    path = tmp_path / name
    if content is not None:
        path.write_text(content, encoding="utf-8")
    done = grade("grade", path, "--json", tmp_path / "r.json")
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}") and expected in lines[0]


def test_a_hanging_cell_times_out_and_the_other_cells_still_count(repo, tmp_path):
    exercise = repo / "exercises" / f"{CHAPTER}.ipynb"
    solutions = from_module(kv_sizing, FUNCTIONS)
    solutions["num_gpu_blocks"] = "while True:\n    pass\n"
    notebook = fill(exercise, tmp_path / f"{CHAPTER}.ipynb", solutions)
    done = grade("grade", notebook, "--cell-timeout", "5", "--json", tmp_path / "r.json")
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    failed = {t["id"] for t in result["tests"] if not t["passed"]}
    assert failed == {"test_num_gpu_blocks", "test_num_gpu_blocks_hidden"}
    assert result["score"] == FULL_MARKS - 3


def test_grade_all_fills_a_gradebook_and_exports_csv(repo, tmp_path):
    class_dir = tmp_path / "class"
    (class_dir / "ada").mkdir(parents=True)
    (class_dir / "bo").mkdir()
    (class_dir / "ada" / f"{CHAPTER}.ipynb").write_bytes(
        (repo / "solutions" / f"{CHAPTER}.ipynb").read_bytes())
    (class_dir / "bo" / f"{CHAPTER}.ipynb").write_bytes(
        (repo / "exercises" / f"{CHAPTER}.ipynb").read_bytes())
    database = tmp_path / "class.db"
    done = grade("grade-all", class_dir, "--db", f"sqlite:///{database}", "--csv", "scores.csv",
                 cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert database.exists()
    with open(tmp_path / "scores.csv", newline="") as handle:
        rows = {row["student_id"]: row for row in csv.DictReader(handle)}
    assert float(rows["ada"]["score"]) == FULL_MARKS
    assert float(rows["bo"]["score"]) == 0.0
    assert all(float(row["max_score"]) == FULL_MARKS for row in rows.values())
    assert "2 submission(s): 2 graded now" in done.stdout


def test_grading_twice_gives_the_same_score(batch, repo, tmp_path):
    _, graded = batch
    again = tmp_path / "again.json"
    notebook = Path(graded["mixed"]["notebook"])
    done = grade("grade", notebook, "--json", again)
    assert done.returncode == 0, done.stderr
    assert json.loads(again.read_text())["tests"] == graded["mixed"]["tests"]


def test_a_notebook_past_its_time_limit_scores_zero_and_the_next_is_still_graded(repo, tmp_path):
    exercise = repo / "exercises" / f"{CHAPTER}.ipynb"
    solutions = from_module(kv_sizing, FUNCTIONS)
    solutions["kv_bytes_per_token"] = "import time\nwhile True:\n    time.sleep(1)\n"
    slow = fill(exercise, tmp_path / "slow" / f"{CHAPTER}.ipynb", solutions)
    done = grade("grade", slow, repo / "solutions" / f"{CHAPTER}.ipynb", "--cell-timeout", "600",
                 "--notebook-timeout", "15", "--json", tmp_path / "r.json")
    assert done.returncode == 0, done.stderr
    slow_result, solution_result = json.loads((tmp_path / "r.json").read_text())
    assert slow_result["score"] == 0
    assert all("ran past its 15 s limit" in t["message"] for t in slow_result["tests"])
    assert solution_result["score"] == FULL_MARKS


def test_grading_runs_its_named_steps_in_order_and_the_benchmark_times_them(repo):
    """A solution goes through every step of ``autograde.STEPS``, in order, each run by
    ``Grader.step``; ``python -m autograder bench --breakdown`` times them there (``Timed``)
    and reads where the time went, every part of it a real, non-negative span within the
    grading's own."""
    from autograder.builder.timing import Timed, time_parts
    from autograder.host.autograde import STEPS, Job

    source = (repo / "solutions" / f"{CHAPTER}.ipynb").read_text(encoding="utf-8")
    grader = Timed()
    grader.template(CHAPTER, source)
    began = time.time()
    outcome = grader.autograde(Job(CHAPTER, source, "ada", "ada.ipynb",
                                   nbformat.reads(source, as_version=4)))
    ended = time.time()
    assert outcome.result.score == FULL_MARKS
    steps = [step.__name__ for step in STEPS]
    marked = [name for name in grader.marks if name in steps]
    assert marked == steps
    assert [grader.marks[name] for name in steps] == sorted(grader.marks[n] for n in steps)
    parts = time_parts(grader.marks, outcome.executed)
    assert set(parts) == {"course copy", "nbgrader and kernel start", "imports and set-up",
                          "kernel ready, between cells", "notebook's own cells", "test cells",
                          "nbgrader after the last cell"}
    assert all(0 <= seconds < ended - began for seconds in parts.values()), parts
    assert parts["test cells"] > 0 and "armed" in grader.marks  # the kernel wrote its times
    # the parts are the whole of it, from the course's copy to nbgrader's end
    assert sum(parts.values()) == pytest.approx(
        grader.marks["run_nbgrader"] - grader.marks["strip_demonstrations"], abs=1e-6)


def test_a_flagged_notebook_stops_at_the_flag_step(repo):
    """A step that gives an outcome ends the grading there: a notebook that reaches for the
    grader scores zero, unrun, and no later step runs."""
    from autograder.builder.timing import Timed
    from autograder.host.autograde import Job

    source = (repo / "solutions" / f"{CHAPTER}.ipynb").read_text(encoding="utf-8")
    notebook = nbformat.reads(source, as_version=4)
    answer = next(c for c in notebook.cells
                  if c.metadata.get("nbgrader", {}).get("solution"))
    answer.source += "\nimport autograder.hidden.ch01\n"
    grader = Timed()
    outcome = grader.autograde(Job(CHAPTER, source, "ada", "ada.ipynb", notebook))
    assert outcome.result.score == 0
    assert all("reaches for the grader" in t.message for t in outcome.result.tests)
    assert list(grader.marks) == ["rebuild_answers", "flag"]
