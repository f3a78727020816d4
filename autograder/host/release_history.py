"""The lines earlier releases of the course put in the cells a learner is given to change.

A learner may hand in a notebook from an earlier release of a chapter. Its given cells (a
demonstration, a set-up cell) read as that release wrote them, and a line there that reaches
for the grader (an earlier demonstration imported its fixtures from the checks) is the
course's, not the learner's: the static scan (``flagging.flagged_line``) spares it in the
cell it was released in, as it spares the current release's lines.

``release_history.json`` keeps, for each chapter and cell id, every such line any release
held; ``python -m autograder release`` adds the current release's and never removes one.

    {"06_paged_kv_in_pytorch": {"c25": ["from autograder.checks.ch06 import PagedCase"]}}
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat

from autograder.host.flagging import suspicious_code

HISTORY = Path(__file__).with_name("release_history.json")


def given_cells(notebook: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    """The code cells a learner is handed to run and change: not a test, not locked, not an
    answer."""
    return [c for c in notebook.cells if c.cell_type == "code" and not any(
        c.metadata.get("nbgrader", {}).get(key) for key in ("grade", "locked", "solution"))]


def released_lines(chapter: str) -> dict[str, set[str]]:
    """Cell id -> the lines any release of ``chapter`` put in that given cell that the static
    scan would flag."""
    history = json.loads(HISTORY.read_text(encoding="utf-8")) if HISTORY.exists() else {}
    return {cell: set(lines) for cell, lines in history.get(chapter, {}).items()}


def remember(releases: dict[str, nbformat.NotebookNode]) -> bool:
    """Add the flagged lines of each released notebook's given cells (chapter -> notebook) to
    the history; return whether it changed."""
    history = json.loads(HISTORY.read_text(encoding="utf-8")) if HISTORY.exists() else {}
    before = json.dumps(history, sort_keys=True)
    for chapter, notebook in releases.items():
        cells = history.setdefault(chapter, {})
        for cell in given_cells(notebook):
            lines = [line.strip() for line in cell.source.splitlines()
                     if suspicious_code(line)]
            if lines and cell.get("id"):
                cells[cell.id] = sorted(set(cells.get(cell.id, [])) | set(lines))
        if not cells:
            del history[chapter]
    if json.dumps(history, sort_keys=True) == before:
        return False
    HISTORY.write_text(json.dumps(history, sort_keys=True, indent=1, ensure_ascii=False) + "\n",
                       encoding="utf-8")
    return True
