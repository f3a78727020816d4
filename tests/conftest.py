"""Shared fixtures: the repository's paths, and chapter lists for parametrized tests."""

from __future__ import annotations

import ast
import fcntl
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

# One torch thread in every process the suite starts (it inherits this): the suite runs a
# worker per core, each starting kernels, graders and notebooks of its own, and torch's
# OpenMP threads, one per core in every process, spin while they wait. Oversubscribed, they
# slow the course's small operations tenfold (chapter 8's exercise: 5.6 s alone, 62 s beside
# one busy process, 6.0 s there with one thread). Set before torch is first imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from course.runtime import without_format_checkers  # noqa: E402

without_format_checkers()  # before nbformat: each worker's start, a second sooner

import nbformat  # noqa: E402
import pytest  # noqa: E402

import course  # noqa: E402

course.setup(quiet=True)  # before any kernel module is imported: Triton reads the mode then

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))  # tests/ helpers: alternatives, mutants

from autograder.host.chapters import chapters  # noqa: E402

CHAPTERS = list(chapters().values())
# The chapter a class is learning in tests/test_wheel.py: its edition reveals every other
# chapter's answers and holds stubs of this one's.
LEARNED = CHAPTERS[-1]


def grade(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m autograder ARGS``, as an instructor runs it."""
    return subprocess.run([sys.executable, "-m", "autograder", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=1200)


def nbgrader(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess:
    """``nbgrader ARGS`` in ``cwd``, as an instructor runs it (this environment's programs
    first: nbgrader calls ``alembic``); fails the test unless it succeeds."""
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent),
                                                 os.environ.get("PATH", "")]))
    done = subprocess.run([sys.executable, "-m", "nbgrader", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def selected(request, argname: str) -> list:
    """The values of ``argname`` that the run's selected tests of the requesting module take,
    in order: a module fixture that serves one parametrized test builds only what ``-k``
    kept."""
    values = []
    for item in request.session.items:
        value = getattr(item, "callspec", None) and item.callspec.params.get(argname)
        if item.module is request.module and value is not None and value not in values:
            values.append(value)
    return values


def graded_together(notebooks: dict[str, list[Path]], report: Path
                    ) -> dict[str, tuple[list[dict], str]]:
    """Every notebook of ``notebooks`` graded by one ``grade`` command, as an instructor
    grades a folder: each key -> (its notebooks' results, in order; what was printed for the
    first of them)."""
    done = grade("grade", *(path for paths in notebooks.values() for path in paths),
                 "--json", report)
    assert done.returncode == 0, done.stderr
    by_notebook = {result["notebook"]: result for result in json.loads(report.read_text())}
    return {key: ([by_notebook[str(path)] for path in paths], _printed(done.stdout, paths[0]))
            for key, paths in notebooks.items()}


def _printed(stdout: str, notebook: Path) -> str:
    """What ``grade`` printed for ``notebook``: its heading line and the lines under it."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith((f"{notebook}:",
                                                                        f"{notebook} (")))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith(" ")),
               len(lines))
    return "\n".join(lines[start:end])


def max_points(chapter) -> float:
    """The points a chapter's graded cells are worth."""
    notebook = nbformat.read(chapter.source, as_version=4)
    return sum(c.metadata["nbgrader"]["points"] for c in notebook.cells
               if c.metadata.get("nbgrader", {}).get("grade"))


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def once_per_run(tmp_path_factory):
    """``once_per_run(name, compute)``: what ``compute()`` returns (a JSON value), computed by
    the first of the run's workers to ask and read by the others from the folder they share
    (pytest-xdist gives each worker a folder in the run's own)."""
    base = tmp_path_factory.getbasetemp()
    folder = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base

    def once(name: str, compute):
        path = folder / f"{name}.json"
        with open(folder / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the others wait for the first to write it
            if not path.exists():
                path.write_text(json.dumps(compute()))
        return json.loads(path.read_text())

    return once


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep the call's report on the test item, for fixtures that act on failure."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.report_call = report


@pytest.hookimpl(optionalhook=True)  # xdist's hook: unknown when xdist is not loaded
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope``: each test is a unit of its own, so a long file spreads over the
    workers, except tests that share a fixture built once per module (a graded class, a built
    wheel, a JupyterLab and its browser): those are one unit, run on one worker, so the
    fixture is built once."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path, _, test = nodeid.partition("::")
            return path if test.split("[")[0] in _sharing_module_fixtures(path) else nodeid

    return SharedFixtureScheduling(config, log)


@functools.cache
def _sharing_module_fixtures(path: str) -> set[str]:
    """The tests of a test file (read, not imported: the scheduler sees only test ids) that
    use, directly or through other fixtures of the file, a fixture of module scope."""
    functions = [node for node in ast.parse((REPO / path).read_text()).body
                 if isinstance(node, ast.FunctionDef)]

    def scope(function: ast.FunctionDef) -> str | None:
        for decorator in function.decorator_list:
            call = decorator if isinstance(decorator, ast.Call) else None
            named = ast.unparse(call.func if call else decorator)
            if named.endswith("fixture"):
                given = {k.arg: k.value for k in call.keywords} if call else {}
                return ast.literal_eval(given["scope"]) if "scope" in given else "function"
        return None

    fixtures = {f.name: f for f in functions if scope(f)}
    shared = {name for name, f in fixtures.items() if scope(f) in ("module", "package")}

    def needs(function: ast.FunctionDef, seen: frozenset = frozenset()) -> bool:
        names = {a.arg for a in function.args.args}
        return bool(names & shared) or any(
            needs(fixtures[n], seen | {n}) for n in names if n in fixtures and n not in seen)

    return {f.name for f in functions if f.name.startswith("test") and needs(f)}
