"""Nothing a graded process starts outlives it: not in its own session, not double-forked,
not when its time runs out."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from autograder.sandbox import Limits, run

# Starts three processes that try to escape: one in a new session, one double-forked (its
# parent exits, so it is orphaned), one that ignores SIGTERM; prints their process ids.
ESCAPES = r"""
import os, signal, subprocess, sys, time
session = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                           start_new_session=True)
if os.fork() == 0:
    if os.fork() == 0:
        os.setsid()
        os.write(1, b"%d\n" % os.getpid())
        time.sleep(600)
    os._exit(0)
stubborn = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
os.write(1, b"%d %d\n" % (session.pid, stubborn.pid))
time.sleep(0.5)
{end}
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="child subreapers are a Linux feature")


@pytest.mark.parametrize("end", ["", "time.sleep(600)"], ids=["returns", "times-out"])
def test_no_process_a_command_starts_survives_it(end, tmp_path):
    started = time.monotonic()
    try:
        output = run([sys.executable, "-c", ESCAPES.format(end=end)], tmp_path, 5, Limits())
    except subprocess.TimeoutExpired as timed_out:
        assert end, "only the command that sleeps runs out of time"
        output = timed_out.output
    pids = [int(word) for word in output.split()]
    assert len(pids) == 3
    assert not [pid for pid in pids if _alive(pid)]
    assert time.monotonic() - started < 30


def test_the_command_runs_where_and_as_asked(tmp_path):
    output = run([sys.executable, "-c", "import os; print(os.getcwd()); "
                  "print(os.environ['HYPOTHESIS_STORAGE_DIRECTORY'])"], tmp_path, 30, Limits())
    assert output.split() == [str(tmp_path), str(tmp_path / ".hypothesis-storage")]
    assert os.getpid()  # the grader itself is untouched
