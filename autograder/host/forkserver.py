"""nbgrader started warm: each submission's nbgrader forked from a process that has it loaded.

A fresh Python spends about two seconds of CPU importing nbgrader, nbconvert and SQLAlchemy
before it grades anything: half of what grading chapter 1's notebook costs. Every
submission still gets an nbgrader process of its own (its limits, its session, nothing
outliving it), but it is forked from one process per grader that did those imports once, as
``multiprocessing``'s "forkserver" start method does::

    grader ── fork server (nbgrader loaded; it ends when the grader closes its pipe)
                  ├── reaper     (forked: the submission's session, memory and time limits)
                  │     └── nbgrader autograde ...   (forked: ``nbgrader_main.main(ARGS)``)
                  │           └── bwrap ── ipykernel
                  └── reaper ...

The reaper is ``autograder.host.reaper``'s own, with its command forked instead of executed; the
grader sees what ``subprocess.Popen`` would give it (a pid whose session it can kill, an exit
status), so ``sandbox.run`` treats both alike. The server forks from its one thread, so the
children inherit no lock held by another. It talks to the grader in JSON lines over its
stdin and stdout::

    grader -> server   {"args": [...], "cwd": ..., "env": {...}, "output": PATH,
                        "seconds": 900, "memory": BYTES or null}
    server -> grader   {"started": PID}          (one per request, in order)
                       {"ended": PID, "status": CODE}

Its own end (the grader gone, or its pipe closed) tells every reaper still running to end:
each ends everything below it. A reaper whose server is killed outright is told too
(``PR_SET_PDEATHSIG``, as ``autograder.host.reaper`` asks of its parent). Linux only (it waits on
process file descriptors); elsewhere nbgrader starts afresh.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import os
import queue
import resource
import select
import selectors
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from autograder.host import nbgrader_main, reaper

__all__ = ["Spawned", "serves", "spawn", "start"]

NBGRADER = ["-m", "autograder.host.nbgrader_main"]  # the command it runs warm, after sys.executable


def serves(command: list[str]) -> bool:
    """Whether ``command`` is nbgrader's command line and this machine can fork it warm."""
    return command[:3] == [sys.executable, *NBGRADER] and _pidfds()


@functools.cache
def _pidfds() -> bool:
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):  # not Linux, or a kernel before 5.3
        return False
    return True


# ---------------------------------------------------------------------------- the grader's side


class Spawned:
    """A reaper the server forked: what ``sandbox.run`` uses of a ``subprocess.Popen``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._ended = threading.Event()

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"reaper {self.pid}", timeout or 0)
        return self.returncode

    def end(self, status: int) -> None:
        self.returncode = status
        self._ended.set()


class _Server:
    """The fork server, seen from the grader: requests in order, replies read by a thread."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "autograder.host.forkserver"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._lock = threading.Lock()  # one request at a time, so replies come in order
        self._started: queue.SimpleQueue[Spawned | None] = queue.SimpleQueue()
        self._running: dict[int, Spawned] = {}
        threading.Thread(target=self._read, daemon=True, name="forkserver-replies").start()

    def spawn(self, request: dict) -> Spawned:
        with self._lock:
            try:
                self.process.stdin.write(json.dumps(request).encode() + b"\n")
                self.process.stdin.flush()
            except OSError as error:
                raise OSError("the fork server ended") from error
            spawned = self._started.get()
        if spawned is None:
            raise OSError("the fork server ended")
        return spawned

    def alive(self) -> bool:
        return self.process.poll() is None

    def _read(self) -> None:
        try:
            for line in self.process.stdout:
                reply = json.loads(line)
                if "started" in reply:
                    spawned = Spawned(reply["started"])
                    self._running[spawned.pid] = spawned
                    self._started.put(spawned)
                else:
                    self._running.pop(reply["ended"]).end(reply["status"])
        finally:  # the server is gone, and its reapers were told to end (PR_SET_PDEATHSIG)
            self.process.kill()
            for spawned in self._running.values():
                spawned.end(-signal.SIGKILL)
            self._started.put(None)


_SERVER: _Server | None = None
_SERVER_LOCK = threading.Lock()


def spawn(args: list[str], cwd: Path, env: dict[str, str], output: Path, seconds: float,
          memory: int | None) -> Spawned:
    """``python -m autograder.host.nbgrader_main ARGS`` under a reaper with ``seconds`` (its exit
    status 124 past them) and an address space of ``memory`` bytes, in ``cwd`` with exactly
    ``env``, writing to ``output``: forked from this process's fork server (started on first
    use, and again if it ended)."""
    return _server().spawn({"args": args, "cwd": str(cwd), "env": env, "output": str(output),
                            "seconds": seconds, "memory": memory})


def start() -> None:
    """Start this process's fork server now where it can serve and is not running, so that it
    loads nbgrader while this process goes on (a kernel's template loads the chapter)."""
    if _pidfds():
        _server()


def _server() -> _Server:
    global _SERVER
    with _SERVER_LOCK:
        if _SERVER is None or not _SERVER.alive():
            _SERVER = _Server()
        return _SERVER


# ---------------------------------------------------------------------------- the server


def serve() -> None:
    """Load nbgrader, then fork a reaper for every request until the grader closes stdin."""
    # the protocol's own descriptors: what an import or a child prints cannot reach it
    requests, replies = os.dup(0), os.dup(1)
    quiet = os.open(os.devnull, os.O_RDWR)
    os.dup2(quiet, 0)
    os.dup2(quiet, 1)
    os.close(quiet)
    nbgrader_main.preload()
    # what was loaded stays out of the collector's walks, so the children's collections do
    # not write to (and so copy) the pages they share with this process
    gc.freeze()
    selector = selectors.DefaultSelector()
    selector.register(requests, selectors.EVENT_READ)
    reapers: dict[int, int] = {}  # process fd -> reaper pid
    pending = b""
    while True:
        for key, _ in selector.select():
            if key.fd != requests:
                pid = reapers.pop(key.fd)
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                _reply(replies, {"ended": pid, "status": os.waitstatus_to_exitcode(status)})
                continue
            chunk = os.read(requests, 65536)
            if not chunk:  # the grader is gone: end every submission still running
                _end(reapers)
                return
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                pid = _fork_reaper(json.loads(line))
                fd = os.pidfd_open(pid)
                reapers[fd] = pid
                selector.register(fd, selectors.EVENT_READ)
                _reply(replies, {"started": pid})


def _reply(fd: int, message: dict) -> None:
    os.write(fd, json.dumps(message).encode() + b"\n")


def _end(reapers: dict[int, int]) -> None:
    for pid in reapers.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    for pid in reapers.values():
        os.waitpid(pid, 0)


def _exit_after(work: Callable[[], int]) -> NoReturn:
    """End this forked child with ``work``'s status, or 1 with the traceback in its output
    when it raised: a child never returns into its parent's code."""
    status = 1
    try:
        status = work()
    except BaseException:  # whatever it was, the grader reads it in the output
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def _fork_reaper(request: dict) -> int:
    """A child in a session of its own, with the request's limits, place and environment,
    that runs the reaper over a forked nbgrader and exits with the reaper's status."""
    pid = os.fork()
    if pid:
        return pid

    def reap() -> int:
        os.setsid()
        output = os.open(request["output"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the protocol's and other children's fds
        if request["memory"]:
            resource.setrlimit(resource.RLIMIT_AS, (request["memory"], request["memory"]))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        return reaper.run(request["args"], request["seconds"], start=_Forked)

    _exit_after(reap)


class _Forked:
    """nbgrader forked from the reaper: the part of ``subprocess.Popen`` the reaper uses."""

    def __init__(self, args: list[str], start_new_session: bool) -> None:
        self.pid = os.fork()
        if self.pid == 0:
            if start_new_session:
                os.setsid()
            _exit_after(lambda: nbgrader_main.main(args))
        self._exited = os.pidfd_open(self.pid)

    def wait(self, timeout: float | None = None) -> int:
        ready, _, _ = select.select([self._exited], [], [], timeout)
        if not ready:
            raise subprocess.TimeoutExpired("nbgrader", timeout or 0)
        _, status = os.waitpid(self.pid, 0)
        return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    serve()
