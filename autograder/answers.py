"""Where the library's answers are: definitions read as text, never imported.

An answer is the body of a library function or method (``course/``, ``kernels/``) between
nbgrader's own markers, ``### BEGIN SOLUTION`` and ``### END SOLUTION``; the chapter table
(``autograder.table``) says which module or class each chapter's answers are in. The grading
kernel reads them to make each answer a tripwire (``autograder.arming``); the build renders
the notebooks' cells from them (``autograder.builder.render``) and stubs them in a learner
edition (``autograder.builder.edition``).

Sources are read as text (``ast``), never imported: kernels must not be defined before
``course.setup()`` picks Triton's mode.
"""

from __future__ import annotations

import ast
import importlib.util
import textwrap
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from autograder.table import PARTS

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
LIBRARY = ("course", "kernels")


@cache
def module_file(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise LookupError(f"no module {module}")
    return Path(spec.origin)


def source_tree(module: str) -> tuple[list[str], ast.Module]:
    text = module_file(module).read_text(encoding="utf-8")
    return text.splitlines(), ast.parse(text)


def span(lines: list[str], node: ast.stmt) -> tuple[int, int]:
    """0-based [start, end) of a definition's lines: its decorators, and the comment lines
    (an ``### END SOLUTION``) that close its body after the last statement."""
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
    end = node.end_lineno
    indent = len(lines[node.lineno - 1]) - len(lines[node.lineno - 1].lstrip())
    while end < len(lines) and lines[end].strip().startswith("#") and \
            len(lines[end]) - len(lines[end].lstrip()) > indent:
        end += 1
    return start, end


def find(module: str, qualname: str) -> tuple[list[str], ast.stmt]:
    lines, node = source_tree(module)
    for part in qualname.split("."):
        node = next((n for n in node.body if isinstance(n, ast.FunctionDef | ast.ClassDef)
                     and n.name == part), None)
        if node is None:
            raise LookupError(f"{module} defines no {qualname}")
    return lines, node


def definition(module: str, qualname: str) -> str:
    """The library's text of ``module.qualname``, dedented to the top level."""
    lines, node = find(module, qualname)
    start, end = span(lines, node)
    return textwrap.dedent("\n".join(lines[start:end]))


def holds_answer(text: str) -> bool:
    return BEGIN in text


def library_modules() -> list[str]:
    """Every module of the library packages, by name."""
    found = []
    for package in LIBRARY:
        folder = module_file(package).parent
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":  # a subpackage's own code (course.notebook) counts
                parts = parts[:-1]
            if parts:
                found.append(".".join((package, *parts)))
    return found


def written_answers() -> set[tuple[str, str]]:
    """(module, qualname) of every library definition that holds an answer region."""
    return {(module, qualname) for module in library_modules()
            for qualname in answers_in(module)}


def answers_in(module: str) -> list[str]:
    """The qualname of every definition of ``module`` that holds an answer region."""
    lines, tree = source_tree(module)
    return [qualname for qualname, node in functions(tree)
            if holds_answer("\n".join(lines[slice(*span(lines, node))]))]


def functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef]]:
    """(qualname, node) of each function a module defines at its top level or in a class
    there: where an answer can be."""
    for node in tree.body:
        members = node.body if isinstance(node, ast.ClassDef) else [node]
        prefix = f"{node.name}." if isinstance(node, ast.ClassDef) else ""
        yield from ((prefix + m.name, m) for m in members if isinstance(m, ast.FunctionDef))


def chapter_answers(slug: str) -> list[tuple[str, str]]:
    """(module, qualname) of every answer the chapter's TODOs ask for, read from the library
    and the chapter table alone (no notebook)."""
    places = set(PARTS[slug].answers.values())
    # only the modules the table names are read: every grading kernel asks this as it starts
    # (the whole library takes a tenth of a second to parse)
    found = []
    for module in {place.partition(":")[0] for place in places}:
        for qualname in answers_in(module):
            owner = qualname.rpartition(".")[0]
            if (f"{module}:{owner}" if owner else module) in places:
                found.append((module, qualname))
    return sorted(found)
