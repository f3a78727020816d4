"""Grading a class: resuming, a platform's zip of uploads, nbgrader's own exchange, the same
grade every time, and the tamper guard on its own."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
from conftest import CHAPTERS

from autograder import guard, synthetic

pytestmark = pytest.mark.pipeline

FIRST = CHAPTERS[0]
SECOND = CHAPTERS[1]


def run(*args, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autograder", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=1200, env=env)


def scores(csv_path: Path) -> dict[tuple[str, str], float]:
    with open(csv_path, newline="") as handle:
        return {(r["student_id"], r["assignment"]): float(r["score"])
                for r in csv.DictReader(handle)}


def test_a_second_run_grades_nothing_new_and_a_changed_notebook_again(tmp_path):
    uploads = tmp_path / "uploads"
    for learner, fraction in (("ada", 1.0), ("bo", 0.5)):
        path = uploads / learner / f"{FIRST.name}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(synthetic.solved(FIRST, fraction), path)
    first = run("grade-all", uploads, "--jobs", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "(0 unchanged" in first.stdout and "2/2" in first.stderr  # progress bar
    again = run("grade-all", uploads, cwd=tmp_path)
    assert "(2 unchanged since the last run, not graded again)" in again.stdout
    assert "[" not in again.stderr  # nothing was graded, so no progress lines
    nbformat.write(synthetic.solved(FIRST), uploads / "bo" / f"{FIRST.name}.ipynb")
    third = run("grade-all", uploads, cwd=tmp_path)
    assert "(1 unchanged" in third.stdout and "bo" in third.stderr
    full = scores(tmp_path / "grades.csv")
    assert full[("ada", FIRST.name)] == full[("bo", FIRST.name)] > 0
    assert (tmp_path / "feedback" / "bo" / f"{FIRST.name}.html").exists()


def test_a_zip_of_uploads_from_a_learning_platform(tmp_path):
    archive = tmp_path / "uploads.zip"
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.writestr(f"cy_{FIRST.name}.ipynb", nbformat.writes(synthetic.solved(FIRST)))
        bundle.writestr(f"di_{SECOND.name}.ipynb",
                        nbformat.writes(synthetic.solved(SECOND, 0.0)))
    done = run("grade-all", archive, "--json", "r.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    got = scores(tmp_path / "grades.csv")
    assert got[("cy", FIRST.name)] > 0 and got[("di", SECOND.name)] == 0
    assert {Path(r["notebook"]).name for r in json.loads((tmp_path / "r.json").read_text())} \
        == {f"cy_{FIRST.name}.ipynb", f"di_{SECOND.name}.ipynb"}


def test_grading_the_same_notebook_ten_times_gives_the_same_result(tmp_path):
    notebook = synthetic.solved(SECOND, fraction=0.5)  # property-based checks, some failing
    paths = []
    for copy in range(10):
        path = tmp_path / f"copy{copy}" / f"{SECOND.name}.ipynb"
        path.parent.mkdir()
        nbformat.write(notebook, path)
        paths.append(path)
    done = run("grade", *paths, "--jobs", "2", "--json", "r.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "r.json").read_text())
    assert len(results) == 10
    assert all(r["tests"] == results[0]["tests"] for r in results)
    assert 0 < results[0]["score"] < results[0]["max_score"]


def test_nbgrader_exchange_submit_and_collect_then_grade_all(tmp_path):
    """A JupyterHub class: the instructor releases through nbgrader's exchange, a learner
    fetches and submits, the instructor collects; grade-all grades what was collected."""
    exchange, course, home = tmp_path / "exchange", tmp_path / "course", tmp_path / "learner"
    for folder in (exchange, course, home):
        folder.mkdir()
    exchange.chmod(0o777)
    config = (f"c = get_config()\nc.CourseDirectory.course_id = 'kvcourse'\n"
              f"c.Exchange.root = {str(exchange)!r}\n")
    (course / "nbgrader_config.py").write_text(
        config + f"c.CourseDirectory.root = {str(course)!r}\n")
    (home / "nbgrader_config.py").write_text(config)
    source = course / "source" / FIRST.name
    source.mkdir(parents=True)
    nbformat.write(nbformat.read(FIRST.source, as_version=4), source / f"{FIRST.name}.ipynb")
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent),
                                                 os.environ.get("PATH", "")]))

    def nbgrader(*args, cwd):
        done = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    nbgrader("generate_assignment", FIRST.name, cwd=course)
    nbgrader("release_assignment", FIRST.name, cwd=course)
    nbgrader("fetch_assignment", FIRST.name, cwd=home)
    fetched = home / FIRST.name / f"{FIRST.name}.ipynb"
    nbformat.write(synthetic.solved(FIRST), fetched)  # the learner's work
    nbgrader("submit", FIRST.name, cwd=home)
    nbgrader("collect", FIRST.name, cwd=course)
    done = run("grade-all", course / "submitted", "--db", "sqlite:///class.db", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    ((learner, chapter), score), = scores(tmp_path / "grades.csv").items()
    assert chapter == FIRST.name and score == sum(
        c.metadata["nbgrader"]["points"] for c in nbformat.read(FIRST.source, 4).cells
        if c.metadata.get("nbgrader", {}).get("grade"))


def test_the_guard_names_a_replaced_check_and_a_patched_library_function(monkeypatch):
    import torch

    from autograder.checks import ch01

    monkeypatch.setattr(guard, "_RECORD", None)
    guard.verify()  # not armed: a learner running the notebook, nothing to check
    guard.arm()
    guard.verify()
    monkeypatch.setattr(ch01, "check_kv_bytes_per_token", lambda fn: None)
    with pytest.raises(AssertionError, match="check_kv_bytes_per_token"):
        guard.verify()
    monkeypatch.undo()
    monkeypatch.setattr(guard, "_RECORD", None)
    guard.arm()
    monkeypatch.setattr(torch, "allclose", lambda *args, **kwargs: True)
    with pytest.raises(AssertionError, match="torch.allclose"):
        guard.verify()


@pytest.mark.parametrize(("line", "flagged"), [
    ("from autograder.checks import ch01", True), ("import builtins", True),
    ("sys.modules['x'] = y", True), ("open('../../gradebook.db', 'w')", True),
    ("total = sum(blocks)  # autograder would flag this only outside comments", False),
    ("def allocate(self, seq_id, num_tokens):", False),
])
def test_the_static_scan_flags_code_that_reaches_for_the_grader(line, flagged):
    assert (guard.suspicious_code(f"x = 1\n{line}\n") is not None) == flagged


def test_every_test_cell_verifies_the_guard_first():
    for chapter in CHAPTERS:
        for cell in nbformat.read(chapter.source, as_version=4).cells:
            if cell.metadata.get("nbgrader", {}).get("grade"):
                assert "verify()" in cell.source.split("check_", 1)[0], (
                    f"{chapter.name}: {cell.metadata['nbgrader']['grade_id']} must call "
                    "autograder.guard.verify() before its check")


@pytest.mark.parametrize(("jobs", "user_setting", "expected"), [
    (1, None, None), (2, None, str(max(1, (os.cpu_count() or 1) // 2))), (2, "3", "3")],
    ids=["one-job-keeps-the-default", "two-jobs-share-the-cores", "the-user-setting-wins"])
def test_notebooks_graded_side_by_side_share_the_cores(jobs, user_setting, expected, tmp_path,
                                                       monkeypatch):
    from autograder.cli import _limits_of, _parser
    from autograder.pipeline import _run

    if user_setting is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", user_setting)
    limits = _limits_of(_parser().parse_args(["grade-all", "x", "--jobs", str(jobs)]))
    printed = _run([sys.executable, "-c", "import os; print(os.environ.get('OMP_NUM_THREADS'))"],
                   tmp_path, 30, limits)
    assert printed.strip() == str(expected)
