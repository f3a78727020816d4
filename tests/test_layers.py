"""The house's layers: the library (course/) and the kernels (kernels/) know nothing of the
grader, and the kernels stand alone; in the grader, each folder by where its code runs
(``autograder/__init__.py``) imports only the folders before it. Drawn from every import in
their source, however deep. And its one naming rule for a chapter's own tests."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest
from conftest import REPO

from autograder.table import PARTS

LAYERS = {"course": {"autograder"}, "kernels": {"autograder", "course"}}


def _imported(path, depth: int = 1, top_level_only: bool = False) -> set[str]:
    """The modules ``path`` imports, each cut to its first ``depth`` dotted names (of a
    ``from package import name``, ``package.name`` too); only the imports at the module's top
    level (run when it is imported) if ``top_level_only``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return {".".join(name.split(".")[:depth]) for name in found}


GRADER = REPO / "autograder"
# Where each of the grader's folders runs, and the folders it may not import: each layer
# only those before it (autograder/__init__.py draws the map).
FOLDERS = {
    "autograder": {"autograder.host", "autograder.builder"},  # the kernel side (top level)
    "autograder/checks": {"autograder.host", "autograder.builder", "autograder.hidden"},
    "autograder/hidden": {"autograder.host", "autograder.builder"},
    "autograder/host": {"autograder.builder"},
    "autograder/builder": set(),
}


@pytest.mark.parametrize("package", LAYERS)
def test_a_lower_layer_imports_nothing_above_it(package):
    crossing = {str(path.relative_to(REPO)): sorted(_imported(path) & LAYERS[package])
                for path in sorted((REPO / package).rglob("*.py"))}
    assert {k: v for k, v in crossing.items() if v} == {}


# The library's folders: the engines stand on the course's top level (language, runtime, the
# tiny model) and the V1 engine on the V0 one's pool and block hash; the experiments and the
# notebooks' helpers may use either engine, never the other way round.
ENGINES = {"course/v0": {"course.v1", "course.experiments", "course.notebook"},
           "course/v1": {"course.experiments", "course.notebook"}}


@pytest.mark.parametrize("folder", ENGINES)
def test_an_engine_imports_no_experiment_no_notebook_helper_and_no_later_engine(folder):
    crossing = {str(path.relative_to(REPO)): sorted(_imported(path, depth=2) & ENGINES[folder])
                for path in sorted((REPO / folder).glob("*.py"))}
    assert {k: v for k, v in crossing.items() if v} == {}


def test_the_library_s_folders_are_the_engines_the_experiments_and_the_helpers():
    packages = {str(p.parent.relative_to(REPO)) for p in (REPO / "course").rglob("__init__.py")}
    assert packages == {"course", *ENGINES, "course/experiments", "course/notebook"}


def _modules_of(folder: str) -> list:
    paths = sorted((REPO / folder).glob("*.py"))
    return [p for p in paths if p.name != "__main__.py"]  # the command line's door


@pytest.mark.parametrize("folder", FOLDERS)
def test_each_folder_of_the_grader_imports_only_the_folders_before_it(folder):
    """The kernel side (and the checks) never import the host or the build, a visible check
    never a hidden one, the host never the build: except the command line (``host/cli.py``),
    whose build commands import the build when they run, never when it is imported."""
    crossing = {}
    for path in _modules_of(folder):
        everywhere = _imported(path, depth=2) & FOLDERS[folder]
        if path == GRADER / "host" / "cli.py":
            everywhere = _imported(path, depth=2, top_level_only=True) & FOLDERS[folder]
        if everywhere:
            crossing[str(path.relative_to(REPO))] = sorted(everywhere)
    assert crossing == {}


def test_the_folders_of_the_grader_are_the_map_s():
    """Every package of the grader is one of the map's folders: a new one is placed on it."""
    packages = {str(p.parent.relative_to(REPO)) for p in GRADER.rglob("__init__.py")}
    assert packages == set(FOLDERS)


def test_the_host_imports_no_answer_and_runs_no_code_of_its_own_reading():
    """The host reads a submission, never runs it: no ``exec``, ``eval`` or ``compile`` of
    code, and of the library only modules with no answer in them (the course's language and
    runtime), so that nothing a learner might be asked to write runs outside the sandbox."""
    from autograder.answers import written_answers

    answering = {module for module, _ in written_answers()}
    found = {}
    for path in _modules_of("autograder/host"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        runs = sorted(node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call)
                      and isinstance(node.func, ast.Name)
                      and node.func.id in ("exec", "eval", "compile"))
        library = {m for m in _imported(path, depth=2) if m.split(".")[0] in LAYERS}
        if runs or library & answering:
            found[path.name] = runs + sorted(library & answering)
    assert found == {}
    assert answering, "no answer found in the library: the check would pass vacuously"


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
    modules = sorted(".".join(p.relative_to(REPO).with_suffix("").parts)
                     for p in GRADER.rglob("*.py") if p.stem not in {"__init__", "__main__"})
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
