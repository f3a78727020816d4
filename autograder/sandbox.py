"""Running a grading process under a submission's limits, leaving nothing behind.

Every command that executes learner code (nbgrader's autograde, the crash probe) runs here:
in its own process group, under ``autograder.reaper`` (so nothing it starts survives it, in
any session or group), with an address-space limit on CPU-only machines, its share of the
cores, hypothesis' files in the submission's own folder, and a time limit.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path


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


_GRACE = 30  # seconds the reaper gets to clean up after its own deadline


def run(command: list[str], cwd: Path, timeout: int, limits: Limits) -> str:
    """Run ``command`` in ``cwd`` under ``limits`` for at most ``timeout`` seconds; return its
    output (stdout and stderr). Raises ``TimeoutExpired`` when time ran out; either way,
    every process it started is gone when this returns."""
    env = dict(os.environ)
    # nbgrader calls `alembic` and starts kernels by name: this environment's bin comes first.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if limits.threads and "OMP_NUM_THREADS" not in env:  # a setting of the user's wins
        env["OMP_NUM_THREADS"] = str(limits.threads)
    # hypothesis keeps a folder of its own: in the submission's folder, deleted with it
    env["HYPOTHESIS_STORAGE_DIRECTORY"] = str(cwd / ".hypothesis-storage")
    reaped = [sys.executable, "-m", "autograder.reaper", str(timeout), "--", *command]
    # output goes to a file, not a pipe: a process that escaped could hold a pipe open
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as output:
        process = subprocess.Popen(reaped, cwd=cwd, env=env, stdout=output,
                                   stderr=subprocess.STDOUT, start_new_session=True,
                                   preexec_fn=_memory_limit(limits.memory_gib))
        try:
            process.wait(timeout=timeout + _GRACE)
        except subprocess.TimeoutExpired:  # the reaper itself hung: end its whole group
            _kill_group(process.pid)
            process.wait()
            raise subprocess.TimeoutExpired(command, timeout, output=_read(output)) from None
        _kill_group(process.pid)
        log = _read(output)
    if process.returncode == 124:  # the reaper's deadline
        raise subprocess.TimeoutExpired(command, timeout, output=log)
    return log


def _read(output) -> str:
    output.seek(0)
    return output.read()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _memory_limit(gib: float | None):
    """A function that caps the address space of the process it runs in (and of its
    children); None where there is no limit or a CUDA GPU (its context needs far more)."""
    if gib is None or _has_cuda():
        return None
    limit = int(gib * 2**30)

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
