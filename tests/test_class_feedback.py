"""After ``grade-all`` the class directory is nbgrader's own (issue #51): its feedback is
released to every learner, formgrader lists every hand-in with stock nbgrader's flags, and
what the run reports is the score nbgrader records, after its late penalty.

One class of chapter 1, copied before grading: stock ``nbgrader autograde --force`` grades one
copy, ``grade-all`` the other. Learners: ``good`` on time; ``broken``, a damaged notebook;
``deleted``, whose first test cell is gone; ``zed``, half solved, late past the due date
with the ``zero`` penalty, from a learning platform's zip (no exchange, so no submission
secret). The hand-ins in ``submitted/`` came through nbgrader's exchange.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
from conftest import CHAPTERS, grade, nbgrader

from autograder.builder import synthetic
from autograder.host import report

CHAPTER = CHAPTERS[0]
NAME = CHAPTER.name
COURSE_ID = "kvcourse"
DUE = dt.datetime(2026, 11, 30, 12, 0, 0)
ON_TIME = DUE - dt.timedelta(hours=2)
LATE = (2026, 11, 30, 23, 59, 58)  # the zip entry's time, read as UTC
FULL = sum(points for _, points in CHAPTER.test_cells())
ZIPPED = f"zed/{NAME}.ipynb"
pipeline = pytest.mark.pipeline  # the tests that grade: about 5 s a notebook


def _deleted_first_test() -> tuple[nbformat.NotebookNode, str]:
    """Solved, its first test cell deleted; and that cell's grade id."""
    notebook = synthetic.solved(CHAPTER)
    test = next(c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade"))
    notebook.cells.remove(test)
    return notebook, test.metadata.nbgrader.grade_id


def _hand_in(course: Path, learner: str, contents: bytes) -> None:
    """As ``nbgrader submit`` then ``collect`` leave a hand-in."""
    folder = course / "submitted" / learner / NAME
    folder.mkdir(parents=True)
    (folder / f"{NAME}.ipynb").write_bytes(contents)
    (folder / "timestamp.txt").write_text(ON_TIME.strftime("%Y-%m-%d %H:%M:%S.%f UTC"))
    (folder / "submission_secret.txt").write_text(f"secret-of-{learner}")


def _view(course: Path) -> dict:
    """Formgrader's view of the chapter: every submission (time, late penalty, whether it
    needs manual grading) and every grade (automatic and manual score, its flag)."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", COURSE_ID) as book:
        return {s.student_id: (s.timestamp, s.late_submission_penalty, s.needs_manual_grade,
                               {g.name: (g.auto_score, g.manual_score, g.needs_manual_grade)
                                for g in s.notebooks[0].grades})
                for s in book.find_assignment(NAME).submissions}


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> tuple[Path, Path, subprocess.CompletedProcess, str]:
    """(the class graded by stock nbgrader, by grade-all, grade-all's run of the zip, the
    grade id of the test cell ``deleted`` deleted)."""
    root = tmp_path_factory.mktemp("feedback")
    exchange = root / "exchange"
    exchange.mkdir()
    ours = root / "class"
    made = grade("course-dir", ours, "--chapters", "1", "--course-id", COURSE_ID,
                 "--exchange", exchange)
    assert made.returncode == 0, made.stderr
    with open(ours / "nbgrader_config.py", "a") as config:
        config.write("c.LateSubmissionPlugin.penalty_method = 'zero'\n")
    nbgrader("db", "assignment", "add", NAME, f"--duedate={DUE.isoformat()}", cwd=ours)
    nbgrader("generate_assignment", NAME, cwd=ours)
    deleted, grade_id = _deleted_first_test()
    _hand_in(ours, "good", nbformat.writes(synthetic.solved(CHAPTER)).encode())
    _hand_in(ours, "broken", b'{"cells": [')
    _hand_in(ours, "deleted", nbformat.writes(deleted).encode())
    zipped = nbformat.writes(synthetic.solved(CHAPTER, 0.5)).encode()
    with zipfile.ZipFile(root / "uploads.zip", "w") as archive:
        archive.writestr(zipfile.ZipInfo(ZIPPED, LATE), zipped)

    stock = root / "stock"
    shutil.copytree(ours, stock)
    folder = stock / "submitted" / "zed" / NAME  # as grade-all stages the zip's hand-in
    folder.mkdir(parents=True)
    (folder / f"{NAME}.ipynb").write_bytes(zipped)
    (folder / "timestamp.txt").write_text(dt.datetime(*LATE).strftime("%Y-%m-%d %H:%M:%S.%f UTC"))
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent),
                                                 os.environ["PATH"]]))
    # stock autograde fails on the damaged notebook (exit 1) and grades the others
    subprocess.run([sys.executable, "-m", "nbgrader", "autograde", NAME, "--force"], cwd=stock,
                   env=env, capture_output=True, text=True, timeout=600)

    grade("grade-all", ours / "submitted", "--jobs", "2", "--csv", root / "class.csv",
          cwd=root)
    zip_run = grade("grade-all", root / "uploads.zip", "--course-dir", ours, "--json",
                    root / "zip.json", cwd=root)
    return stock, ours, zip_run, grade_id


@pipeline
def test_nbgraders_feedback_commands_release_every_learners_page(graded):
    _, ours, _, _ = graded
    nbgrader("generate_feedback", NAME, "--force", cwd=ours)
    done = nbgrader("release_feedback", NAME, cwd=ours)
    released = done.stdout + done.stderr
    for learner in ("good", "broken", "deleted", "zed"):
        assert f"student '{learner}'" in released, released
    pages = list((ours.parent / "exchange" / COURSE_ID / "feedback").glob("*.html"))
    assert len(pages) == 4
    broken = ours / "feedback" / "broken" / NAME
    assert "not graded" in (broken / f"{NAME}.html").read_text()
    # released under the secret `nbgrader submit` gave it: the learner can fetch it
    assert (broken / "submission_secret.txt").read_text() == "secret-of-broken"


@pipeline
def test_formgrader_lists_every_hand_in_as_stock_nbgrader_does(graded):
    stock, ours, _, grade_id = graded
    theirs, mine = _view(stock), _view(ours)
    assert set(mine) == set(theirs) == {"good", "broken", "deleted", "zed"}
    # the deleted test cell: stock leaves it unscored, grade-all grades it as put back
    restored = mine["deleted"][3].pop(grade_id)
    assert theirs["deleted"][3].pop(grade_id) == (None, None, True)
    assert restored == (dict(CHAPTER.test_cells())[grade_id], None, True)
    assert mine == theirs
    assert mine["broken"][2] and all(flag for *_, flag in mine["broken"][3].values())
    assert mine["zed"][1] == FULL / 2  # zero penalty: the raw score, taken away


@pipeline
def test_a_damaged_hand_in_has_one_csv_row(graded):
    _, ours, _, _ = graded
    with open(ours.parent / "class.csv", newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row["student_id"] == "broken"]
    assert len(rows) == 1, rows
    assert rows[0]["status"] == "not graded" and rows[0]["file"].endswith(f"{NAME}.ipynb")
    assert "corrupt notebook" in rows[0]["message"]


@pipeline
def test_a_late_hand_in_is_reported_with_its_penalty(graded):
    _, ours, zip_run, _ = graded
    entry = json.loads((ours.parent / "zip.json").read_text())[0]
    assert entry["learner"] == "zed" and entry["status"] == "graded"
    assert entry["score"] == 0.0 and entry["penalty"] == FULL / 2
    assert sum(test["points"] for test in entry["tests"]) == FULL / 2
    late = f"(late penalty {FULL / 2:g}, from {FULL / 2:g})"
    assert f"0/{FULL:g} {late}" in zip_run.stderr  # the progress line
    assert f"score: 0 / {FULL:g} {late}" in zip_run.stdout  # the report


@pipeline
def test_a_cell_past_its_limit_says_so(tmp_path):
    """A test cell whose answer loops forever: its hint names the limit, not the
    ``KeyboardInterrupt`` that stopped it."""
    notebook = synthetic.broken(CHAPTER, "", wrong_answer=True)
    answer = [c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("solution")][-1]
    answer.source = answer.source.replace("return 0", "while True:\n        pass")
    path = tmp_path / f"{NAME}.ipynb"
    nbformat.write(notebook, path)
    done = grade("grade", path, "--cell-timeout", "3", "--json", tmp_path / "r.json")
    result = json.loads((tmp_path / "r.json").read_text())
    failed = [t["message"] for t in result["tests"] if not t["passed"]]
    assert failed and all("ran past its 3 s limit" in m for m in failed), done.stdout
    assert result["penalty"] == 0


@pipeline
def test_nbgraders_own_error_is_shown_when_it_cannot_record(tmp_path):
    from autograder.host.recording import ClassCourse, NotRecorded

    made = grade("course-dir", tmp_path / "class", "--chapters", "1")
    assert made.returncode == 0, made.stderr
    course = ClassCourse(tmp_path / "class")
    try:
        course.register(NAME)
        damaged = tmp_path / "damaged.ipynb"
        damaged.write_bytes(b'{"cells": [')
        course.stage(damaged, "ada", NAME, ON_TIME)
        with pytest.raises(NotRecorded) as raised:
            course.record("ada", NAME, synthetic.solved(CHAPTER))
    finally:
        course.close()
    said = str(raised.value)
    assert "NotJSONError: Notebook does not appear to be JSON" in said, said
    assert "Traceback" not in said and "Please see" not in said


def test_the_timeout_hint_is_read_past_the_kernels_interrupt():
    outputs = [nbformat.v4.new_output("error", ename="KeyboardInterrupt", evalue="",
                                      traceback=[]),
               nbformat.v4.new_output("error", ename="CellTimeoutError", evalue="",
                                      traceback=[])]
    assert report.failure_message(outputs, 120) == \
        "this cell ran past its 120 s limit (look for an endless loop or a very slow call)"


def test_a_penalty_is_taken_from_the_score_and_said_beside_it():
    tests = [report.TestResult("a", 2.0, 2.0, True, ""),
             report.TestResult("b", 1.0, 2.0, False, "no")]
    result = report.NotebookResult("nb.ipynb", NAME, "cpu", tests, penalty=1.0)
    assert (result.raw_score, result.score) == (3.0, 2.0)
    assert result.to_json()["score"] == 2.0 and result.to_json()["penalty"] == 1.0
    assert report.NotebookResult.from_json(result.to_json()).penalty == 1.0
    assert "score: 2 / 4 (late penalty 1, from 3)" in report.format_report(result)
    on_time = report.NotebookResult("nb.ipynb", NAME, "cpu", tests)
    assert report.format_report(on_time).endswith("score: 3 / 4")
