"""Rebuilding a submission around its chapter's own cells before it is graded.

A learner's notebook is theirs to edit, except for the cells that grade it. Whatever happened
to those (edited, emptied, deleted, moved, duplicated, unlocked, marked ungraded, renamed, new
ids), the notebook that is graded is the released one, cell for cell, with the learner's own
cells put back where they wrote them:

    released:  [setup] [md] [answer a] [test a] [test a hidden] [md] [answer b] [test b] ...
    learner:   [setup'] [md] [answer a'] [helper] [test b'] [answer b'] [test a'] [scratch]
    graded:    [setup]  [md] [answer a'] [helper] [test a] [test a hidden] [answer b']
               [test b] [scratch] ...

The *anchors* are the released cells nbgrader knows by grade id: answer cells (the learner's
source is kept), and locked or graded cells (restored as released, in released order). A
learner's cell is matched to an anchor by its grade id, else by its cell id, else (an answer
cell whose metadata and id were both lost) by the function or class it defines. Every other
cell of the learner's is kept, after the anchor that precedes it in their notebook. An answer
cell nothing matches keeps its released stub, so only that TODO is lost; a notebook in which
no answer cell can be matched at all is not graded (``Unmatched``).
"""

from __future__ import annotations

import ast
import copy
import threading
from collections import defaultdict
from dataclasses import dataclass, field

import nbformat

NotebookNode = nbformat.NotebookNode


class Unmatched(Exception):
    """No answer cell of the submission could be matched to the chapter's."""


@dataclass
class Rebuilt:
    notebook: NotebookNode
    restored: list[str] = field(default_factory=list)  # grade ids put back as released
    unanswered: list[str] = field(default_factory=list)  # answer cells left as stubs


def _nbgrader(cell: NotebookNode) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def _is_anchor(cell: NotebookNode) -> bool:
    meta = _nbgrader(cell)
    return bool(meta.get("grade_id")) and bool(
        meta.get("solution") or meta.get("locked") or meta.get("grade"))


def _is_answer(cell: NotebookNode) -> bool:
    meta = _nbgrader(cell)
    return bool(meta.get("solution")) and not meta.get("locked")


# CPython 3.11 counts the depth of the syntax tree it is building per interpreter, not per
# thread: two threads parsing at once (a class graded with --jobs 2) can fail with
# "SystemError: AST constructor recursion depth mismatch" (CPython issue gh-106905). One
# parse at a time.
_PARSING = threading.Lock()


def defines(source: str) -> set[str]:
    try:
        with _PARSING:
            body = ast.parse(source).body
    # not Python (a null byte is a ValueError), or past the parser's depth or memory: no names
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    return {node.name for node in body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}


def rebuild(submitted: NotebookNode, released: NotebookNode) -> Rebuilt:
    """The notebook to grade: ``released``'s anchors with ``submitted``'s own cells."""
    anchors = [c for c in released.cells if _is_anchor(c)]
    by_grade_id = {_nbgrader(c)["grade_id"]: i for i, c in enumerate(anchors)}
    by_cell_id = {c.get("id"): i for i, c in enumerate(anchors) if c.get("id")}
    stub_names = {i: defines(c.source) for i, c in enumerate(anchors) if _is_answer(c)}

    answers: dict[int, NotebookNode] = {}
    seen: set[int] = set()
    after: dict[int, list[NotebookNode]] = defaultdict(list)  # learner cells after an anchor
    current = 0  # before any match, learner cells go after the first anchor (setup)
    for cell in submitted.cells:
        index = by_grade_id.get(_nbgrader(cell).get("grade_id"))
        if index is None:
            index = by_cell_id.get(cell.get("id"))
        if index is None and cell.get("cell_type") == "code" and not _nbgrader(cell):
            names = defines(cell.get("source", ""))
            index = next((i for i, stub in stub_names.items()
                          if i not in answers and names and stub and names >= stub), None)
        if index is not None and index not in seen:
            seen.add(index)
            if _is_answer(anchors[index]):
                answers[index] = cell
            current = index
            continue
        if index is not None and not _is_answer(anchors[index]):
            continue  # a second copy of a locked or graded cell: the released one counts
        kept = copy.deepcopy(cell)
        kept.get("metadata", {}).pop("nbgrader", None)  # a copy of an answer is plain code
        after[current].append(kept)

    if stub_names and not answers:
        raise Unmatched("none of its answer cells could be matched to the chapter's (their "
                        "nbgrader metadata and cell ids are gone, and no cell defines what a "
                        "TODO asks for); start from the released notebook and copy your code "
                        "into its cells")

    result = Rebuilt(copy.deepcopy(released))
    cells = []
    for index, anchor in enumerate(anchors):
        cell = copy.deepcopy(anchor)
        grade_id = _nbgrader(anchor)["grade_id"]
        if index in answers:
            cell.source = answers[index].get("source", "")
        elif _is_answer(anchor):
            result.unanswered.append(grade_id)
        elif index not in seen:
            result.restored.append(grade_id)
        cells.append(cell)
        cells += after[index]
    # released cells that are not anchors (prose, given demos) come with the learner's cells;
    # the learner may have edited or removed them, as they may any cell of their own
    result.notebook.cells = _unique_ids(cells)
    for cell in result.notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    return result


def mark_restored(notebook: NotebookNode, grade_ids: tuple[str, ...]) -> None:
    """Mark the cells of ``grade_ids`` in the graded ``notebook`` as put back for a cell the
    learner deleted: nbgrader flags a test cell missing from a submission for manual grading,
    and the gradebook does so for these too (``recording.FlagRestored``)."""
    for cell in notebook.cells:
        if _nbgrader(cell).get("grade_id") in grade_ids:
            cell.metadata.setdefault("course", {})[_RESTORED] = True


def was_restored(cell: NotebookNode) -> bool:
    """Whether ``mark_restored`` marked ``cell``."""
    return bool(cell.get("metadata", {}).get("course", {}).get(_RESTORED))


_RESTORED = "restored"  # the mark, under the cell's ``course`` metadata


def _unique_ids(cells: list[NotebookNode]) -> list[NotebookNode]:
    """Give every cell an id no earlier cell has (anchors keep theirs: they come first)."""
    taken = {c.get("id") for c in cells if _is_anchor(c)}
    for number, cell in enumerate(cells):
        if _is_anchor(cell):
            continue
        if not cell.get("id") or cell["id"] in taken:
            cell["id"] = f"learner-{number}"
        taken.add(cell["id"])
    return cells
