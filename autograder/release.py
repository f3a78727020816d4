"""Regenerates the instructor notebooks' answer cells from the library, then the learner
notebooks in ``exercises/`` from ``solutions/`` through nbgrader.

``autograder.render`` writes each answer and skeleton cell of ``solutions/`` from the library,
where answers are written. `nbgrader generate_assignment` replaces each solution with a stub,
strips the hidden tests and records checksums; the result is copied to
``exercises/NN_slug.ipynb`` with outputs cleared.
"""

from __future__ import annotations

from pathlib import Path

import nbformat

from autograder.autograde import Grader
from autograder.chapters import EXERCISES, Chapter, chapters
from autograder.render import render


def clear_outputs(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Drop outputs, execution counts and execution timings from every code cell."""
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
            cell.metadata.pop("execution", None)
    return notebook


def render_exercise(grader: Grader, chapter: Chapter) -> str:
    """The learner notebook for ``chapter``, as the text ``exercises/`` should hold."""
    notebook = clear_outputs(grader.released(chapter.name,
                                             chapter.source.read_text(encoding="utf-8")))
    return nbformat.writes(notebook) + "\n"


def render_solutions() -> list[Path]:
    """Render every instructor notebook's answer cells from the library; return those that
    changed."""
    changed = []
    for chapter in chapters().values():
        notebook = nbformat.read(chapter.source, as_version=4)
        if render(notebook):
            nbformat.write(notebook, chapter.source)
            changed.append(chapter.source)
    return changed


def release_all(destination: Path = EXERCISES) -> list[Path]:
    """Render the instructor notebooks, then write every chapter's learner notebook into
    ``destination``; return the paths written."""
    destination.mkdir(parents=True, exist_ok=True)
    written = render_solutions()
    grader = Grader()
    for chapter in chapters().values():
        path = destination / f"{chapter.name}.ipynb"
        path.write_text(render_exercise(grader, chapter), encoding="utf-8")
        written.append(path)
    return written
