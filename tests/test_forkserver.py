"""nbgrader forked warm (``autograder.host.forkserver``) is nbgrader as a fresh process runs it, and
keeps the reaper's promise: nothing grades on once its grader, or the server itself, is gone."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO
from mutants import ch01 as mutants
from notebook_variants import fill, from_module

from autograder.host import forkserver
from autograder.host.reaper import descendants
from autograder.host.sandbox import Limits, run
from course.experiments import kv_sizing

CHAPTER = "01_kv_cache_sizing"
NBGRADER = [sys.executable, *forkserver.NBGRADER]

pytestmark = pytest.mark.skipif(not forkserver.serves(NBGRADER),
                                reason="the fork server needs Linux' process file descriptors")


@pytest.mark.parametrize("args", [["--version"], ["autograde", "no_such_chapter"]],
                         ids=["succeeds", "fails"])
def test_a_forked_nbgrader_says_and_exits_as_a_fresh_one(args, tmp_path):
    cold = subprocess.run([*NBGRADER, *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    warm = run([*NBGRADER, *args], tmp_path, 120, Limits())
    assert [line for line in warm.splitlines() if "[" not in line] == [
        line for line in (cold.stdout + cold.stderr).splitlines() if "[" not in line]
    if cold.returncode:
        assert "no_such_chapter" in warm  # nbgrader's own words for what it could not find


def _grading_a_hanging_notebook(tmp_path: Path) -> tuple[subprocess.Popen, list[int]]:
    """A grader whose learner's cell sleeps; returned with every process below it once the
    learner's kernel runs (bubblewrap's, its own PID namespace's, the kernel's)."""
    solutions = from_module(kv_sizing, list(mutants.MUTANTS))
    solutions["kv_bytes_per_token"] = "import time\ntime.sleep(600)\n"
    notebook = fill(REPO / "exercises" / f"{CHAPTER}.ipynb", tmp_path / f"{CHAPTER}.ipynb",
                    solutions)
    grader = subprocess.Popen([sys.executable, "-m", "autograder", "grade", str(notebook),
                               "--cell-timeout", "600"], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not any("ipykernel" in _command(pid) for pid in descendants(grader.pid)):
        assert grader.poll() is None, grader.stdout.read()
        assert time.monotonic() < deadline, "the learner's kernel never started"
        time.sleep(0.2)
    time.sleep(1)  # the kernel is in its cell
    return grader, descendants(grader.pid)


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _all_end(pids: list[int], seconds: float = 60) -> list[int]:
    """The processes of ``pids`` still running after ``seconds``."""
    deadline = time.monotonic() + seconds
    while (left := [pid for pid in pids if _command(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_nothing_grades_on_once_the_grader_is_killed(tmp_path):
    """The server sees its pipe close and tells every reaper to end."""
    grader, below = _grading_a_hanging_notebook(tmp_path)
    assert any("autograder.host.forkserver" in _command(pid) for pid in below)
    grader.kill()
    grader.wait()
    assert [_command(pid) for pid in _all_end(below)] == []


def test_a_killed_fork_server_ends_its_submissions_and_the_grader_goes_on(tmp_path):
    """Its reapers are told (``PR_SET_PDEATHSIG``); the grader reads that the notebook was not
    graded, rather than waiting for it."""
    grader, below = _grading_a_hanging_notebook(tmp_path)
    server = next(pid for pid in below if "autograder.host.forkserver" in _command(pid))
    subprocess.run(["kill", "-KILL", str(server)], check=True)
    said, _ = grader.communicate(timeout=120)
    assert [_command(pid) for pid in _all_end(below)] == []
    assert "nbgrader could not grade it" in said, said
