"""Learner notebooks made from a released exercise: filled-in solutions, right or wrong.

A learner writes their function into the solution cell; here the stub stays where it is and
the new definition follows it in the same cell, the way a learner's redefinition would win.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Callable
from pathlib import Path

import nbformat

PREAMBLE = "import math\nimport sys\nimport warnings\nfrom fractions import Fraction\n\n"


def source_named(fn: Callable, name: str) -> str:
    """``fn``'s source, with its ``def`` renamed to ``name``."""
    source = textwrap.dedent(inspect.getsource(getattr(fn, "fn", fn)))  # a kernel: its function
    return re.sub(r"^def \w+\(", f"def {name}(", source, count=1, flags=re.M)


def fill(exercise: Path, destination: Path, solutions: dict[str, str]) -> Path:
    """Write ``exercise`` with ``solutions[grade_id]`` appended to each named solution cell."""
    notebook = nbformat.read(exercise, as_version=4)
    missing = set(solutions)
    for cell in notebook.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in solutions:
            cell.source += "\n\n" + PREAMBLE + solutions[grade_id]
            missing.discard(grade_id)
    assert not missing, f"no solution cells named {sorted(missing)} in {exercise}"
    destination.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, destination)
    return destination


def from_module(module: object, names: list[str]) -> dict[str, str]:
    """A solution for each of ``names``: the function of that name in ``module``."""
    return {name: source_named(getattr(module, name), name) for name in names}


def class_solution(module: object, class_name: str, bound_name: str) -> str:
    """All of ``module``, then ``bound_name = class_name``.

    Appended to every solution cell, it replaces the notebook's class after each stub, the way
    a learner who wrote their own class from scratch would.
    """
    source = inspect.getsource(module)
    source = re.sub(r"^from __future__ import annotations\n", "", source, flags=re.M)
    return f"{source}\n{bound_name} = {class_name}\n"
