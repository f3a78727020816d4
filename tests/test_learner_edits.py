"""A learner may edit any cell the notebook gives them to try things in: the grade is decided
by what they wrote, and a line the release put there never counts against them.

The static scan (``autograde.flagged_line``) runs on the notebook as rebuilt for grading,
against the released exercise; here against the committed exercises, in both languages. One
chapter goes through the whole pipeline with its demonstration edited."""

from __future__ import annotations

import json

import nbformat
import pytest
from conftest import CHAPTERS, grade, max_points

from autograder.autograde import flagged_line
from autograder.chapters import EXERCISES
from autograder.guard import suspicious_code

ZH = "zh_CN"
CASES = [(chapter, language) for chapter in CHAPTERS for language in ("en", ZH)]


def _released(chapter, language: str) -> nbformat.NotebookNode:
    folder = EXERCISES / ZH if language == ZH else EXERCISES
    return nbformat.read(folder / f"{chapter.name}.ipynb", as_version=4)


def _given_cells(notebook: nbformat.NotebookNode) -> list:
    """The code cells a learner is handed to run and change: not a test, not locked, not an
    answer."""
    return [c for c in notebook.cells if c.cell_type == "code" and not any(
        c.metadata.get("nbgrader", {}).get(key) for key in ("grade", "locked", "solution"))]


def _edited(chapter, language: str, extra: str = "") -> nbformat.NotebookNode:
    """The chapter's solution with every given cell edited as a learner tries things: a
    comment and a changed line."""
    notebook = nbformat.read(chapter.source_in(language) if language == ZH else chapter.source,
                             as_version=4)
    for cell in _given_cells(notebook):
        cell.source = f"# trying other sizes here\n{cell.source}\nprint('tried')\n{extra}"
    return notebook


@pytest.mark.parametrize(("chapter", "language"), CASES,
                         ids=[f"{c.name}-{language}" for c, language in CASES])
def test_editing_every_given_cell_never_flags_the_notebook(chapter, language):
    assert flagged_line(_edited(chapter, language), _released(chapter, language)) is None


def test_the_released_lines_that_reach_for_the_grader_are_what_the_rule_now_spares():
    """Not vacuous: some chapters' given cells hold such a line (a demonstration importing
    its fixtures), which a rule on whole cells would flag once the cell is edited."""
    spared = [chapter.name for chapter in CHAPTERS
              if any(suspicious_code(c.source) for c in _given_cells(_edited(chapter, "en")))]
    assert spared, "no given cell imports from the grader: this test has nothing to check"


@pytest.mark.parametrize("line", ["import builtins", "from autograder.checks import ch01",
                                  "open('gradebook.db', 'w')"])
def test_a_line_the_learner_wrote_in_a_given_cell_is_still_flagged(line):
    chapter = CHAPTERS[5]
    flagged = flagged_line(_edited(chapter, "en", extra=line), _released(chapter, "en"))
    assert flagged == line


@pytest.mark.pipeline
def test_a_solution_with_its_demonstrations_edited_keeps_full_marks(tmp_path):
    chapter = CHAPTERS[5]  # its demonstration imports its fixtures from the grader
    path = tmp_path / f"{chapter.name}.ipynb"
    nbformat.write(_edited(chapter, "en"), path)
    done = grade("grade", path, "--json", "r.json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["score"] == max_points(chapter), result


def test_a_released_line_copied_into_a_cell_of_the_learners_own_is_theirs():
    """The line a demonstration imports its fixtures with is the course's in its own cell;
    copied into a new cell, or a test cell's import written in an answer, it is the
    learner's, and flagged."""
    for chapter, line in ((CHAPTERS[5], "from autograder.checks.ch06 import PagedCase"),
                          (CHAPTERS[0], "from autograder.checks import ch01")):
        notebook = _edited(chapter, "en")
        notebook.cells.append(nbformat.v4.new_code_cell(f"{line}\nprint('mine')\n"))
        assert flagged_line(notebook, _released(chapter, "en")) == line
