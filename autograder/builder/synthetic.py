"""Learner notebooks made from the released exercises, for the grader's tests and benchmark:
solved with the course's solutions, partly solved, or broken in a named way."""

from __future__ import annotations

import re

import nbformat

from autograder.host.chapters import EXERCISES, Chapter, grade_id_of

BREAKAGES = {
    "endless-loop": "while True:\n    pass\n",
    "syntax-error": "def broken(:\n",
    "crash": "import os\nos._exit(1)\n",
}


def _solution_cells(notebook: nbformat.NotebookNode) -> list:
    return [c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("solution")]


def solved(chapter: Chapter, fraction: float = 1.0) -> nbformat.NotebookNode:
    """The released exercise with the first ``fraction`` of its solution cells as the course's
    solution wrote them (the rest left as stubs)."""
    answers = {grade_id_of(c): c.source
               for c in _solution_cells(nbformat.read(chapter.source, as_version=4))}
    notebook = nbformat.read(EXERCISES / f"{chapter.name}.ipynb", as_version=4)
    cells = _solution_cells(notebook)
    for cell in cells[:round(fraction * len(cells))]:
        cell.source = answers[grade_id_of(cell)]
    return notebook


def broken(chapter: Chapter, code: str, wrong_answer: bool = False) -> nbformat.NotebookNode:
    """Solved, except the last TODO's cell, replaced by ``code`` (after a wrong definition of
    its function, with ``wrong_answer``). In chapters whose TODOs are functions, no other
    TODO uses the last one, so exactly its tests fail."""
    notebook = solved(chapter)
    cell = _solution_cells(notebook)[-1]
    if wrong_answer:
        name = re.search(r"^def (\w+)\(", cell.source, re.M).group(1)
        code = f"def {name}(*args, **kwargs):\n    return 0\n\n" + code
    cell.source = code
    return notebook
