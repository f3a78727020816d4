"""The kernel nbgrader starts for a submission: the one process that runs learner code, alone
in the submission's sandbox.

nbgrader itself reads the submission, restores its cells, records the grades in the
gradebook and writes the graded notebook: none of that runs learner code, so it runs outside
the sandbox, and the gradebook is not in the sandbox's view. Only the kernel is confined::

    grader ── reaper ── nbgrader autograde            (the submission's limits, no sandbox;
                            │                          both forked: autograder.host.forkserver)
                            │  ZeroMQ over Unix sockets in ``scratch``
                            └── bwrap ── ipykernel   (sees: the system, the Python
                                                      environment, the course's packages,
                                                      its working folder, ``scratch``)

nbgrader is told to use this class (``c.Execute.kernel_manager_class``, written by
``autograder.host.configuration``). Its kernel speaks over Unix sockets in ``scratch``
(``transport = "ipc"``), since the sandbox has a network of its own; it is interrupted by a
message rather than a signal (the sandbox's processes are in a session of their own), as
nbgrader does when a cell runs past its time limit. Its HOME, caches and hypothesis' folder
are in ``scratch`` too. With ``sandbox`` off, the kernel starts as Jupyter starts it, still
talking over Unix sockets.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from queue import Empty
from typing import Any

import zmq.asyncio
from jupyter_client import AsyncKernelClient, AsyncKernelManager
from traitlets import Bool, DottedObjectName, Type, Unicode, default

from autograder.host import warm
from autograder.host.sandbox import confine, environment_for, private_home


class ReadyClient(AsyncKernelClient):
    """jupyter_client's client, but a kernel is ready once it has answered ``kernel_info``
    and published that request's idle status, not once IOPub has then been silent for a
    fifth of a second: a fifth of a second less for every notebook, and the same messages
    flushed, since a kernel publishes what it printed while starting (its ``exec_lines``)
    before it serves a request, on one socket, in order."""

    def _context_default(self) -> zmq.asyncio.Context:
        context = super()._context_default()
        # A socket reaching for a kernel that is not yet listening tries again every 100 ms
        # (ZeroMQ's default), and a kernel listens a few ms after it starts: each notebook
        # waited half of that on average. Again after 5 ms, then twice as long, up to 100 ms.
        context.setsockopt(zmq.RECONNECT_IVL, 5)
        context.setsockopt(zmq.RECONNECT_IVL_MAX, 100)
        return context

    async def wait_for_ready(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (math.inf if timeout is None else timeout)
        while True:
            self.kernel_info()
            if await self._answered():
                return
            # jupyter_client's own words: the grader tells a kernel that never started by them
            if not await self._async_is_alive():
                raise RuntimeError("Kernel died before replying to kernel_info")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kernel didn't respond in {timeout:.0f} seconds")

    async def _answered(self) -> bool:
        """Whether a ``kernel_info`` reply came, then its request's idle status on IOPub
        (read, with all before it); False where either did not come in time (IOPub not yet
        connected: ask again, as jupyter_client does)."""
        try:
            reply = await self.get_shell_msg(timeout=1)
            if reply["msg_type"] != "kernel_info_reply":
                return False
            request = reply["parent_header"].get("msg_id")
            while True:
                message = await self.get_iopub_msg(timeout=0.2)
                if message["msg_type"] == "status" and \
                        message["content"].get("execution_state") == "idle" and \
                        message["parent_header"].get("msg_id") == request:
                    break
        except Empty:
            return False
        self._handle_kernel_info_reply(reply)
        return True


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager whose kernel runs in a bubblewrap sandbox (``sandbox``), talked to by
    a ``ReadyClient``."""

    client_class = DottedObjectName(f"{__name__}.ReadyClient", config=True)
    client_factory = Type(ReadyClient, klass=AsyncKernelClient, config=True)

    sandbox = Bool(True, help="run the kernel in the bubblewrap sandbox").tag(config=True)
    scratch = Unicode(help="a folder of the submission's own, writable in the sandbox: the "
                      "kernel's connection file, sockets, HOME and caches (default: a "
                      "temporary folder, removed with the kernel)").tag(config=True)
    _made_scratch = False

    @default("scratch")
    def _temporary(self) -> str:
        self._made_scratch = True
        return tempfile.mkdtemp(prefix="kv-k-")

    @default("transport")
    def _ipc(self) -> str:
        return "ipc"

    @default("connection_file")
    def _in_scratch(self) -> str:
        # short: a Unix socket's path (this name, "-ipc-", a port number) must fit 107 bytes
        return str(Path(self.scratch) / f"k-{uuid.uuid4().hex[:8]}.json")

    @property
    def kernel_spec(self) -> Any:
        spec = super().kernel_spec
        if spec is not None:
            spec.interrupt_mode = "message"  # no signal reaches into the sandbox's session
        return spec

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
        scratch = Path(self.scratch)
        cwd = Path(kw.get("cwd") or os.getcwd())
        env = environment_for(kw.get("env") or dict(os.environ), [scratch])
        template = env.pop(warm.SETTING, None)
        if self.sandbox and template and kernel_cmd[:3] == [sys.executable, "-m",
                                                             "ipykernel_launcher"]:
            # forked, in the sandbox, from a template that has imported the chapter's modules
            env.update(private_home(scratch / ".home"))
            kernel_cmd = warm.launcher_command(template, kernel_cmd, [scratch, cwd], cwd)
            kw["independent"] = True
        elif self.sandbox:
            kernel_cmd = confine(kernel_cmd, cwd, [scratch, cwd], env)
            # Not told its parent: ipykernel would stop once its parent is process 1, which
            # in the sandbox's own process namespace it is from the start. bwrap ends the
            # kernel when the process that started it ends.
            kw["independent"] = True
        await super()._async_launch_kernel(kernel_cmd, **(kw | {"env": env}))

    async def _async_wait(self, pollinterval: float = 0.1) -> None:
        # jupyter_client looks every tenth of a second whether a killed kernel has ended: a
        # tenth of a second lost on most notebooks, since it seldom has at the first look
        await super()._async_wait(pollinterval=0.005)

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart)
        if self._made_scratch and not restart:
            shutil.rmtree(self.scratch, ignore_errors=True)
