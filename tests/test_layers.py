"""The house's layers: the library (course/) and the kernels (kernels/) know nothing of the
grader, and the kernels stand alone. Drawn from every import in their source, however deep.
And its one naming rule for a chapter's own tests."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest
from conftest import REPO

from autograder.table import PARTS

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


def test_the_grading_kernel_imports_no_triton_before_setup_chooses_its_mode():
    """``@triton.jit`` reads TRITON_INTERPRET when Triton is imported: a grader module that
    imported it before ``course.setup()`` would leave the kernels compiled for a GPU."""
    script = ("import sys\nimport autograder.borrowing, autograder.guard, autograder.private\n"
              "print(sorted(m for m in sys.modules if m.split('.')[0] in ('triton', 'kernels')))")
    printed = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout
    assert printed.strip() == "[]"


def test_a_chapter_s_own_tests_are_named_after_a_chapter_of_the_table():
    """``tests/test_chNN_<topic>.py``, NN a chapter of ``autograder.table`` (its ``tests``)."""
    own = {path for parts in PARTS.values() for path in REPO.glob(parts.tests)}
    numbered = {path for path in (REPO / "tests").glob("test_ch*.py")
                if re.fullmatch(r"test_ch\d+.*\.py", path.name)}
    assert own, "the table's pattern finds no chapter's tests"
    assert sorted(path.name for path in numbered - own) == []


def test_importing_a_grader_module_changes_nothing_in_the_process():
    """A module that edits the process (its environment, its warnings filters) when imported
    does so in whatever imports it, a learner's kernel included: what a process needs is set
    by a call that says so (``gradebook.prepare_for_nbgrader``). The libraries are imported
    first, so that only the grader's own modules are measured."""
    modules = sorted(f"autograder.{p.stem}" for p in (REPO / "autograder").glob("*.py")
                     if p.stem not in {"__init__", "__main__"})
    modules += sorted(f"autograder.{p.parent.name}.{p.stem}"
                      for folder in ("checks", "hidden")
                      for p in (REPO / "autograder" / folder).glob("*.py"))
    script = (
        "import os, sys, warnings\n"
        "import nbformat, nbgrader.api, nbgrader.apps, sqlalchemy, torch, numpy, triton\n"
        "before = dict(os.environ), list(warnings.filters)\n"
        f"for name in {modules!r}:\n"
        "    __import__(name)\n"
        "    if (dict(os.environ), list(warnings.filters)) != before:\n"
        "        sys.exit(f'importing {name} changed the process')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
