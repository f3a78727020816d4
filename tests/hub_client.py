"""A class's JupyterHub on loopback for tests/test_hub.py, driven as its people would drive it.

`hub/launch.py` starts the hub in a temporary state folder. People log in through the hub's
login form with their password and ask the hub for an API token of their own; the class's
admin token (from the hub's settings) adds learners and starts servers. Everything a person
does on their server goes through the hub's proxy: commands in a terminal of their own
JupyterLab (the terminals API and its WebSocket, as a learner types `nbgrader submit`), and
notebooks saved through the contents API (as JupyterLab saves them).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
PROXY = REPO / "hub" / "node_modules" / ".bin" / "configurable-http-proxy"
ANSI = re.compile(r"\x1b(\[[0-9;?]*[A-Za-z]|\([A-Z])")


def missing() -> str | None:
    """Why a hub cannot start here, in one line; None when it can."""
    try:
        import jupyterhub  # noqa: F401
        import requests  # noqa: F401
    except ImportError:
        return "JupyterHub is not installed (`pip install -e '.[hub]'`; `make test` does)"
    if not PROXY.exists():
        return "JupyterHub's proxy is not installed (`npm ci --prefix hub`; `make test` does)"
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Person:
    """Someone logged in to the hub, with an API token they asked the hub for."""

    hub: Hub
    name: str
    token: str
    terminal: str = ""

    @property
    def server(self) -> str:
        return f"{self.hub.url}/user/{self.name}"

    def _headers(self) -> dict:
        return {"Authorization": f"token {self.token}"}

    def run(self, command: str, timeout: float = 300) -> str:
        """Type ``command`` into a terminal of this person's JupyterLab; its output. Raises
        AssertionError when it exits non-zero."""
        import requests

        if not self.terminal:
            made = requests.post(f"{self.server}/api/terminals", headers=self._headers(),
                                 timeout=30)
            made.raise_for_status()
            self.terminal = made.json()["name"]
        status, output = asyncio.run(self._type(command, timeout))
        assert status == 0, f"{self.name}$ {command}\nexit {status}\n{output}"
        return output

    async def _type(self, command: str, timeout: float) -> tuple[int, str]:
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        # The terminal replays what it showed before on every connection: a fresh mark tells
        # this command's end (the echoed command line shows `$?`, not a number).
        mark = uuid.uuid4().hex
        url = f"{self.server.replace('http', 'ws', 1)}/terminals/websocket/{self.terminal}"
        socket_ = await websocket_connect(HTTPRequest(url, headers=self._headers()))
        try:
            # wide enough that the shell never wraps the command line it echoes
            await socket_.write_message(json.dumps(["set_size", 50, 2000]))
            await socket_.write_message(json.dumps(["stdin", f'{command}; echo "{mark} $?"\r']))
            seen, deadline = "", time.monotonic() + timeout
            while not (done := re.search(rf"{mark} (\d+)\r?\n", seen)):
                try:
                    message = await asyncio.wait_for(socket_.read_message(),
                                                     deadline - time.monotonic())
                except asyncio.TimeoutError:
                    raise AssertionError(f"{self.name}$ {command}: no end in {timeout} s\n"
                                         f"{ANSI.sub('', seen)[-4000:]}") from None
                assert message is not None, f"{self.name}'s terminal closed:\n{seen}"
                kind, *content = json.loads(message)
                if kind == "stdout":
                    seen += content[0]
        finally:
            socket_.close()
        output = seen[seen.rfind(f'echo "{mark} $?"'):done.start()]
        return int(done.group(1)), ANSI.sub("", output)

    def save(self, path: str, notebook: nbformat.NotebookNode) -> None:
        """Save ``notebook`` at ``path`` (relative to the home folder), as JupyterLab does."""
        import requests

        saved = requests.put(f"{self.server}/api/contents/{path}", headers=self._headers(),
                             json={"type": "notebook", "format": "json", "content": notebook},
                             timeout=30)
        assert saved.status_code in (200, 201), saved.text


@dataclass
class Hub:
    """A running hub: its public URL, state folder and settings (hub.json)."""

    url: str
    state: Path
    settings: dict
    process: subprocess.Popen = field(repr=False)
    left_running: list[int] = field(default_factory=list)

    def api(self, method: str, path: str, **kwargs):
        """A call to the hub's REST API with the class's admin token."""
        import requests

        admin = {"Authorization": f"token {self.settings['admin_token']}"}
        answer = requests.request(method, f"{self.url}/hub/api{path}", headers=admin,
                                  timeout=30, **kwargs)
        assert answer.ok, f"{method} {path}: {answer.status_code} {answer.text}"
        return answer.json() if answer.content else None

    def log_in(self, name: str, password: str) -> Person | None:
        """Log in through the login form and ask for a token; None when the hub refuses."""
        import requests

        with requests.Session() as browser:
            browser.get(f"{self.url}/hub/login", timeout=30).raise_for_status()
            form = {"username": name, "password": password, "_xsrf": browser.cookies["_xsrf"]}
            answer = browser.post(f"{self.url}/hub/login", data=form, allow_redirects=False,
                                  timeout=30)
            if answer.status_code != 302:
                return None
            # the login cookie authenticates API calls from the page, with its XSRF token
            xsrf = {"X-XSRFToken": browser.cookies.get("_xsrf", path="/hub/")}
            token = browser.post(f"{self.url}/hub/api/users/{name}/tokens", headers=xsrf,
                                 json={"note": "tests/test_hub.py", "expires_in": 3600},
                                 timeout=30)
            assert token.status_code == 201, token.text
            return Person(self, name, token.json()["token"])

    def start_servers(self, names: list[str], timeout: float = 180) -> None:
        """Start these users' servers (all at once) and wait until each is ready."""
        for name in names:
            self.api("POST", f"/users/{name}/server")
        deadline = time.monotonic() + timeout
        waiting = set(names)
        while waiting:
            assert self.process.poll() is None, "the hub stopped"
            assert time.monotonic() < deadline, f"servers not ready: {sorted(waiting)}"
            waiting = {n for n in waiting
                       if not self.api("GET", f"/users/{n}")["servers"].get("", {}).get("ready")}
            time.sleep(0.5)


def processes_of(state: Path) -> list[int]:
    """Every process that belongs to the hub in ``state``: the hub and its proxy carry the state
    folder in their environment, and each user's server and whatever it starts carry a home
    inside it."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if str(state).encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:  # gone, or not ours to read
                continue
    return found


@contextmanager
def running_hub(tmp: Path, chapters: str) -> Iterator[Hub]:
    """A hub for a class of ``chapters`` with its state and exchange in ``tmp``. On the way out
    it is stopped as Ctrl-C stops it (SIGINT to `hub/launch.py`, which JupyterHub replaced);
    whatever of it still runs 30 s later is listed in ``left_running``, then killed."""
    import requests

    state, log = tmp / "state", tmp / "hub.log"
    port = _free_port()
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [sys.executable, str(REPO / "hub" / "launch.py"), "--state", str(state),
             "--exchange", str(tmp / "exchange"), "--port", str(port), "--chapters", chapters],
            stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    hub = None
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, f"the hub stopped:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"the hub did not start:\n{log.read_text()}"
            try:
                if requests.get(f"{url}/hub/api/", timeout=5).ok:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(0.5)
        hub = Hub(url, state, json.loads((state / "hub.json").read_text()), process)
        yield hub
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        deadline = time.monotonic() + 30
        while (left := processes_of(state)) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        if hub is not None:
            hub.left_running = left
