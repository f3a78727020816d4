"""The static scan: a submission's own code that reaches for the grader, read on the grader's
host before any of it runs. A notebook it flags scores zero (``autograde``'s flag step);
``autograder.guard`` is the defence inside the kernel.

Only what the learner wrote is read: a line the same cell held as released, or as an earlier
release gave it (``release_history``), is the course's own.
"""

from __future__ import annotations

import re

import nbformat

_SUSPICIOUS = re.compile(
    r"\bautograder\b|\bnbgrader\b|\bbuiltins\b|__builtins__|sys\.modules|gradebook")


def suspicious_code(source: str) -> str | None:
    """The first line of ``source`` that reaches for the grader or rebinds builtins, if any."""
    for line in source.splitlines():
        code = line.split("#", 1)[0]
        if _SUSPICIOUS.search(code):
            return line.strip()
    return None


def flagged_line(notebook: nbformat.NotebookNode, released: nbformat.NotebookNode,
                 earlier: dict[str, set[str]] | None = None) -> str | None:
    """The first suspicious line the learner wrote: in a code cell they wrote or changed, a
    line that the same cell (by cell id) did not hold as released, nor in an ``earlier``
    release (cell id -> its lines, ``release_history``). Locked and graded cells are the
    released ones (``restore``) and are skipped; a line a release put in a cell (a
    demonstration's import of its fixtures, say) stays the course's own when the learner
    edits around it, and counts as theirs in any other cell."""
    as_released = {c.get("id"): {line.strip() for line in c.source.splitlines()}
                   for c in released.cells if c.cell_type == "code" and c.get("id")}
    earlier = earlier or {}
    for cell in notebook.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") != "code" or meta.get("locked") or meta.get("grade"):
            continue
        given = as_released.get(cell.get("id"), set()) | earlier.get(cell.get("id"), set())
        for line in cell.get("source", "").splitlines():
            if line.strip() not in given and suspicious_code(line):
                return line.strip()
    return None
