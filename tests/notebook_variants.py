"""Learner notebooks made from a released exercise: filled-in solutions, right or wrong; and
the instructor's notebook as a learner would run it.

A learner writes their function into the solution cell; here the stub stays where it is and
the new definition follows it in the same cell, the way a learner's redefinition would win.
"""

from __future__ import annotations

import ast
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


def _borrow_function(module: str, name: str, form: int) -> str:
    """A solution cell that answers with the course's own function, in one of four ways."""
    return [
        f"from {module} import {name}  # noqa: F401",
        f"import importlib\n\n{name} = getattr(importlib.import_module({module!r}), {name!r})",
        f"import {module} as course_module\n\n\ndef {name}(*args, **kwargs):\n"
        f"    return course_module.{name}(*args, **kwargs)",
        f"import functools\n\nimport {module} as course_module\n\n"
        f"{name} = functools.partial(course_module.{name})",
    ][form % 4]


def _borrow_kernel(module: str, name: str, form: int) -> str:
    """A solution cell that answers with the course's own Triton kernel: imported, aliased, or
    called from inside a kernel of the same signature (a wrapper or a partial of a kernel
    cannot be launched, so no learner would hand one in)."""
    import importlib
    import inspect

    kernel = getattr(importlib.import_module(module), name)
    parameters = inspect.signature(kernel.fn).parameters.values()
    signature = ", ".join(f"{p.name}: tl.constexpr" if "constexpr" in str(p.annotation)
                          else p.name for p in parameters)
    arguments = ", ".join(p.name for p in parameters)
    return [
        f"from {module} import {name}  # noqa: F401",
        f"import importlib\n\n{name} = getattr(importlib.import_module({module!r}), {name!r})",
        f"import triton\nimport triton.language as tl\n\n"
        f"from {module} import {name} as course_kernel\n\n\n"
        f"@triton.jit\ndef {name}({signature}):\n    course_kernel({arguments})",
    ][form % 3]


def _borrow_method(module: str, owner: str, name: str, form: int) -> str:
    """A solution cell that answers with the course's own method: copied, delegated to, or
    inherited by a subclass that takes the notebook's class's name."""
    return [
        f"import importlib\n\n{owner}.{name} = importlib.import_module({module!r}).{owner}.{name}",
        f"import {module} as course_module\n\n\ndef {name}(self, *args, **kwargs):\n"
        f"    return course_module.{owner}.{name}(self, *args, **kwargs)\n\n\n"
        f"{owner}.{name} = {name}",
        f"import {module} as course_module\n\n\nclass {owner}(course_module.{owner}):\n"
        f"    def {name}(self, *args, **kwargs):\n"
        f"        return super().{name}(*args, **kwargs)",
    ][form % 3]


def borrowed(exercise: Path, destination: Path, solution: Path) -> Path:
    """``exercise`` with every answer cell replaced by one that borrows the course's own
    answer, the ways of borrowing taken in turn (``solution`` says what each cell defines)."""
    from autograder.table import PARTS

    notebook = nbformat.read(exercise, as_version=4)
    parts = PARTS[notebook.metadata["course"]["chapter"]]
    defined = {c.metadata["nbgrader"]["grade_id"]: [
        (n.name, any("jit" in ast.unparse(d) for d in n.decorator_list))
        for n in ast.parse(c.source).body if isinstance(n, ast.FunctionDef)]
        for c in nbformat.read(solution, as_version=4).cells
        if c.metadata.get("nbgrader", {}).get("solution")}
    form = 0
    for cell in notebook.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id not in defined or cell.metadata["nbgrader"].get("locked"):
            continue
        where = parts.answers.get(grade_id) or parts.skeleton
        module, _, owner = where.partition(":")
        pieces = []
        for name, kernel in defined[grade_id]:
            if owner:
                pieces.append(_borrow_method(module, owner, name, form))
            elif kernel:
                pieces.append(_borrow_kernel(module, name, form))
            else:
                pieces.append(_borrow_function(module, name, form))
            form += 1
        cell.source = "\n\n\n".join(pieces)
    destination.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, destination)
    return destination


def without_hidden_tests(source: Path, target: Path) -> Path:
    """The instructor's notebook with its hidden tests cleared, as nbgrader clears them on
    release: what a notebook run top to bottom for its pictures, prose and visible tests
    needs (the hidden tests are graded in tests/test_grading.py and test_zh_grading.py)."""
    notebook = nbformat.read(source, as_version=4)
    for cell in notebook.cells:
        cell.source = re.sub(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", "",
                             cell.source, flags=re.S)
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, target)
    return target


def given_cells_edited(source: Path, destination: Path | None = None, extra: str = ""
                       ) -> nbformat.NotebookNode:
    """``source`` with every cell a learner is given to change (set-up, demonstrations)
    edited as they try things: a comment, then the cell, then a line of theirs (and
    ``extra``). Written to ``destination`` when given."""
    from autograder.host.release_history import given_cells

    notebook = nbformat.read(source, as_version=4)
    for cell in given_cells(notebook):
        cell.source = f"# trying other sizes here\n{cell.source}\nprint('tried')\n{extra}"
    if destination is not None:
        destination.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, destination)
    return notebook
