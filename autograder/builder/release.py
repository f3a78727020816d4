"""Regenerates the instructor notebooks' answer cells from the library, then the learner
notebooks in ``exercises/`` from ``solutions/`` through nbgrader.

``autograder.builder.render`` writes each answer and skeleton cell of ``solutions/`` from the
library, where answers are written. `nbgrader generate_assignment` replaces each solution with
a stub, strips the hidden tests and records checksums; the result is copied to
``exercises/NN_slug.ipynb`` with outputs cleared. Each translation
(``autograder.builder.translation``) is written from the rendered English notebook and its
catalogue into ``solutions/<language>/``, and released the same way into
``exercises/<language>/``. The lines each release puts in a learner's given cells that reach
for the grader are added to ``autograder/host/release_history.json``, so a notebook of this
release stays gradable later.
"""

from __future__ import annotations

from pathlib import Path

import nbformat

from autograder.builder.render import render
from autograder.builder.translation import TRANSLATED, build, notebook_catalogue
from autograder.host.autograde import Grader
from autograder.host.chapters import EXERCISES, Chapter, chapters
from autograder.host.release_history import HISTORY, remember


def clear_outputs(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Drop outputs, execution counts and execution timings from every code cell."""
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
            cell.metadata.pop("execution", None)
    return notebook


def render_exercise(grader: Grader, chapter: Chapter, language: str | None = None) -> str:
    """The learner notebook for ``chapter`` (in ``language``, else English), as the text
    ``exercises/`` should hold."""
    source = chapter.source_in(language).read_text(encoding="utf-8")
    notebook = clear_outputs(grader.released(chapter.name, source))
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


def translate_solutions() -> list[Path]:
    """Write every instructor notebook in each translated language
    (``solutions/<language>/NN_slug.ipynb``, from its catalogue); return the paths written."""
    written = []
    for language in TRANSLATED:
        for chapter in chapters().values():
            notebook = build(chapter.source, notebook_catalogue(chapter, language), language)
            path = chapter.source_in(language)
            path.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(clear_outputs(notebook), path)
            written.append(path)
    return written


def release_all(destination: Path = EXERCISES) -> list[Path]:
    """Render the instructor notebooks and translate them, then write every chapter's learner
    notebook, in every language, into ``destination`` (a translation in its language's
    folder); return the paths written."""
    written = render_solutions() + translate_solutions()
    grader = Grader()
    for language in (None, *TRANSLATED):
        folder = destination / (language or "")
        folder.mkdir(parents=True, exist_ok=True)
        released = {}
        for chapter in chapters().values():
            path = folder / f"{chapter.name}.ipynb"
            path.write_text(render_exercise(grader, chapter, language), encoding="utf-8")
            released[chapter.name] = nbformat.read(path, as_version=4)
            written.append(path)
        if remember(released):
            written.append(HISTORY)
    return written
