"""Running a grading process under a submission's limits, leaving nothing behind.

Every command that executes learner code (nbgrader's autograde, the crash probe) runs here:
in its own process group, under ``autograder.host.reaper`` (so nothing it starts survives it, in
any session or group), with an address-space limit on CPU-only machines, its share of the
cores, hypothesis' files in the submission's own folder, and a time limit. With
``Limits.sandbox`` it also runs in a bubblewrap sandbox (``autograder.host.bubblewrap``) that sees
only the system, the Python environment, the course's packages and the submission's own
folders, with HOME and every cache inside them, no network and its own PID namespace; the
reaper still runs inside it (it gives the time limit and its exit status). nbgrader's own
command, which runs outside the sandbox, is forked with its reaper from a process that has
nbgrader loaded (``autograder.host.forkserver``) rather than started afresh, where Linux allows.
"""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from autograder.host import bubblewrap, forkserver
from autograder.host.bubblewrap import probe
from course.runtime import gpu_name

__all__ = ["Limits", "end_all", "probe", "run"]

_RUNNING: set[int] = set()  # the reapers ``run`` has started that have not yet ended
_STOPPED = threading.Event()  # ``end_all`` was called: nothing more starts


class Stopped(RuntimeError):
    """Grading was stopped (``end_all``) before this command could start."""


@dataclass(frozen=True)
class Limits:
    """What one submission may use."""

    cell_timeout: int = 120  # seconds per cell
    notebook_timeout: int = 900  # seconds for a whole notebook, kernel start included
    memory_gib: float | None = 4.0  # address space of nbgrader and of the kernel; None: none
    # CPU threads for each kernel's torch (OMP_NUM_THREADS); None: the library's default, one
    # per core. Notebooks graded side by side must share the cores: torch's OpenMP threads
    # spin while they wait, and oversubscribed they slow small operations many times over.
    threads: int | None = None
    # run learner code in the bubblewrap sandbox (the CLI decides: --sandbox, probed once)
    sandbox: bool = False
    # in the sandbox, fork each kernel from a template that imported the chapter's modules
    # (autograder.host.warm); False: each kernel starts afresh
    warm_kernels: bool = True


_GRACE = 30  # seconds the reaper gets to clean up after its own deadline


def run(command: list[str], cwd: Path, timeout: int, limits: Limits,
        writable: Sequence[Path] = (), environment: dict[str, str] | None = None) -> str:
    """Run ``command`` in ``cwd`` under ``limits`` for at most ``timeout`` seconds; return its
    output (stdout and stderr). Raises ``TimeoutExpired`` when time ran out; either way,
    every process it started is gone when this returns. In the sandbox, only ``writable``
    (default: ``cwd``) can be written, and the first of them holds HOME. ``environment`` adds
    variables to this process's."""
    if _STOPPED.is_set():
        raise Stopped("grading was stopped")
    writable = list(writable) or [cwd]
    env = environment_for(dict(os.environ) | (environment or {}), writable, limits.threads)
    memory = _address_space(limits.memory_gib)
    # output goes to a file, not a pipe: a process that escaped could hold a pipe open
    with tempfile.NamedTemporaryFile("w+", encoding="utf-8", errors="replace") as output:
        process = None
        if not limits.sandbox and forkserver.serves(command):
            # nbgrader's command forked warm with its reaper; started cold, below, where the
            # fork server could not start it
            with contextlib.suppress(OSError):
                process = forkserver.spawn(command[3:], cwd, env, Path(output.name), timeout,
                                           memory)
        if process is None:
            reaped = [sys.executable, "-m", "autograder.host.reaper", str(timeout), "--", *command]
            if limits.sandbox:
                reaped = confine(reaped, cwd, writable, env)
            # the address space capped in the process started and all below it
            limit = None if memory is None else functools.partial(
                resource.setrlimit, resource.RLIMIT_AS, (memory, memory))
            process = subprocess.Popen(reaped, cwd=cwd, env=env, stdout=output,
                                       stderr=subprocess.STDOUT, start_new_session=True,
                                       preexec_fn=limit)
        _RUNNING.add(process.pid)
        try:
            process.wait(timeout=timeout + _GRACE)
        except subprocess.TimeoutExpired:  # the reaper itself hung: end its whole group
            _kill_group(process.pid)
            process.wait()
            raise subprocess.TimeoutExpired(command, timeout, output=_read(output)) from None
        finally:
            _kill_group(process.pid)
            _RUNNING.discard(process.pid)
        log = _read(output)
    if process.returncode == 124:  # the reaper's deadline
        raise subprocess.TimeoutExpired(command, timeout, output=log)
    return log


def environment_for(env: dict[str, str], writable: Sequence[Path], threads: int | None = None
                    ) -> dict[str, str]:
    """``env`` as a graded process gets it: this environment's programs first, ``threads``
    torch threads (its share of the cores), hypothesis' folder in the first of ``writable``
    (deleted with it)."""
    env = dict(env)
    # nbgrader calls `alembic` and starts kernels by name: this environment's bin comes first.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if threads and "OMP_NUM_THREADS" not in env:  # a setting of the user's wins
        env["OMP_NUM_THREADS"] = str(threads)
    env["HYPOTHESIS_STORAGE_DIRECTORY"] = str(Path(writable[0]) / ".hypothesis-storage")
    return env


def confine(command: list[str], cwd: Path, writable: Sequence[Path], env: dict[str, str]
            ) -> list[str]:
    """``command`` run in the bubblewrap sandbox, where only ``writable`` can be written;
    ``env`` (changed in place) gets the sandbox's own HOME and caches, in the first of them."""
    env.update(private_home(Path(writable[0]) / ".home"))
    return bubblewrap.wrap(command, writable, cwd)


def private_home(home: Path) -> dict[str, str]:
    """HOME, the temporary folder and every cache and settings folder the kernel, Jupyter,
    IPython, Triton and matplotlib use, in ``home`` (created): the host's do not exist in
    the sandbox, and a cache shared between submissions would carry one into the next."""
    folders = {"XDG_CACHE_HOME": ".cache", "XDG_CONFIG_HOME": ".config",
               "XDG_DATA_HOME": ".local/share", "XDG_RUNTIME_DIR": ".runtime",
               "TRITON_CACHE_DIR": ".triton/cache", "MPLCONFIGDIR": ".config/matplotlib",
               "IPYTHONDIR": ".ipython", "JUPYTER_CONFIG_DIR": ".jupyter",
               "JUPYTER_DATA_DIR": ".local/share/jupyter",
               "JUPYTER_RUNTIME_DIR": ".local/share/jupyter/runtime"}
    # XDG_RUNTIME_DIR must exist, private to its user; the others are made when first used
    (home / folders["XDG_RUNTIME_DIR"]).mkdir(mode=0o700, parents=True, exist_ok=True)
    return {"HOME": str(home), "TMPDIR": "/tmp"} | {
        name: str(home / folder) for name, folder in folders.items()}


def _read(output) -> str:
    output.seek(0)
    return output.read()


def end_all() -> None:
    """End every command ``run`` started that is still running, and start no more (a batch
    stopped with Ctrl-C: each is in a session of its own, where the terminal's signal does
    not reach). Each reaper is told to end, and it ends everything below it."""
    _STOPPED.set()
    for pid in list(_RUNNING):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _address_space(gib: float | None) -> int | None:
    """The address space a graded process may use, in bytes; None where there is no limit
    or a CUDA GPU (its context needs far more)."""
    if gib is None or gpu_name() is not None:
        return None
    return int(gib * 2**30)
