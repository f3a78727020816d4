"""The notebooks themselves: committed clean, exercises in sync, test cells tagged so that Run All
goes on past a failing test, and an unfilled exercise fails only in its test cells (each
solution runs top to bottom in tests/test_wheel.py, from the built wheel)."""

from __future__ import annotations

import nbformat
import pytest
from conftest import CHAPTERS, REPO
from run_notebooks import errors, execute

from autograder.autograde import Grader
from autograder.chapters import EXERCISES
from autograder.release import render_exercise
from autograder.render import answers, render, written_answers

NOTEBOOKS = [c.source for c in CHAPTERS] + [EXERCISES / c.source.name for c in CHAPTERS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    dirty = [i for i, c in enumerate(notebook.cells)
             if c.cell_type == "code" and (c.outputs or c.execution_count is not None)]
    assert not dirty, f"cells {dirty} of {path.name} carry outputs: clear them before committing"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.name)
def test_answer_cells_are_rendered_from_the_library(chapter):
    notebook = nbformat.read(chapter.source, as_version=4)
    stale = render(notebook)
    assert not stale, (f"{chapter.source.name}: cells {stale} differ from the library, where "
                       "answers are written: edit the library, then run `make exercises`")


def test_every_answer_in_the_library_belongs_to_a_notebook_cell():
    rendered = {(a.module, a.qualname) for chapter in CHAPTERS
                for a in answers(nbformat.read(chapter.source, as_version=4))}
    assert written_answers() == rendered


@pytest.mark.pipeline
def test_exercises_are_generated_from_the_current_solutions(tmp_path):
    grader = Grader(cache=tmp_path)  # released afresh, not from a cache
    for chapter in CHAPTERS:
        committed = (EXERCISES / f"{chapter.name}.ipynb").read_text(encoding="utf-8")
        assert render_exercise(grader, chapter) == committed, (
            f"exercises/{chapter.name}.ipynb is stale: run `make exercises` and commit it")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_test_cells_let_run_all_go_on_past_a_failing_test(path):
    """JupyterLab's Run All stops at an error unless the cell is tagged ``raises-exception``:
    with the tag, an unfinished TODO fails its own tests and the rest of the notebook (its
    explanations, charts and widgets) still runs."""
    notebook = nbformat.read(path, as_version=4)
    untagged = [c.metadata["nbgrader"]["grade_id"] for c in notebook.cells
                if c.metadata.get("nbgrader", {}).get("grade")
                and "raises-exception" not in c.metadata.get("tags", [])]
    assert not untagged, f"test cells without the raises-exception tag: {untagged}"


@pytest.mark.pipeline
@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.name)
def test_unfilled_exercise_fails_only_in_its_test_cells(chapter, tmp_path):
    notebook = execute(REPO / "exercises" / chapter.source.name, tmp_path, timeout=300)
    failed = errors(notebook)
    assert failed, "an unfilled exercise should fail its tests"
    assert all(name.startswith("test_") for name in failed), failed
    notes = [o.get("text", "") for c in notebook.cells for o in c.get("outputs", [])
             if o.get("name") == "stdout"]
    assert any("the course's own version" in text for text in notes)
