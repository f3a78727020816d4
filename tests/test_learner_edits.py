"""A learner may edit any cell the notebook gives them to try things in: the grade is decided
by what they wrote, and a line a release put there, this release or an earlier one, never
counts against them.

The static scan (``flagging.flagged_line``) runs on the notebook as rebuilt for grading,
against the released exercise and the lines earlier releases put in its cells
(``release_history``); here against the committed exercises, in both languages. One chapter
goes through the whole pipeline as an earlier release wrote its demonstration, edited; every
chapter's solution is graded with its given cells edited in tests/test_grading.py (English)
and tests/test_zh_grading.py (Chinese)."""

from __future__ import annotations

import json

import nbformat
import pytest
from conftest import CHAPTERS, grade, max_points
from notebook_variants import given_cells_edited

from autograder.host.chapters import EXERCISES
from autograder.host.flagging import flagged_line, suspicious_code
from autograder.host.release_history import given_cells, released_lines

ZH = "zh_CN"
CASES = [(chapter, language) for chapter in CHAPTERS for language in ("en", ZH)]


def _released(chapter, language: str) -> nbformat.NotebookNode:
    folder = EXERCISES / ZH if language == ZH else EXERCISES
    return nbformat.read(folder / f"{chapter.name}.ipynb", as_version=4)


def _edited(chapter, language: str, extra: str = "") -> nbformat.NotebookNode:
    """The chapter's solution with every given cell edited as a learner tries things."""
    return given_cells_edited(chapter.source_in(language) if language == ZH else chapter.source,
                              extra=extra)


@pytest.mark.parametrize(("chapter", "language"), CASES,
                         ids=[f"{c.name}-{language}" for c, language in CASES])
def test_editing_every_given_cell_never_flags_the_notebook(chapter, language):
    assert flagged_line(_edited(chapter, language), _released(chapter, language)) is None


@pytest.mark.parametrize(("chapter", "language"), CASES,
                         ids=[f"{c.name}-{language}" for c, language in CASES])
def test_no_given_cell_reaches_for_the_grader(chapter, language):
    """A demonstration's fixtures come from the library: nothing a learner is handed to change
    names the grader."""
    released = _released(chapter, language)
    assert given_cells(released)
    assert [suspicious_code(c.source) for c in given_cells(released)
            if suspicious_code(c.source)] == []


EARLIER = [(chapter, cell, line) for chapter in CHAPTERS
           for cell, lines in sorted(released_lines(chapter.name).items()) for line in lines]


@pytest.mark.parametrize(("chapter", "cell", "line"), EARLIER,
                         ids=[f"{c.name}-{cell}" for c, cell, _ in EARLIER])
def test_a_line_an_earlier_release_gave_is_spared_in_its_cell_alone(chapter, cell, line):
    """An earlier release's demonstration imported its fixtures from the checks: handed in
    from that release and edited, the cell (its id) is the course's; the same line in a cell
    of the learner's own is theirs."""
    notebook = _edited(chapter, "en")
    notebook.cells.append(nbformat.v4.new_code_cell(f"# tried\n{line}\nprint('tried')\n"))
    notebook.cells[-1].id = cell
    released = _released(chapter, "en")
    assert flagged_line(notebook, released, released_lines(chapter.name)) is None
    assert flagged_line(notebook, released) == line  # not vacuous: the history spares it
    notebook.cells[-1].id = "mine"
    assert flagged_line(notebook, released, released_lines(chapter.name)) == line


def test_every_release_in_the_history_is_kept():
    """The history only grows: the lines of the releases before the fixtures moved to the
    library are there, for every chapter whose demonstrations imported them."""
    assert {c.name for c in CHAPTERS if released_lines(c.name)} == {
        "06_paged_kv_in_pytorch", "07_triton_paged_attention", "09_chunked_prefill"}


@pytest.mark.parametrize("line", ["import builtins", "from autograder.checks import ch01",
                                  "open('gradebook.db', 'w')"])
def test_a_line_the_learner_wrote_in_a_given_cell_is_still_flagged(line):
    chapter = CHAPTERS[5]
    flagged = flagged_line(_edited(chapter, "en", extra=line), _released(chapter, "en"))
    assert flagged == line


@pytest.mark.pipeline
def test_an_earlier_releases_notebook_with_its_demonstrations_edited_keeps_full_marks(tmp_path):
    """Chapter 6's solution as the release before the fixtures moved to the library wrote its
    demonstration (importing them from the checks), every given cell edited: the edited
    demonstration runs in the grading kernel, its import resolves, and nothing is flagged."""
    chapter = CHAPTERS[5]
    notebook = _edited(chapter, "en")
    (cell,) = [c for c in notebook.cells if c.get("id") == "c25"]
    assert "from course.notebook.paged_cases import PagedCase" in cell.source
    cell.source = cell.source.replace("from course.notebook.paged_cases import PagedCase",
                                      "from autograder.checks.ch06 import PagedCase")
    path = tmp_path / f"{chapter.name}.ipynb"
    nbformat.write(notebook, path)
    done = grade("grade", path, "--json", "r.json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["score"] == max_points(chapter), result


def test_a_released_line_copied_into_a_cell_of_the_learners_own_is_theirs():
    """The line an earlier demonstration imported its fixtures with is the course's in its
    own cell; copied into a new cell, or a test cell's import written in an answer, it is the
    learner's, and flagged."""
    for chapter, line in ((CHAPTERS[5], "from autograder.checks.ch06 import PagedCase"),
                          (CHAPTERS[0], "from autograder.checks import ch01")):
        notebook = _edited(chapter, "en")
        notebook.cells.append(nbformat.v4.new_code_cell(f"{line}\nprint('mine')\n"))
        assert flagged_line(notebook, _released(chapter, "en"),
                            released_lines(chapter.name)) == line
