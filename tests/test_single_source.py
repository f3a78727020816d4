"""Each reference implementation in the library is the code of its solution cell."""

from __future__ import annotations

import ast
import importlib
import inspect

import nbformat
import pytest
from conftest import CHAPTERS


def _solution_functions(notebook: nbformat.NotebookNode) -> dict[str, ast.FunctionDef]:
    functions = {}
    for cell in notebook.cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            for node in ast.parse(cell.source).body:
                if isinstance(node, ast.FunctionDef):
                    functions[node.name] = node
    return functions


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.name)
def test_library_reference_is_the_solution_code(chapter):
    notebook = nbformat.read(chapter.source, as_version=4)
    module_name = notebook.metadata["course"]["reference"]
    module = importlib.import_module(module_name)
    solved = _solution_functions(notebook)
    assert solved, f"{chapter.name} has no solution functions"
    for name, node in solved.items():
        library = ast.parse(inspect.getsource(getattr(module, name))).body[0]
        # comments (the BEGIN/END SOLUTION markers) are not in the AST; everything else must match
        assert ast.dump(node) == ast.dump(library), (
            f"{name} in {chapter.source.name} differs from {module_name}.{name}: "
            "edit one, then copy it to the other")
