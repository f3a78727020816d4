"""Warm kernels: a submission's kernel forked, inside that submission's own sandbox, from a
process that has already imported what the chapter's kernels import.

A kernel of chapters 6 to 13 spends two to three seconds of CPU importing ipykernel, torch,
Triton and the chapter's library before its first cell: most of what grading the lighter
notebooks costs, paid again for every notebook. Here it is paid once per grading process
and chapter: a *template* process imports those modules and never runs a notebook; every
kernel is a fork of it, so it starts with them loaded and with nothing any other kernel
did::

    grader ── template (chapter 9: ipykernel, torch, Triton, course.v1... loaded; no sandbox)
                 ├── joiner ── kernel      (forked; the joiner enters the submission's
                 │                          sandbox, the kernel is born in it)
                 └── joiner ── kernel ...
    nbgrader ── launcher ── bwrap ── sleep (the submission's sandbox, built as for a cold
                 │                          kernel; the sleep only holds it open)
                 └─ asks the template, over a Unix socket, for a kernel in that sandbox,
                    then becomes a shell that waits for the kernel's exit status

The sandbox is ``autograder.host.bubblewrap``'s, built by bwrap for this submission alone,
exactly as for a kernel started cold. The joiner, forked from the template, enters its
namespaces (``setns``: user where bwrap made one, mount, IPC, UTS, network, PID), drops
every capability and forks the kernel, which is thereby born in the sandbox's PID namespace,
sees only its mounts, and dies with it. The kernel takes the launcher's standard streams,
environment, working folder and address-space limit, closes every other descriptor, and runs
ipykernel as ``python -m ipykernel_launcher`` would.

What the next kernel could inherit from this one, it cannot: a module patched, a global set,
a thread left, memory filled are the kernel's own process's, gone with it, and the template
is never told of them; a file written is in the sandbox's own folders or its own ``/tmp``.
``tests/test_warm_kernels.py`` grades submissions that try each, one after another.

Only where there is no GPU driver (``course.runtime.gpu_name`` answers without torch): the
template's imports define the chapter's Triton kernels, which must be defined after Triton's
mode is chosen, and a CUDA context must not be made before a fork. Elsewhere, and wherever a
template cannot be reached, the kernel starts cold, as before.
"""

from __future__ import annotations

import array
import collections
import contextlib
import ctypes
import functools
import gc
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import NoReturn

from autograder.host import bubblewrap

__all__ = ["SETTING", "launcher_command", "preloads", "template_for"]

SETTING = "KV_COURSE_WARM_KERNELS"  # nbgrader's environment: the template's socket
_GPU_DRIVERS = ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/kfd")
_NAMESPACES = ("user", "ipc", "uts", "net", "pid", "mnt")  # user first: it grants the rest
_CLONE = {"user": 0x10000000, "ipc": 0x08000000, "uts": 0x04000000, "net": 0x40000000,
          "pid": 0x20000000, "mnt": 0x00020000}
_HOLD = ["/bin/sh", "-c", "echo ready; exec sleep infinity"]  # holds the sandbox open
_STARTED = b"started\n"  # the joiner to the launcher: the kernel is forked, in the sandbox
# What the launcher becomes once its kernel is forked: a shell (about 1 MiB, not a Python of
# about 8 MiB, for as long as the kernel runs) that reads the kernel's exit status from the
# joiner on descriptor 3 (1 where the joiner ended without telling it), ends the sandbox's
# holder ($1), and exits with it (a kernel killed by a signal: 128 + its number).
_WAIT = ('read -r status <&3 || status=1; kill -KILL "$1" 2>/dev/null; '
         '[ "$status" -lt 0 ] && status=$((128 - status)); exit "$status"')


def available() -> bool:
    """Whether kernels may be forked warm here: Linux, no GPU driver."""
    return sys.platform.startswith("linux") and not any(map(os.path.exists, _GPU_DRIVERS))


# ---------------------------------------------------------------------------- the grader's side


# What ipykernel imports as it starts a kernel, beyond ``ipykernel.kernelapp``: its kernel
# class, the debugger it builds (debugpy, about 90 ms), the shell's completer, inspector,
# history (sqlite3) and default extension. Imported in the template, a kernel's start takes
# about 25 ms instead of 150.
_KERNEL_START = ("ipykernel.kernelapp", "ipykernel.ipkernel", "ipykernel.debugger",
                 "IPython.core.completerlib", "IPython.core.debugger", "IPython.core.oinspect",
                 "IPython.extensions.storemagic", "sqlite3", "tornado.platform.asyncio")


@functools.cache
def preloads(chapter: str) -> list[str]:
    """What a kernel of ``chapter`` imports before its first cell, besides the grader's own
    modules: ipykernel, the library modules holding the chapter's answers, and every module
    its checks import at their top (torch, Triton, the library...), read from their source."""
    from autograder.table import PARTS

    modules = list(_KERNEL_START)
    parts = PARTS.get(chapter)
    if parts is None:
        return modules
    modules += sorted({place.partition(":")[0] for place in parts.answers.values()})
    for checks in (parts.checks, parts.hidden):
        modules += _top_level_imports(checks)
    return list(dict.fromkeys(m for m in modules if m.split(".")[0] != "autograder"))


# An import at a module's top starts its line; one in a function or under ``if`` is indented.
# Read with a pattern, not ``ast``: Python 3.11's parser keeps state that threads grading side
# by side would share.
_IMPORT = re.compile(r"^(?:from\s+([\w.]+)\s+import\b|import\s+([\w.]+(?:\s*,\s*[\w.]+)*))",
                     re.M)


def _top_level_imports(module: str) -> list[str]:
    from autograder.answers import module_file

    try:
        text = module_file(module).read_text(encoding="utf-8")
    except LookupError:
        return []
    found = []
    for origin, names in _IMPORT.findall(text):
        found += [origin] if origin else [name.strip() for name in names.split(",")]
    return [name for name in found if name != "__future__"]


# An import of the checks' own modules, at a module's top or in a function: ``from
# autograder.checks import _helpers, ch07_audit``, ``from autograder.hidden.ch09 import x``.
_CHECKS_IMPORT = re.compile(
    r"from\s+(autograder\.(?:checks|hidden)(?:\.\w+)?)\s+import\s+(?:\(([^)]*)\)|([^\n]*))")


@functools.cache
def checks_ahead(chapter: str) -> list[str]:
    """The files of the checks modules a kernel of ``chapter`` imports at arming (its checks,
    its hidden checks, what they import of the checks' own modules, the replay of cases),
    for its template to compile ahead (``seal.compile_ahead``): read, never imported."""
    import autograder
    from autograder.table import PARTS

    parts = PARTS.get(chapter)
    if parts is None:
        return []
    home = Path(autograder.__file__).parent
    found: set[Path] = set()
    todo = [parts.checks, parts.hidden, "autograder.checks._replay"]
    while todo:
        package, _, name = todo.pop().removeprefix("autograder.").partition(".")
        path = home / package / (f"{name}.py" if name else "__init__.py")
        if path in found or not path.is_file():  # seen, or a name a module defines
            continue
        found.add(path)
        for origin, *names in _CHECKS_IMPORT.findall(path.read_text(encoding="utf-8")):
            todo += [origin, *(f"{origin}.{name.split()[0]}" for name in "".join(names).split(",")
                               if name.strip())]
    return sorted(map(str, found))


class _Template:
    """A template process, seen from the grader."""

    def __init__(self, modules: list[str], ahead: list[str], env: dict[str, str]) -> None:
        folder = Path(tempfile.mkdtemp(prefix="kv-warm-"))  # 0700: no one else's to reach
        self.socket = folder / "template"
        # Its stdin is this pipe: the modules to import and the checks to compile, then
        # nothing until the grader is gone and the template ends. Not waited for: its socket
        # listens from here on (handed to it), so the first notebook's nbgrader starts
        # while it imports, and a kernel asked for before it is ready waits for it (a
        # template that ends unready closes the connection: that kernel starts cold).
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(str(self.socket))
            listener.listen(16)
            self.process = subprocess.Popen(
                [sys.executable, "-m", "autograder.host.warm", "template", str(self.socket),
                 str(listener.fileno())],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                env=env, cwd=folder, pass_fds=(listener.fileno(),))
        self.process.stdin.write(json.dumps({"import": modules, "compile": ahead}).encode()
                                 + b"\n")
        self.process.stdin.flush()

    def alive(self) -> bool:
        return self.process.poll() is None

    def ready(self) -> bool:
        """Wait until it has imported its modules; whether it did (it may have ended)."""
        return self.process.stdout.readline() == b"ready\n"

    def close(self) -> None:
        """End it (its stdin closed); kernels forked from it run on."""
        self.process.stdin.close()
        self.process.stdout.close()


# A few hundred MiB each where torch is loaded: a grader keeps the templates of the chapters it
# graded last, not of every chapter it met.
_KEPT = 3
_TEMPLATES: collections.OrderedDict[tuple[str, ...], _Template] = collections.OrderedDict()
_LOCK = threading.Lock()


def template_for(chapter: str, env: dict[str, str]) -> Path | None:
    """The socket of this process's template for ``chapter``'s kernels, started on first use
    (and again if it ended) with ``env`` (a kernel's: its thread count is read once, as the
    template imports torch); None where kernels are not forked warm here, or it failed."""
    if not available():
        return None
    modules, ahead = preloads(chapter), checks_ahead(chapter)
    key = (*modules, *ahead, env.get("OMP_NUM_THREADS", ""))
    with _LOCK:
        template = _TEMPLATES.get(key)
        if template is None or not template.alive():
            template = _TEMPLATES[key] = _Template(modules, ahead,
                                                           dict(env, TRITON_INTERPRET="1"))
        _TEMPLATES.move_to_end(key)
        while len(_TEMPLATES) > _KEPT:
            _TEMPLATES.popitem(last=False)[1].close()
    return template.socket if template.alive() else None


def launcher_command(socket_path: str, kernel_cmd: list[str], writable: list[Path], cwd: Path
                     ) -> list[str]:
    """The command a kernel manager starts instead of ``kernel_cmd``: a launcher that builds
    the submission's sandbox and asks the template at ``socket_path`` for the kernel in it."""
    return [sys.executable, "-m", "autograder.host.warm", "launch", socket_path, str(cwd),
            *map(str, writable), "--", *kernel_cmd]


# ---------------------------------------------------------------------------- the launcher


def launch(socket_path: str, cwd: Path, writable: list[Path], kernel_cmd: list[str]) -> NoReturn:
    """Build the sandbox, have the template fork the kernel into it, and wait for the
    kernel's status as a shell (``_WAIT``); start the kernel cold, in a sandbox of its own,
    where the template could not be asked."""
    # Killed with the process that started it (nbgrader), even when stopped: a reaper that
    # stopped it and was killed before killing it would leave it, and the sandbox, standing.
    parent = os.getppid()
    _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)
    env = {name: value for name, value in os.environ.items() if name != SETTING}
    told, tell = os.pipe()
    holder = subprocess.Popen(bubblewrap.wrap(_HOLD, writable, cwd, info=tell),
                              stdout=subprocess.PIPE, pass_fds=(tell,), env=env)
    os.close(tell)
    try:
        sandbox = bubblewrap.sandbox_pid(told)
        if holder.stdout.readline() == b"ready\n":  # bwrap has built it: the command runs
            joiner = _kernel_in(socket_path, sandbox, cwd, kernel_cmd, env)
            if joiner is not None:  # the kernel runs: wait for its status as a shell
                os.dup2(joiner.fileno(), 3)
                os.set_inheritable(3, True)  # dup2 onto itself (it was 3) leaves it as it was
                # the kernel's command after the holder's pid: unused, but what ``ps`` shows
                os.execv("/bin/sh", ["sh", "-c", _WAIT, "sh", str(holder.pid), *kernel_cmd])
    except OSError:
        pass
    holder.kill()
    holder.wait()
    cold = bubblewrap.wrap(kernel_cmd, writable, cwd)
    os.execve(cold[0], cold, env)


def _kernel_in(socket_path: str, sandbox: int, cwd: Path, kernel_cmd: list[str],
               env: dict[str, str]) -> socket.socket | None:
    """The connection to the joiner once the template forked the kernel into ``sandbox``
    (the kernel's exit status comes on it, a line, when it ends); None where no kernel was
    forked (the template could not be asked, or could not enter)."""
    memory = _address_space()
    request = json.dumps({"sandbox": sandbox, "cwd": str(cwd), "argv": kernel_cmd[3:],
                          "env": env, "memory": memory}).encode()
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(socket_path)
        connection.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                        array.array("i", [0, 1, 2]))])
        connection.shutdown(socket.SHUT_WR)
        said = b""
        while not said.endswith(b"\n"):  # a byte at a time: the status line is the shell's
            byte = connection.recv(1)
            if not byte:
                break
            said += byte
    except OSError:
        said = b""
    if said != _STARTED:  # the joiner could not enter the sandbox: no kernel was forked
        connection.close()
        return None
    return connection


def _address_space() -> int | None:
    import resource

    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    return None if limit == resource.RLIM_INFINITY else limit


# ---------------------------------------------------------------------------- the template


def template(socket_path: str, listening: int) -> None:
    """Import the modules named on stdin's first line and compile the checks it names (not
    imported: a kernel imports them sealed, at arming), say ``ready``, then fork a joiner for
    every request on the socket at ``socket_path`` (listening on descriptor ``listening``
    already: a launcher that asks while the modules load waits for them) until stdin closes
    (the grader is gone)."""
    del sys.path[0]  # this module's working folder, as ipykernel_launcher removes its own
    listener = socket.socket(fileno=listening)
    try:
        asked = json.loads(sys.stdin.buffer.readline())
        for module in asked["import"]:
            __import__(module)
        from autograder import seal

        seal.compile_ahead(asked["compile"])
        # what was imported stays out of the collector's walks, so the kernels' collections
        # do not write to (and so copy) the pages they share with the template
        gc.freeze()
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # joiners are reaped by the system
        with contextlib.suppress(BrokenPipeError):  # read only by whoever waits for it
            sys.stdout.write("ready\n")
            sys.stdout.flush()
        while select.select([listener, sys.stdin], [], [])[0] != [sys.stdin]:
            connection, _ = listener.accept()
            with connection:
                try:
                    request, streams = _receive(connection)
                except (OSError, ValueError):
                    continue
                if os.fork() == 0:
                    _join(connection, request, streams)
                for stream in streams:
                    os.close(stream)
    finally:  # stdin readable: at its end, the grader is gone (or the imports failed)
        listener.close()
        shutil.rmtree(Path(socket_path).parent, ignore_errors=True)


def _receive(connection: socket.socket) -> tuple[dict, list[int]]:
    data, streams = b"", []
    while True:
        chunk, ancillary, _, _ = connection.recvmsg(65536, socket.CMSG_SPACE(3 * 4))
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                streams += array.array("i", payload[:len(payload) - len(payload) % 4])
        if not chunk:
            break
        data += chunk
    if len(streams) != 3:
        for stream in streams:
            os.close(stream)
        raise ValueError("a request carries the kernel's three standard streams")
    return json.loads(data), streams


def _join(connection: socket.socket, request: dict, streams: list[int]) -> NoReturn:
    """The joiner: enter the sandbox, fork the kernel there, report its exit status. Where it
    cannot enter, it reports nothing, and the launcher starts the kernel cold."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _enter(request["sandbox"])
        kernel = os.fork()
        if kernel == 0:
            _kernel(request, streams)
        connection.sendall(_STARTED)
        for stream in streams:
            os.close(stream)
        _, waited = os.waitpid(kernel, 0)
        connection.sendall(f"{os.waitstatus_to_exitcode(waited)}\n".encode())
    finally:
        os._exit(0)


_PR_SET_PDEATHSIG, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS = 1, 24, 38
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _enter(pid: int) -> None:
    """Join every namespace of process ``pid`` that is not this process's own, then keep no
    capability (as bwrap leaves the sandbox's processes)."""
    libc = _libc()
    opened = {}
    for name in _NAMESPACES:
        target = f"/proc/{pid}/ns/{name}"
        if os.stat(target).st_ino != os.stat(f"/proc/self/ns/{name}").st_ino:
            opened[name] = os.open(target, os.O_RDONLY)
    for name, descriptor in opened.items():
        if libc.setns(descriptor, _CLONE[name]) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns({name}): {os.strerror(error)}")
        os.close(descriptor)
    _drop_capabilities(libc)


def _drop_capabilities(libc: ctypes.CDLL) -> None:
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for capability in range(last + 1):
        libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0)
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: none, twice 32 bits
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "no_new_privs")


def _kernel(request: dict, streams: list[int]) -> NoReturn:
    """The kernel, born in the sandbox: the launcher's streams, place, environment and
    limit, no other descriptor, then ipykernel as ``python -m ipykernel_launcher ARGV``."""
    status = 1
    try:
        os.setsid()  # bwrap's --new-session
        _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        for target, stream in enumerate(streams):
            os.dup2(stream, target)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        os.chdir(request["cwd"])
        if request["memory"]:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (request["memory"], request["memory"]))
        os.environ.clear()
        os.environ.update(request["env"])
        if "numpy.random" in sys.modules:  # its own draws, as a kernel started cold has
            sys.modules["numpy.random"].seed()  # (Python's random reseeds itself at a fork)
        sys.argv = ["ipykernel_launcher", *request["argv"]]
        from ipykernel import kernelapp

        kernelapp.launch_new_instance()
        status = 0
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(status)


if __name__ == "__main__":
    if sys.argv[1] == "template":
        template(sys.argv[2], int(sys.argv[3]))
    else:  # launch SOCKET CWD WRITABLE... -- KERNEL_CMD...
        split = sys.argv.index("--")
        launch(sys.argv[2], Path(sys.argv[3]), [Path(p) for p in sys.argv[4:split]],
               sys.argv[split + 1:])
