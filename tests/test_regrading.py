"""An instructor's routine operations after a first grading: a due date and a late penalty set
afterwards apply without ``--regrade``, and one learner is graded again under their own id.

A class of three (chapter 1, the cheapest) is graded by ``grade-all``; then the instructor
adds a due date that makes one learner late and the ``zero`` penalty. ``grade-all`` run again,
as it is, must leave what a fresh stock ``nbgrader autograde --force`` of a copy leaves
(``nbgrader export``); ``--student`` and a learner's folder in ``submitted/`` grade that
learner again, filed under their id, no one else.
"""

from __future__ import annotations

import csv
import datetime as dt
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from conftest import CHAPTERS, nbgrader

from autograder.builder import synthetic

pytestmark = pytest.mark.pipeline

CHAPTER = CHAPTERS[0]
NAME = CHAPTER.name
DUE = dt.datetime(2026, 11, 30, 12, 0, 0)
HANDED_IN = {"ada": (1.0, DUE - dt.timedelta(hours=2)), "bo": (1.0, DUE + dt.timedelta(hours=3)),
             "cy": (0.5, DUE - dt.timedelta(minutes=5))}


def _grade_all(where: Path, *options: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "autograder", "grade-all", *options,
                           "--jobs", "2"], cwd=where, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _export(course: Path) -> list[dict]:
    nbgrader("export", "--to", "export.csv", cwd=course)
    with open(course / "export.csv", newline="") as handle:
        return sorted(csv.DictReader(handle), key=lambda row: row["student_id"])


def _set_due_date_and_zero_penalty(course: Path) -> None:
    nbgrader("db", "assignment", "add", NAME, f"--duedate={DUE.isoformat()}", cwd=course)
    with open(course / "nbgrader_config.py", "a") as config:
        config.write("c.LateSubmissionPlugin.penalty_method = 'zero'\n")


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """(the class graded by grade-all, then given a due date and a penalty; a copy of the
    class graded fresh by stock nbgrader with that due date and penalty; grade-all's run
    after the due date and penalty were set, without --regrade)."""
    root = tmp_path_factory.mktemp("regrading")
    ours = root / "class"
    made = subprocess.run([sys.executable, "-m", "autograder", "course-dir", ours,
                           "--chapters", "1", "--course-id", "kvcourse"],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    for learner, (solved, when) in HANDED_IN.items():
        folder = ours / "submitted" / learner / NAME
        folder.mkdir(parents=True)
        nbformat.write(synthetic.solved(CHAPTER, solved), folder / f"{NAME}.ipynb")
        (folder / "timestamp.txt").write_text(when.strftime("%Y-%m-%d %H:%M:%S.%f UTC"))
    stock = root / "stock"
    shutil.copytree(ours, stock)
    _grade_all(ours, "submitted")
    _set_due_date_and_zero_penalty(ours)
    again = _grade_all(ours, "submitted")
    _set_due_date_and_zero_penalty(stock)
    nbgrader("generate_assignment", NAME, cwd=stock)
    nbgrader("autograde", NAME, "--force", cwd=stock)
    return ours, stock, again


def test_a_due_date_and_a_penalty_set_after_grading_apply_without_regrade(graded):
    ours, stock, again = graded
    exported = _export(ours)
    assert exported == _export(stock)
    assert float({row["student_id"]: row for row in exported}["bo"]["score"]) == 0.0
    assert "3 recorded again" in again.stdout and "0 unchanged" in again.stdout, again.stdout
    assert "rerecorded: the due date changed, the late penalty changed: 3" in again.stdout
    with open(ours / "grades.csv", newline="") as handle:
        rows = {row["student_id"]: row for row in csv.DictReader(handle)}
    assert {row["status"] for row in rows.values()} == {"rerecorded"}
    assert rows["bo"]["message"] == "the due date changed, the late penalty changed"
    same = _grade_all(ours, "submitted")
    assert "3 unchanged" in same.stdout and "0 recorded again" in same.stdout, same.stdout


@pytest.mark.parametrize("how", [("submitted", "--student", "bo"), ("submitted/bo",),
                                 (f"submitted/bo/{NAME}",)],
                         ids=["student-option", "learner-folder", "hand-in-folder"])
def test_one_learner_is_graded_again_under_their_own_id(graded, how):
    ours, stock, _ = graded
    done = _grade_all(ours, *how)
    assert "1 submission(s): 0 graded now, 0 unchanged" in done.stdout, done.stdout
    assert "1 graded again" in done.stdout and "regraded: graded again as asked: 1 (bo " \
        in done.stdout
    assert sorted(p.name for p in (ours / "submitted").iterdir()) == sorted(HANDED_IN)
    assert _export(ours) == _export(stock)
    with open(ours / "grades.csv", newline="") as handle:
        rows = {row["student_id"]: row["status"] for row in csv.DictReader(handle)}
    assert rows == {"ada": "graded earlier", "bo": "regraded", "cy": "graded earlier"}


def test_a_learner_named_like_a_chapter_or_a_folder_of_nbgraders_is_refused(graded):
    ours, *_ = graded
    for how in (("submitted", "--student", NAME), (f"source/{NAME}",), ("autograded",)):
        done = subprocess.run([sys.executable, "-m", "autograder", "grade-all", *how],
                              cwd=ours, capture_output=True, text=True, timeout=300)
        assert done.returncode == 1 and done.stderr.startswith("error: "), done.stderr
        assert "nothing graded" in done.stderr or "holds no hand-ins" in done.stderr
    assert sorted(p.name for p in (ours / "submitted").iterdir()) == sorted(HANDED_IN)
