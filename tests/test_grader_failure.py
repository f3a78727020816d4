"""The grader's own failure is never a learner's zero: where the grader cannot grade (a memory
limit its kernel cannot start under, a Jupyter kernel that is not there), ``grade`` and
``grade-all`` grade nothing, say why in one line, exit ``GRADER_FAILED``, and every earlier
grade stands. A learner's own cell that kills the kernel is still the learner's
(``test_bad_submissions.py``)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from conftest import CHAPTERS

from autograder.builder import synthetic
from autograder.host.chapters import GRADER_FAILED

pytestmark = pytest.mark.pipeline

FIRST = CHAPTERS[0]  # the cheapest chapter to grade
TINY = "0.3"  # GiB: the kernel cannot start under it


def _run(*args, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autograder", *map(str, args)], cwd=cwd,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=600)


def _broken_kernel(folder: Path) -> dict:
    """A Jupyter path whose ``python3`` kernel starts a program that is not there."""
    spec = folder / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": ["/nonexistent/bin/python", "-m", "ipykernel_launcher", "-f",
                 "{connection_file}"], "display_name": "Python 3", "language": "python"}))
    return {"JUPYTER_PATH": str(folder)}


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory) -> Path:
    """A class of two learners graded once, as it stood before the failing runs."""
    root = tmp_path_factory.mktemp("class")
    for learner, notebook in (("ada", synthetic.solved(FIRST)),
                              ("bob", synthetic.solved(FIRST, 0.5))):
        (root / "hand" / learner).mkdir(parents=True)
        nbformat.write(notebook, root / "hand" / learner / f"{FIRST.name}.ipynb")
    done = _run("grade-all", "hand", "--course-dir", "class", "--jobs", "2", cwd=root)
    assert done.returncode == 0, done.stderr
    return root


def _kept(root: Path) -> dict:
    """Everything a run could change of the class: the gradebook's bytes, the graded
    notebooks, feedback pages and state file, and grades.csv's nbgrader export rows."""
    course = root / "class"
    files = {str(p.relative_to(course)): p.read_bytes() for folder in ("autograded", "feedback")
             for p in sorted((course / folder).rglob("*")) if p.is_file()}
    with open(course / "grades.csv", newline="", encoding="utf-8") as handle:
        rows = [r for r in csv.DictReader(handle) if r["status"] != "not graded"]
    return {"gradebook": (course / "gradebook.db").read_bytes(), "files": files,
            "state": (course / "grading-state.json").read_text(),
            "scores": {(r["student_id"], r["score"]) for r in rows}}


@pytest.mark.parametrize("broken", ["memory", "kernel"])
def test_a_regrade_the_grader_cannot_do_keeps_every_earlier_grade(broken, graded_class,
                                                                  tmp_path):
    before = _kept(graded_class)
    assert before["scores"] == {("ada", "18.0"), ("bob", "9.0")}
    extra, env = (["--memory-limit", TINY], None) if broken == "memory" else \
        ([], _broken_kernel(tmp_path / "jupyter"))
    done = _run("grade-all", "hand", "--course-dir", "class", "--regrade", *extra,
                cwd=graded_class, env=env)
    assert done.returncode == GRADER_FAILED, done.stderr
    said = "raise --memory-limit" if broken == "memory" else "ipykernel install"
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and said in errors[0], done.stderr
    assert "0 / 18" not in done.stdout
    assert _kept(graded_class) == before
    with open(graded_class / "class" / "grades.csv", newline="", encoding="utf-8") as handle:
        refused = [r for r in csv.DictReader(handle) if r["status"] == "not graded"]
    assert sorted(r["student_id"] for r in refused) == ["ada", "bob"]
    assert all(said in r["message"] for r in refused)


def test_grading_a_solution_under_a_memory_limit_too_small_gives_no_zero(tmp_path):
    done = _run("grade", FIRST.source, "--memory-limit", TINY, cwd=tmp_path)
    assert done.returncode == GRADER_FAILED
    assert done.stdout == "" and "score" not in done.stderr
    assert done.stderr.count("\n") == 1 and "raise --memory-limit" in done.stderr


def test_grade_proves_a_chapter_by_a_notebook_it_graded_to_full_marks_else_by_its_source(
        tmp_path):
    """``grade`` shows grades only once proved: a solved notebook earning full marks is the
    proof for its chapter (the source is not graded again); an unsolved one is not, and the
    chapter's own source is graded for it."""
    solved, unsolved = tmp_path / "solved.ipynb", tmp_path / "unsolved.ipynb"
    nbformat.write(synthetic.solved(FIRST), solved)
    nbformat.write(synthetic.solved(FIRST, 0.0), unsolved)
    for notebook, by in ((solved, "a hand-in's full marks"), (unsolved, "its source")):
        cache = tmp_path / f"cache-{notebook.stem}"
        done = _run("grade", notebook, cwd=tmp_path, env={"KV_COURSE_CACHE": str(cache)})
        assert done.returncode == 0, done.stderr
        proofs = [json.loads(p.read_text()) for p in (cache / "proofs").glob("*.json")]
        assert [(p["chapter"], p["by"]) for p in proofs] == [(FIRST.name, by)]
