"""Whether a hand-in is graded again (``autograder.host.freshness``): each thing that decides
its grade, changed alone, flips the verdict and says so; nothing changed keeps the grade. No
nbgrader here (``test_regrading.py`` grades a class and changes its due date and penalty)."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

import pytest
from conftest import CHAPTERS

from autograder.host.freshness import (
    EXECUTED,
    GRADE,
    KEEP,
    RECORD,
    RECORDED,
    REGRADE,
    REPO,
    Inputs,
    Verdict,
    checks_of,
    decide,
    digest,
    import_closure,
)

BEFORE = Inputs(file="f0", source="s0", checks="c0", nbgrader="0.9.6", course="0.1.0",
                due_date="2026-11-30 12:00:00", extension="", late_penalty="[]",
                handed_in="2026-11-30 10:00:00")
KEPT = {"inputs": BEFORE.to_json(), "result": {}}


def test_every_input_has_a_reason_and_a_kind():
    assert {f.name for f in fields(Inputs)} == {"file", *EXECUTED, *RECORDED}
    assert not set(EXECUTED) & set(RECORDED)


def test_nothing_changed_keeps_the_grade():
    assert decide(BEFORE, KEPT, graded_notebook=True) == Verdict(KEEP, "unchanged")


@pytest.mark.parametrize("name", [*EXECUTED, *RECORDED])
def test_each_input_changed_alone_flips_the_verdict_with_its_reason(name):
    now = replace(BEFORE, **{name: "changed"})
    action = REGRADE if name in EXECUTED else RECORD
    assert decide(now, KEPT, graded_notebook=True) == \
        Verdict(action, {**EXECUTED, **RECORDED}[name])


def test_a_new_file_is_graded_and_what_changed_with_it_is_not_listed():
    assert decide(BEFORE, None, graded_notebook=False) == Verdict(GRADE, "new")
    now = replace(BEFORE, file="f1", checks="c1", due_date="")
    assert decide(now, KEPT, graded_notebook=True) == Verdict(GRADE, "its file changed")


def test_several_changes_are_all_named_and_running_again_wins_over_recording_again():
    now = replace(BEFORE, checks="c1", course="0.2.0", late_penalty="zero")
    assert decide(now, KEPT, True) == \
        Verdict(REGRADE, "the checks changed, the course's version changed")
    now = replace(BEFORE, due_date="", late_penalty="zero")
    assert decide(now, KEPT, True) == \
        Verdict(RECORD, "the due date changed, the late penalty changed")


def test_asked_or_without_its_graded_notebook_it_runs_again():
    assert decide(BEFORE, KEPT, True, asked=True) == Verdict(REGRADE, "graded again as asked")
    assert decide(replace(BEFORE, checks="c1"), KEPT, True, asked=True).reason == \
        "graded again as asked, the checks changed"
    assert decide(BEFORE, KEPT, False) == \
        Verdict(REGRADE, "its graded notebook in autograded/ is gone")
    # a recording alone needs the notebook autograded/ held: run again instead
    assert decide(replace(BEFORE, due_date=""), KEPT, False).action == REGRADE


def test_an_older_graders_entry_is_graded_again():
    older = {"sha256": "f0", "graded_by": "x", "timestamp": "", "result": {}}
    assert decide(BEFORE, older, True).action == REGRADE
    assert decide(replace(BEFORE, file="f1"), older, True) == Verdict(GRADE, "its file changed")


def _module(root: Path, name: str, code: str = "") -> Path:
    path = root.joinpath(*name.split(".")).with_suffix(".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    for folder in path.relative_to(root).parents:
        if folder != Path("."):
            (root / folder / "__init__.py").touch()
    path.write_text(code)
    return path


def test_the_import_closure_follows_every_kind_of_import_and_only_the_courses(tmp_path):
    checks = _module(tmp_path, "autograder.checks.ch99", (
        "import json\nfrom autograder.checks import ch98_audit\nfrom . import _shared\n"
        "def check():\n    from course.experiments.models import MODELS\n"
        "    import kernels.tiny\n"))
    audit = _module(tmp_path, "autograder.checks.ch98_audit", "from ._memory import x\n")
    memory = _module(tmp_path, "autograder.checks._memory")
    shared = _module(tmp_path, "autograder.checks._shared")
    models = _module(tmp_path, "course.experiments.models")
    tiny = _module(tmp_path, "kernels.tiny")
    unused = _module(tmp_path, "autograder.checks.ch97")
    closure = import_closure(["autograder.checks.ch99"], tmp_path)
    assert {checks, audit, memory, shared, models, tiny} <= set(closure)
    assert unused not in closure and (tmp_path / "autograder" / "__init__.py") in closure
    before = digest(closure)
    memory.write_text("x = 2\n")  # two imports away: still decides the grade
    assert digest(closure) != before


def test_a_chapters_checks_are_what_its_checks_and_notebook_import():
    files = {str(p.relative_to(REPO)) for p in checks_of(CHAPTERS[8].name, CHAPTERS[8].source)}
    assert CHAPTERS[8].number == "09"
    assert {"autograder/checks/ch09.py", "autograder/hidden/ch09.py",
            "autograder/checks/ch07_audit.py", "autograder/guard.py",
            "autograder/arming.py"} <= files  # chapter 7's audit, not by its name
    first = {str(p.relative_to(REPO)) for p in checks_of(CHAPTERS[0].name, CHAPTERS[0].source)}
    assert {"autograder/checks/ch01.py", "autograder/hidden/ch01.py"} <= first
    assert not any(name.split("/")[-1].startswith("ch0") and "ch01" not in name
                   for name in first)
