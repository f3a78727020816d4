"""Shared fixtures: the repository's paths, and chapter lists for parametrized tests."""

from __future__ import annotations

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

import nbformat  # noqa: E402
import pytest  # noqa: E402

import course  # noqa: E402

course.setup(quiet=True)  # before any kernel module is imported: Triton reads the mode then

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))  # tests/ helpers: alternatives, mutants

from autograder.chapters import chapters  # noqa: E402

CHAPTERS = list(chapters().values())


def grade(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m autograder ARGS``, as an instructor runs it."""
    return subprocess.run([sys.executable, "-m", "autograder", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=1200)


def max_points(chapter) -> float:
    """The points a chapter's graded cells are worth."""
    notebook = nbformat.read(chapter.source, as_version=4)
    return sum(c.metadata["nbgrader"]["points"] for c in notebook.cells
               if c.metadata.get("nbgrader", {}).get("grade"))


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep the call's report on the test item, for fixtures that act on failure."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.report_call = report
