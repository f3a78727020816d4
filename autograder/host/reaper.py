"""Runs a command so that nothing it starts outlives it, whatever session or group it moves to.

    python -m autograder.host.reaper SECONDS -- COMMAND...

Killing a process group is not enough: a learner's cell can start a process in a session of
its own (``setsid``, ``start_new_session=True``), and a process whose parent exits is handed
to init, out of reach. So this process makes itself a *child subreaper* (Linux'
``PR_SET_CHILD_SUBREAPER``): every orphan below it is handed to it instead of init. When the
command ends, or runs past SECONDS, it stops and kills every process below it, however
deeply nested, and waits for them, then exits with the command's status (124 on time out,
as ``timeout(1)`` does). It does the same at once when its own parent dies (SIGTERM, asked of
the kernel with ``PR_SET_PDEATHSIG``): a killed grader or Dask worker leaves nothing grading.
Where the kernel has no subreapers (not Linux), it falls back to killing the command's
process group.

The grader starts nbgrader through this; the kernel nbgrader starts, and everything the
learner's code starts, are below it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
TIMED_OUT = 124


class _Orphaned(Exception):
    """The process that started this one died (a grader or a Dask worker killed)."""


def _end_with_parent() -> None:
    """Be sent SIGTERM when the parent dies, and treat it as the end of the command: nothing
    is left grading for a grader that is gone."""

    def orphaned(*_: object) -> None:
        raise _Orphaned

    signal.signal(signal.SIGTERM, orphaned)
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # it died before the request took hold
        raise _Orphaned


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants; False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def descendants(root: int) -> list[int]:
    """Every living process below ``root``, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:  # it ended while we looked
            continue
        # the command name, in parentheses, may hold spaces and parentheses: skip past it
        parent = int(stat[stat.rindex(b")") + 2:].split()[1])
        children.setdefault(parent, []).append(int(entry))
    found, frontier = [], [root]
    while frontier:
        below = children.get(frontier.pop(), [])
        found += below
        frontier += below
    return found


def kill_descendants(root: int) -> None:
    """Stop, then kill, every process below ``root`` until none is left, and reap them.

    Stopping first keeps a process from starting new ones while the others are killed."""
    for _ in range(1000):
        below = descendants(root)
        if not below:
            return
        for pid in below:
            _signal(pid, signal.SIGSTOP)
        for pid in below:
            _signal(pid, signal.SIGKILL)
        _reap()
        time.sleep(0.01)


def _signal(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except (ProcessLookupError, PermissionError):
        pass


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def run(command: list[str], seconds: float, start=subprocess.Popen) -> int:
    """Run ``command`` for at most ``seconds``; leave nothing it started running. ``start``
    starts it as ``subprocess.Popen`` does (``autograder.host.forkserver`` forks it instead)."""
    subreaper = become_subreaper()
    child = start(command, start_new_session=not subreaper)
    try:
        _end_with_parent()
        status = child.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        status = TIMED_OUT
    except _Orphaned:
        status = -signal.SIGTERM
    if subreaper:
        kill_descendants(os.getpid())
    else:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        child.wait()
    return status if status >= 0 else 128 - status  # killed by a signal: 128 + its number


def main(argv: list[str]) -> int:
    seconds, separator, *command = argv
    if separator != "--" or not command:
        print("usage: python -m autograder.host.reaper SECONDS -- COMMAND...", file=sys.stderr)
        return 2
    return run(command, float(seconds))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
