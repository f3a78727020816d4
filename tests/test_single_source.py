"""Each reference implementation in the library is the code of its solution cell."""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap

import nbformat
import pytest
from conftest import CHAPTERS


def _solution_functions(notebook: nbformat.NotebookNode) -> dict[str, ast.FunctionDef]:
    """Functions of solution cells, and methods of classes in locked skeleton cells, by name.

    A later cell may redefine a function (a TODO built up in steps): the last one counts.
    """
    functions = {}
    for cell in notebook.cells:
        meta = cell.metadata.get("nbgrader", {})
        skeleton = meta.get("locked") and meta.get("grade_id", "").startswith("skeleton")
        if not (meta.get("solution") or skeleton):
            continue
        for node in ast.parse(cell.source).body:
            if isinstance(node, ast.FunctionDef):
                functions[node.name] = node
            elif isinstance(node, ast.ClassDef) and skeleton:
                functions.update({f.name: f for f in node.body if isinstance(f, ast.FunctionDef)})
    return functions


def _skeleton_classes(notebook: nbformat.NotebookNode) -> set[str]:
    return {node.name for cell in notebook.cells
            if cell.metadata.get("nbgrader", {}).get("grade_id", "").startswith("skeleton")
            for node in ast.parse(cell.source).body if isinstance(node, ast.ClassDef)}


def _normalised(node: ast.FunctionDef) -> str:
    """The AST, with the docstring's indentation normalised (a method's docstring is indented
    one level deeper in its class than the same function in a notebook cell)."""
    node = ast.parse(ast.unparse(node)).body[0]
    if ast.get_docstring(node, clean=False) is not None:
        node.body[0].value.value = inspect.cleandoc(node.body[0].value.value)
    return ast.dump(node)


def _library_function(module, name: str, classes: set[str]):
    """A top-level function of ``module``, or the method of that name of a class in it (of
    the notebook's skeleton class, when several classes define it)."""
    found = vars(module).get(name)
    found = getattr(found, "fn", found)  # a Triton kernel wraps its Python function
    if inspect.isfunction(found):
        return found
    owners = [c for c in vars(module).values()
              if inspect.isclass(c) and c.__module__ == module.__name__
              and inspect.isfunction(vars(c).get(name))
              and vars(c)[name].__code__.co_filename == module.__file__]  # not generated
    if len(owners) > 1:
        owners = [c for c in owners if c.__name__ in classes]
    assert len(owners) == 1, f"{module.__name__} has no single definition of {name}"
    return vars(owners[0])[name]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.name)
def test_library_reference_is_the_solution_code(chapter):
    notebook = nbformat.read(chapter.source, as_version=4)
    module_name = notebook.metadata["course"]["reference"]
    module = importlib.import_module(module_name)
    solved = _solution_functions(notebook)
    assert solved, f"{chapter.name} has no solution functions"
    for name, node in solved.items():
        source = inspect.getsource(_library_function(module, name, _skeleton_classes(notebook)))
        library = ast.parse(textwrap.dedent(source)).body[0]
        # comments (the BEGIN/END SOLUTION markers) are not in the AST; everything else must match
        assert _normalised(node) == _normalised(library), (
            f"{name} in {chapter.source.name} differs from {module_name}.{name}: "
            "edit one, then copy it to the other")
