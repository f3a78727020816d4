"""The house's layers: the library (course/) and the kernels (kernels/) know nothing of the
grader, and the kernels stand alone. Drawn from every import in their source, however deep."""

from __future__ import annotations

import ast

import pytest
from conftest import REPO

LAYERS = {"course": {"autograder"}, "kernels": {"autograder", "course"}}


def _imports(path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", LAYERS)
def test_a_lower_layer_imports_nothing_above_it(package):
    crossing = {str(path.relative_to(REPO)): sorted(_imports(path) & LAYERS[package])
                for path in sorted((REPO / package).rglob("*.py"))}
    assert {k: v for k, v in crossing.items() if v} == {}
