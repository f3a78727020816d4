"""The notebooks themselves: committed clean, exercises in sync, test cells tagged so that Run All
goes on past a failing test, and an unfilled exercise fails only in its test cells (each
solution, and every other chapter's exercise, runs top to bottom in tests/test_wheel.py, from
the built wheel)."""

from __future__ import annotations

import nbformat
import pytest
from conftest import CHAPTERS, LEARNED, REPO
from run_notebooks import errors, execute

from autograder.answers import written_answers
from autograder.builder.release import render_exercise
from autograder.builder.render import answers, render
from autograder.host.autograde import Grader
from autograder.host.chapters import EXERCISES

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
def test_exercises_are_generated_from_the_current_solutions():
    grader = Grader()  # nbgrader's release of each source, cached by nbgrader's version and the
    for chapter in CHAPTERS:  # source's text, as `make exercises` and the grader use it
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


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.name)
def test_a_demonstration_is_no_graded_or_answer_cell_and_defines_nothing_used_after_it(chapter):
    """Cells tagged ``demo`` are left out of graded runs (``autograde.without_demonstrations``):
    no test or answer may be one, or use a name only a demonstration defines."""
    import ast

    notebook = nbformat.read(chapter.source, as_version=4)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    demos = [c for c in code if "demo" in c.metadata.get("tags", [])]
    assert not [c for c in demos if c.metadata.get("nbgrader", {}).get("grade")
                or c.metadata.get("nbgrader", {}).get("solution")]

    def names(cell, kind):
        """The cell's global names of ``kind`` (Store or Load), not the locals of its
        functions and comprehensions."""
        found, todo = set(), list(ast.parse(cell.source).body)
        while todo:
            node = todo.pop()
            if isinstance(node, ast.Name) and isinstance(node.ctx, kind):
                found.add(node.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)) and kind is ast.Store:
                found |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found |= {node.name} if kind is ast.Store else set()
                todo += node.decorator_list
            elif not isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                                       ast.GeneratorExp)):
                todo += ast.iter_child_nodes(node)
        return found

    defined_elsewhere = set().union(*(names(c, ast.Store) for c in code if c not in demos))
    only_in_demos = set().union(set(), *(names(c, ast.Store) for c in demos)) - defined_elsewhere
    used = {(name, c.metadata.get("nbgrader", {}).get("grade_id") or index)
            for index, c in enumerate(code) if c not in demos
            for name in names(c, ast.Load) & only_in_demos}
    assert not used, f"cells use names only a demonstration defines: {sorted(used)}"


@pytest.mark.pipeline
@pytest.mark.parametrize("chapter", [LEARNED], ids=lambda c: c.name)
def test_unfilled_exercise_fails_only_in_its_test_cells(chapter, tmp_path):
    """In this checkout, where the course's answers are all present. The other chapters'
    exercises run the same checks in tests/test_wheel.py, from a class edition that reveals
    their answers; this one's answers are stubs there."""
    notebook = execute(REPO / "exercises" / chapter.source.name, tmp_path, timeout=300)
    failed = errors(notebook)
    assert failed, "an unfilled exercise should fail its tests"
    assert all(name.startswith("test_") for name in failed), failed
    notes = [o.get("text", "") for c in notebook.cells for o in c.get("outputs", [])
             if o.get("name") == "stdout"]
    assert any("the course's own version" in text for text in notes)
