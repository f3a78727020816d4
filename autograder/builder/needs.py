"""Which chapters' answers a chapter runs, computed from the code.

A chapter *needs* another when its notebook or its visible checks can reach one of that
chapter's answers: a learner edition that leaves the other chapter's answers out cannot run it.
Reach is read from the source, never by importing it, as a graph of the top-level names of
the library (``course/``, ``kernels/``) and of the checks (``autograder/checks/``): a name leads
to every top-level name its definition uses (through the module's imports, the imports in its
body, and ``module.name`` on an imported module), and to its own module's top-level
statements. A class is one name: reaching it reaches every method, its answers among them.

Roots: the names the chapter's exercise notebook uses and every name of its visible checks
module. The chapter's own answers are walked through too (a learner's answer is asked to do
what the course's does, with the same helpers). The result is closed: what a needed chapter
needs is needed.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from IPython.core.inputtransformer2 import TransformerManager

from autograder.builder.copies import owners
from autograder.host.chapters import EXERCISES, chapters
from autograder.table import PARTS

PACKAGES = ("course", "kernels", "autograder.checks")
MODULE = "<module>"  # a module's top-level statements, as one name

Name = tuple[str, str]  # (module, top-level name)


def _walked(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in PACKAGES)


@cache
def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@cache
def _tree(module: str) -> ast.Module | None:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    return ast.parse(Path(spec.origin).read_text(encoding="utf-8"))


def _package(module: str) -> str:
    spec = importlib.util.find_spec(module)
    is_package = spec is not None and spec.submodule_search_locations is not None
    return module if is_package else module.rpartition(".")[0]


def _imported(node: ast.Import | ast.ImportFrom, module: str) -> dict[str, Name | str]:
    """Each name an import binds -> a (module, name) it stands for, or a module's name."""
    bound: dict[str, Name | str] = {}
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.asname:
                bound[alias.asname] = alias.name
            else:  # ``import a.b`` binds ``a``; ``a.b.name`` is resolved where it is used
                bound[alias.name.partition(".")[0]] = alias.name.partition(".")[0]
        return bound
    source = node.module or ""
    if node.level:
        base = _package(module)
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        source = f"{base}.{source}" if source else base
    for alias in node.names:
        submodule = f"{source}.{alias.name}"
        bound[alias.asname or alias.name] = (submodule if _is_module(submodule)
                                             else (source, alias.name))
    return bound


def _top_level(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """(name, node) of each top-level definition and assignment; ``MODULE`` for the other
    statements that run on import (not an import, a docstring or a ``__main__`` block)."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node.name, node
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        yield name.id, node
        elif isinstance(node, ast.Import | ast.ImportFrom) or _is_docstring(node) \
                or _is_main_block(node):
            continue
        else:
            yield MODULE, node


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)


def _is_main_block(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)


def _attribute_chain(node: ast.Attribute) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _resolve(target: Name | str, rest: list[str]) -> Name | None:
    """The (module, name) that ``target`` (a module or a name) then ``.rest`` stands for."""
    if isinstance(target, tuple):
        return target
    module = target
    for part in rest:
        if _is_module(f"{module}.{part}"):
            module = f"{module}.{part}"
        else:
            return (module, part)
    return (module, MODULE)


def uses(nodes: list[ast.AST], module: str, scope: dict[str, Name | str],
         own: set[str]) -> set[Name]:
    """The names that ``nodes`` (code of ``module``, whose imports are ``scope`` and whose
    top-level names are ``own``) use."""
    local = dict(scope)
    for node in nodes:
        for inner in ast.walk(node):
            if isinstance(inner, ast.Import | ast.ImportFrom):
                local |= _imported(inner, module)
    found: set[Name] = set()
    for node in nodes:
        for inner in ast.walk(node):
            if isinstance(inner, ast.Attribute) and isinstance(inner.ctx, ast.Load):
                chain = _attribute_chain(inner)
                if chain and chain[0] in local and not isinstance(local[chain[0]], tuple):
                    resolved = _resolve(local[chain[0]], chain[1:])
                    if resolved:
                        found.add(resolved)
            elif isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Load):
                if inner.id in own:
                    found.add((module, inner.id))
                elif inner.id in local:
                    resolved = _resolve(local[inner.id], [])
                    if resolved:
                        found.add(resolved)
    return {name for name in found if _walked(name[0])}


@cache
def graph(module: str) -> dict[str, set[Name]]:
    """Each top-level name of ``module`` -> the names its definition uses."""
    tree = _tree(module)
    if tree is None:
        return {}
    scope: dict[str, Name | str] = {}
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            scope |= _imported(node, module)
    definitions: dict[str, list[ast.AST]] = {}
    for name, node in _top_level(tree):
        definitions.setdefault(name, []).append(node)
    own = set(definitions)
    return {name: uses(nodes, module, scope, own) | {(module, MODULE)}
            for name, nodes in definitions.items()}


def _edges(name: Name) -> set[Name]:
    module, top = name
    edges = graph(module).get(top)
    if edges is None and _is_module(f"{module}.{top}"):  # a submodule, reached as a name
        return {(f"{module}.{top}", MODULE)}
    return edges or set()


def walk(roots: set[Name]) -> dict[Name, Name | None]:
    """Every name the ``roots`` lead to, breadth first, each with the name it was reached
    from (``None`` for a root)."""
    parent: dict[Name, Name | None] = dict.fromkeys(roots)
    frontier = list(roots)
    while frontier:
        following = []
        for name in frontier:
            for edge in _edges(name):
                if edge not in parent:
                    parent[edge] = name
                    following.append(edge)
        frontier = following
    return parent


def notebook_roots(path: Path) -> set[Name]:
    """The names the code cells of the notebook at ``path`` use."""
    import nbformat

    transform = TransformerManager().transform_cell
    cells = []
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "code":
            try:
                cells.append(ast.parse(transform(cell.source)))
            except SyntaxError:  # a TODO stub that is not code yet
                continue
    scope: dict[str, Name | str] = {}
    for tree in cells:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                scope |= _imported(node, "__main__")
    return uses(cells, "__main__", scope, set())


def _answer_names() -> dict[Name, set[int]]:
    """(module, top-level name) holding an answer -> the chapters whose answers it holds."""
    found: dict[Name, set[int]] = {}
    for (module, qualname), chapter in owners().items():
        found.setdefault((module, qualname.partition(".")[0]), set()).add(chapter)
    return found


def _roots(number: int) -> set[Name]:
    """The names chapter ``number``'s exercise notebook uses, and every name of its visible
    checks."""
    parts = next(p for p in PARTS.values() if p.number == number)
    roots = notebook_roots(EXERCISES / chapters()[parts.slug].source.name)
    return roots | {(parts.checks, name) for name in graph(parts.checks)}


@cache
def direct_needs(number: int) -> frozenset[int]:
    """The chapters whose answers chapter ``number``'s notebook and visible checks reach."""
    answers = _answer_names()
    found = {c for name in walk(_roots(number)) for c in answers.get(name, ())}
    return frozenset(found - {number})


@cache
def needs(number: int) -> tuple[int, ...]:
    """The chapters whose answers chapter ``number`` runs, closed: their needs too."""
    found: set[int] = set()
    todo = list(direct_needs(number))
    while todo:
        other = todo.pop()
        if other not in found:
            found.add(other)
            todo += direct_needs(other)
    return tuple(sorted(found - {number}))


def why(number: int, other: int) -> list[Name]:
    """A shortest chain of names from chapter ``number``'s roots to one of ``other``'s
    answers: what to read when a need is a surprise."""
    parent = walk(_roots(number))
    answers = _answer_names()
    target = next((name for name in parent if other in answers.get(name, ())), None)
    chain = []
    while target is not None:
        chain.append(target)
        target = parent[target]
    return chain[::-1]
