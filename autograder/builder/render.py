"""Each answer is written once, in the library; the instructor notebooks' cells come from it.

The library (``course/``, ``kernels/``) is the source: an answer is the body of a function or
method between nbgrader's own markers, ``### BEGIN SOLUTION`` and ``### END SOLUTION``. The
chapter table (``autograder.table``) says where each solution cell's code is written:

    "course.experiments.kv_sizing"                      the cell's functions are that module's
    "course.v0.block_manager:BlockManager"     the cell's functions are that class's methods

and which class a locked ``skeleton`` cell gives (the library class, less every method that
holds an answer). Rendering replaces each such definition in the cell with the library's text
(a method dedented to the top level); the rest of the cell (imports, ``BlockManager.allocate =
allocate``) is the notebook's own; the notebooks carry no pointer to the library. ``make
exercises`` renders, then nbgrader's ``generate_assignment`` turns the markers into stubs;
the learner edition turns the same markers in the library into stubs
(``autograder.builder.edition``).

Sources are read as text (``ast``), never imported: kernels must not be defined before
``course.setup()`` picks Triton's mode.
"""

from __future__ import annotations

import ast
import importlib
import textwrap
from dataclasses import dataclass

import nbformat

from autograder.answers import definition, find, holds_answer, span
from autograder.host.chapters import grade_id_of
from autograder.table import PARTS


@dataclass(frozen=True)
class Answer:
    """One library definition that holds an answer, and the notebook cell it renders into."""

    module: str  # "course.v0.block_manager"
    qualname: str  # "BlockManager.allocate" or "kv_bytes_per_token"
    grade_id: str  # the solution cell's grade id

    @property
    def name(self) -> str:
        return self.qualname.rsplit(".", 1)[-1]


def skeleton(module: str, class_name: str) -> str:
    """The class as the notebook gives it: every method that holds an answer removed."""
    lines, node = find(module, class_name)
    start, end = span(lines, node)
    kept = list(range(start, end))
    for method in node.body:
        if isinstance(method, ast.FunctionDef):
            first, last = span(lines, method)
            if holds_answer("\n".join(lines[first:last])):
                drop = set(range(first, last))
                if first > 0 and not lines[first - 1].strip():
                    drop.add(first - 1)  # and the blank line before it
                kept = [i for i in kept if i not in drop]
    return textwrap.dedent("\n".join(lines[i] for i in kept)).rstrip()


def _target(reference: str) -> tuple[str, str]:
    module, _, owner = reference.partition(":")
    return module, owner


def _sources(notebook: nbformat.NotebookNode) -> dict[str, dict[str, str]]:
    """Grade id -> {"from": ...} or {"skeleton": ...}, from the chapter table."""
    parts = PARTS[notebook.metadata["course"]["chapter"]]
    found = {grade_id: {"from": where} for grade_id, where in parts.answers.items()}
    if parts.skeleton:
        found["skeleton"] = {"skeleton": parts.skeleton}
    return found


def render_cell(source: str, where: dict[str, str]) -> str:
    """``source`` with each definition that ``where`` names replaced by the library's."""
    lines = source.splitlines()
    definitions = [node for node in ast.parse(source).body
                   if isinstance(node, ast.FunctionDef | ast.ClassDef)]
    if "skeleton" in where:
        module, owner = _target(where["skeleton"])
        replacement = {owner: skeleton(module, owner)}
    else:
        module, owner = _target(where["from"])
        prefix = f"{owner}." if owner else ""
        replacement = {node.name: definition(module, prefix + node.name) for node in definitions}
    edits = [(*span(lines, node), replacement[node.name])
             for node in definitions if node.name in replacement]
    for start, end, text in sorted(edits, reverse=True):
        lines[start:end] = text.splitlines()
    return "\n".join(lines)


def render(notebook: nbformat.NotebookNode) -> list[str]:
    """Render every cell of an instructor notebook from the library, in place; return the
    grade ids of the cells that changed."""
    sources = _sources(notebook)
    changed = []
    for cell in notebook.cells:
        where = sources.get(grade_id_of(cell))
        if cell.cell_type != "code" or where is None:
            continue
        rendered = render_cell(cell.source, where)
        if rendered != cell.source:
            cell.source = rendered
            changed.append(grade_id_of(cell))
    return changed


def answers(notebook: nbformat.NotebookNode) -> list[Answer]:
    """The library definitions whose answers an instructor notebook's cells render."""
    sources = _sources(notebook)
    found = []
    for cell in notebook.cells:
        where = sources.get(grade_id_of(cell), {}).get("from")
        if cell.cell_type != "code" or where is None:
            continue
        module, owner = _target(where)
        for node in ast.parse(cell.source).body:
            if isinstance(node, ast.FunctionDef):
                qualname = f"{owner}.{node.name}" if owner else node.name
                if holds_answer(definition(module, qualname)):
                    found.append(Answer(module, qualname, grade_id_of(cell)))
    return found


def subjects(notebook: nbformat.NotebookNode) -> dict[str, str]:
    """What each TODO's checks take when the course's own answer is checked, by grade id:
    ``module:function`` for a function, ``module:Class`` for a class built up in steps (a
    cell written in the notebook alone stands for the class its skeleton gives)."""
    parts = PARTS[notebook.metadata["course"]["chapter"]]
    found = {}
    for cell in notebook.cells:
        nbgrader = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type != "code" or not nbgrader.get("solution") or nbgrader.get("locked"):
            continue
        grade_id = nbgrader["grade_id"]
        where = parts.answers.get(grade_id)
        if where is None or ":" in where:
            found[grade_id] = where or parts.skeleton
            continue
        names = [n.name for n in ast.parse(cell.source).body if isinstance(n, ast.FunctionDef)]
        found[grade_id] = f"{where}:{grade_id if grade_id in names else names[-1]}"
    return found


def load(reference: str) -> object:
    """The object ``module:qualname`` names (imports the module)."""
    module, _, qualname = reference.partition(":")
    found = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found
