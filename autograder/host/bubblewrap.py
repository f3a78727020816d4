"""The view a submission's grading runs in: a bubblewrap sandbox (``bwrap``, Linux namespaces).

The view is built from explicit binds, so whatever is not named here does not exist inside:

* read-only: the system (``/usr`` with the ``/bin``, ``/lib*``, ``/sbin`` links; ``/etc``),
  the Python environment (``sys.prefix``, ``sys.base_prefix`` and the interpreter's folder)
  and the course's own packages (``course``, ``kernels``, ``autograder``, found beside this
  package, not on the working folder's path: in an editable install they live in the
  checkout, of which nothing else is bound);
* writable, at their own paths: only the folders the caller names (a kernel's working folder
  and its scratch folder; the crash probe's copy of a notebook);
* its own: an empty ``/tmp`` (a capped tmpfs), a minimal ``/dev`` (null, zero, random,
  tty, shm; with a GPU, ``/dev/nvidia*`` and a read-only ``/sys``, which the CUDA driver
  reads), and ``/proc`` of its own PID namespace, with ``/proc/sys`` read-only.

So the home folders, ``/root``, ``/work``, ``/srv``, ``/mnt``, the host's other ``/tmp``
folders (the grader's scratch, the other learners' copies, a pytest run's class), the
grader's working folder, the class's gradebook, state file, feedback and uploads are not
there, wherever they are, unless they sit inside one of the read-only paths above.

It also gets its own PID namespace (it sees no process outside, and when its first process
ends, the kernel kills every process left in it), network namespace (a loopback of its own,
nothing else), IPC and UTS namespaces, a session of its own (no typing into the grader's
terminal), no capabilities (run as root, bwrap would otherwise leave them: the process could
remount the read-only binds writable), and it is killed when the grader dies.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

# this project's packages: the notebooks import them, and so do the reaper and crash probe
PACKAGES = ("course", "kernels", "autograder")
_SYSTEM = ("/usr", "/bin", "/lib", "/lib32", "/lib64", "/libx32", "/sbin", "/etc")
# tmpfs lives in memory that no address-space limit counts: cap what /tmp and /dev/shm hold
_TMPFS_BYTES = 1 << 30
INSTALL = "apt-get install bubblewrap"


def readable() -> list[Path]:
    """The host paths bound read-only, parents before children, none inside another."""
    paths = [Path(p) for p in _SYSTEM if os.path.lexists(p)]
    found = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable))]
    # beside this package: a folder of the same name in the working folder (a class's course
    # directory called ``course``) would shadow an editable install's finder
    home = Path(__file__).resolve().parents[2]
    found += [str(home / name) for name in PACKAGES if (home / name / "__init__.py").exists()]
    for path in found:  # as named (what the processes use) and where links lead
        paths += [Path(os.path.abspath(path)), Path(path).resolve()]
    kept: list[Path] = []
    for path in sorted(set(paths), key=lambda p: (len(p.parts), str(p))):
        if not any(path.is_relative_to(parent) for parent in kept if not parent.is_symlink()):
            kept.append(path)
    return kept


def arguments(writable: Sequence[Path], cwd: Path) -> list[str]:
    """bwrap's options for a sandbox in which ``writable`` (absolute folders) can be written
    and the command starts in ``cwd``."""
    args = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    # bwrap mounts in the order given, a later mount over an earlier one: the sandbox's own
    # /tmp first, so that a read-only path inside the host's /tmp (a project cloned there,
    # its virtual environment) is bound over it, not hidden under it
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(_TMPFS_BYTES),
             "--tmpfs", "/dev/shm", "--size", str(_TMPFS_BYTES), "--tmpfs", "/tmp"]
    for path in readable():
        if path.is_symlink():  # merged /usr: /bin -> usr/bin, kept a link inside
            args += ["--symlink", os.readlink(path), str(path)]
        else:
            args += ["--ro-bind", str(path), str(path)]
    # /proc/sys read-only: a process of uid 0 (a grader run as root) may write the host's
    # sysctls even without capabilities, and bwrap leaves them writable there
    args += ["--ro-bind", "/proc/sys", "/proc/sys"]
    # A GPU's device files (nvidia0..., nvidiactl, nvidia-uvm, nvidia-caps/), and /sys
    # read-only, where the CUDA driver reads the PCI topology. Not yet run on a GPU.
    gpus = sorted(glob.glob("/dev/nvidia*"))
    for device in gpus:
        args += ["--dev-bind", device, device]
    if gpus:
        args += ["--ro-bind", "/sys", "/sys"]
    for path in writable:  # after /tmp: a submission's folders usually sit in the host's /tmp
        args += ["--bind", str(path), str(path)]
    # the sandbox's own root (a tmpfs holding the mount points) read-only: nothing to fill there
    args += ["--remount-ro", "/", "--chdir", str(cwd)]
    return args


def wrap(command: list[str], writable: Sequence[Path], cwd: Path, info: int | None = None
         ) -> list[str]:
    """``command`` run by bwrap in the sandbox; raises ``RuntimeError`` (saying what to
    install) where there is no bwrap. With ``info`` (a descriptor bwrap inherits), bwrap
    writes there the sandbox's first process (``sandbox_pid``)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise RuntimeError(f"bwrap is not installed ({INSTALL})")
    told = [] if info is None else ["--info-fd", str(info)]
    return [bwrap, *told, *arguments([Path(os.path.abspath(p)) for p in writable],
                                     Path(os.path.abspath(cwd))), "--", *command]


def sandbox_pid(info: int) -> int:
    """The sandbox's first process, as this process numbers it, read from the descriptor
    ``info`` whose other end bwrap was given (``wrap(..., info=...)``); closes it."""
    text = b""
    with os.fdopen(info, "rb", buffering=0) as told:
        while chunk := told.read(4096):  # read up to the object's end: the sandbox may keep
            text += chunk                # its copy of the descriptor open
            with contextlib.suppress(ValueError):
                return json.loads(text)["child-pid"]
    raise OSError(f"bwrap told nothing of its sandbox ({text!r})")


@functools.cache
def probe() -> str | None:
    """None where the sandbox can be made here (tried once, for real, with ``true``); else
    why not, in a few words, with what to install."""
    if not sys.platform.startswith("linux"):
        return f"bubblewrap needs Linux, and this is {sys.platform}"
    try:
        done = subprocess.run(wrap(["true"], [], Path("/")), capture_output=True, text=True,
                              timeout=60)
    except RuntimeError as missing:
        return str(missing)
    except (OSError, subprocess.TimeoutExpired) as failed:
        return f"bwrap does not run here ({failed})"
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return (f"bwrap cannot make the sandbox here ({said}): it needs unprivileged user "
                f"namespaces, or root ({INSTALL} for a working bwrap)")
    return None


if __name__ == "__main__":  # `python -m autograder.host.bubblewrap`: can grading sandbox here?
    why_not = probe()
    print(why_not or "ok")
    sys.exit(0 if why_not is None else 1)
