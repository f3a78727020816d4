"""Regenerates the learner notebooks in ``exercises/`` from ``solutions/`` through nbgrader.

`nbgrader generate_assignment` replaces each solution with a stub, strips the hidden tests and
records checksums; the result is copied to ``exercises/NN_slug.ipynb`` with outputs cleared.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import nbformat

from autograder.chapters import EXERCISES, Chapter, chapters
from autograder.pipeline import Grader


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
    released = grader.released(chapter)
    notebook = clear_outputs(nbformat.read(released, as_version=4))
    return nbformat.writes(notebook) + "\n"


def release_all(destination: Path = EXERCISES) -> list[Path]:
    """Write every chapter's learner notebook into ``destination``; return the paths."""
    destination.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory(prefix="kv-course-release-") as workdir:
        grader = Grader(Path(workdir))
        for chapter in chapters().values():
            path = destination / f"{chapter.name}.ipynb"
            path.write_text(render_exercise(grader, chapter), encoding="utf-8")
            written.append(path)
    return written
