"""``grade-all`` leaves a class's course directory as nbgrader's own ``autograde`` does.

One class, copied: stock ``nbgrader autograde`` grades one copy, ``grade-all`` the other, in
two rounds. Learners: on time; 12.5 hours late past a due date with the ``zero`` penalty; a
stray ``Untitled.ipynb`` beside the chapter's notebook; graded once, then resubmitting late;
a manual grade given by the instructor between the rounds, then everything graded again.
Required: the same ``nbgrader export``, the same grade of every cell with the same flags, the
same files in ``autograded/``, and nbgrader's own feedback commands working after
``grade-all`` as after its autograde.
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
ON_TIME = DUE - dt.timedelta(hours=2)
LATE = DUE + dt.timedelta(hours=12, minutes=30)
MANUAL = "a b"


def _grade_all(course: Path, *options: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "autograder", "grade-all", str(course),
                           "--jobs", "2", *options], cwd=course.parent, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _hand_in(course: Path, learner: str, notebook, when: dt.datetime,
             stray: bool = False) -> None:
    folder = course / "submitted" / learner / NAME
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, folder / f"{NAME}.ipynb")
    (folder / "timestamp.txt").write_text(when.strftime("%Y-%m-%d %H:%M:%S.%f UTC"))
    # as `nbgrader submit` leaves it: the key its feedback is released and fetched under
    (folder / "submission_secret.txt").write_text(f"secret-of-{learner}-{when:%H%M}")
    if stray:
        nbformat.write(nbformat.v4.new_notebook(), folder / "Untitled.ipynb")


def _give_manual_grade(course: Path) -> None:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", "kvcourse") as book:
        grade = book.find_submission_notebook(NAME, NAME, MANUAL).grades[0]
        grade.manual_score = 1.0
        book.db.commit()


def _cells(course: Path) -> dict:
    """Every grade of every submission: its scores, its flag, and the submission's penalty."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", "kvcourse") as book:
        return {(s.student_id, g.name): (g.auto_score, g.manual_score, g.needs_manual_grade,
                                         s.late_submission_penalty, s.timestamp)
                for s in book.find_assignment(NAME).submissions
                for g in s.notebooks[0].grades}


def _export(course: Path) -> list[dict]:
    nbgrader("export", "--to", "export.csv", cwd=course)
    with open(course / "export.csv", newline="") as handle:
        return sorted(csv.DictReader(handle), key=lambda row: row["student_id"])


def _files(course: Path, folder: str) -> set[str]:
    return {str(p.relative_to(course / folder)) for p in (course / folder).rglob("*")
            if p.is_file()}


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """The class graded both ways: (by nbgrader, by grade-all, grade-all's second run)."""
    root = tmp_path_factory.mktemp("parity")
    exchange = root / "exchange"
    exchange.mkdir()
    made = subprocess.run([sys.executable, "-m", "autograder", "course-dir", root / "class",
                           "--chapters", "1", "--course-id", "kvcourse", "--exchange",
                           exchange], capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    stock = root / "class"
    with open(stock / "nbgrader_config.py", "a") as config:
        config.write("c.LateSubmissionPlugin.penalty_method = 'zero'\n")
    nbgrader("db", "assignment", "add", NAME, f"--duedate={DUE.isoformat()}", cwd=stock)
    nbgrader("generate_assignment", NAME, cwd=stock)
    _hand_in(stock, "s0012345", synthetic.solved(CHAPTER), ON_TIME)
    _hand_in(stock, "anna.li", synthetic.solved(CHAPTER), LATE)
    _hand_in(stock, "李明", synthetic.solved(CHAPTER, 0.5), ON_TIME, stray=True)
    _hand_in(stock, "o'brien", synthetic.solved(CHAPTER, 0.5), ON_TIME)
    _hand_in(stock, MANUAL, synthetic.solved(CHAPTER), ON_TIME)
    ours = root / "moved" / "copy of the class"  # a copied class keeps working where it is
    shutil.copytree(stock, ours)

    nbgrader("autograde", NAME, "--force", cwd=stock)
    _grade_all(ours)
    for course in (stock, ours):  # between the rounds: a late resubmission, a manual grade
        _hand_in(course, "o'brien", synthetic.solved(CHAPTER), LATE)
        _give_manual_grade(course)
    nbgrader("autograde", NAME, "--force", cwd=stock)
    again = _grade_all(ours, "--regrade")
    return stock, ours, again


def test_the_export_is_nbgrader_autogrades(graded):
    stock, ours, _ = graded
    exported = _export(ours)
    assert exported == _export(stock)
    by_learner = {row["student_id"]: row for row in exported}
    full = str(sum(points for _, points in CHAPTER.test_cells()))
    assert float(by_learner["anna.li"]["raw_score"]) == float(full)
    assert float(by_learner["anna.li"]["score"]) == 0.0  # the zero penalty, applied
    assert float(by_learner["o'brien"]["score"]) == 0.0  # resubmitted late: zero too
    assert 0 < float(by_learner["李明"]["score"]) < float(full)  # its stray notebook skipped


def test_every_grade_and_flag_is_nbgrader_autogrades(graded):
    stock, ours, _ = graded
    cells = _cells(ours)
    assert cells == _cells(stock)
    flagged = {key for key, value in cells.items() if value[2]}
    manual = {key for key, value in cells.items() if value[1] is not None}
    # the manual grade is kept, and flagged for review after the automatic regrade; no other
    # grade waits for a grader
    assert flagged == manual and len(manual) == 1 and next(iter(manual))[0] == MANUAL


def test_the_course_directory_holds_what_nbgrader_leaves(graded):
    stock, ours, again = graded
    assert _files(ours, "autograded") == _files(stock, "autograded")
    assert f"o'brien/{NAME}/timestamp.txt" in _files(ours, "autograded")
    assert "Untitled.ipynb" not in str(_files(ours, "autograded"))
    # grade-all's own CSV: nbgrader export's columns first, the same values
    with open(ours / "grades.csv", newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row["status"] != "ignored"]
    exported = _export(stock)
    assert sorted(({k: row[k] for k in exported[0]} for row in rows),
                  key=lambda row: row["student_id"]) == exported
    assert "1 graded now" in again.stdout and "4 graded again" in again.stdout
    assert "1 ignored" in again.stdout
    assert "warning:" in again.stderr and "Untitled.ipynb" in again.stderr


def test_nbgraders_feedback_commands_work_after_grade_all(graded):
    _, ours, _ = graded
    page = ours / "feedback" / "anna.li" / NAME / f"{NAME}.html"
    assert page.exists() and "BEGIN HIDDEN TESTS" not in page.read_text()
    assert str(ours.parent) not in page.read_text()  # no server path on a learner's page
    nbgrader("generate_feedback", NAME, "--force", cwd=ours)
    done = nbgrader("release_feedback", NAME, cwd=ours)
    released = done.stdout + done.stderr
    assert "anna.li" in released
    assert len(list((ours.parent.parent / "exchange").rglob("*.html"))) == 5


def test_a_changed_test_grades_every_hand_in_of_its_chapter_again(graded):
    """Runs last: it edits the class's source. The same files, a changed test: each is
    graded again, and the run says so; run once more, nothing is."""
    _, ours, _ = graded
    source = ours / "source" / NAME / f"{NAME}.ipynb"
    notebook = nbformat.read(source, as_version=4)
    test = next(c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade"))
    test.source += "\n# checked again after the instructor's edit\n"
    nbformat.write(notebook, source)
    changed = _grade_all(ours)
    assert "0 graded now" in changed.stdout and "5 graded again" in changed.stdout
    same = _grade_all(ours)
    assert "5 unchanged" in same.stdout and "0 graded again" in same.stdout
