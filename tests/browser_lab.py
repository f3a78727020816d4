"""A JupyterLab server and a Chromium page for the browser tests (see tests/test_browser.py).

The server runs on loopback from a temporary folder holding copies of the notebooks (JupyterLab
autosaves what it runs; the repository's notebooks stay clean), with its own config, runtime,
settings and workspace folders. The browser may reach that server and nothing else: every other
request is refused and recorded, and a test fails if one was attempted (the course must work
offline).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--disable-dev-shm-usage"]
# what a page may load (Playwright routes HTTP requests; the kernel's WebSocket is not routed)
LOOPBACK = ("http://127.0.0.1:", "data:", "blob:")


def chromium() -> str | None:
    """The Chromium to drive: ``$CHROMIUM``, else ``chromium`` on the PATH."""
    return os.environ.get("CHROMIUM") or shutil.which("chromium")


def missing() -> str | None:
    """Why the browser tests cannot run here, in one line; None when they can."""
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (`pip install -e '.[dev]'`)"
    if chromium() is None:
        return "no Chromium found (`apt-get install -y chromium`, or set CHROMIUM)"
    return None


def require_browser() -> None:
    """Skip the calling fixture's tests, saying why, where Chromium or Playwright is missing;
    in CI (``CI`` set) fail instead, so that they never pass by not running."""
    import pytest

    reason = missing()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"browser tests cannot run in CI: {reason}")
        pytest.skip(f"browser tests need Chromium and Playwright: {reason}")


def keep_on_loopback(context) -> list[str]:
    """Let ``context``'s pages reach loopback only; return the list each refused URL joins."""
    refused: list[str] = []

    def only_loopback(route) -> None:
        if route.request.url.startswith(LOOPBACK):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    context.route("**/*", only_loopback)
    return refused


@dataclass
class Lab:
    """A running JupyterLab: its URL, token and the folder it serves."""

    url: str
    token: str
    root: Path
    process: subprocess.Popen = field(repr=False)

    def notebook_url(self, path: str, ui: str = "lab") -> str:
        """``path`` in JupyterLab (opened alone: ``reset`` drops the tabs earlier tests left in
        the workspace) or, with ``ui="notebook"``, in Notebook 7."""
        if ui == "notebook":
            return f"{self.url}/notebooks/{path}?token={self.token}"
        return f"{self.url}/lab/tree/{path}?token={self.token}&reset"

    def shut_down_kernels(self) -> None:
        """End every session, so that kernels do not pile up from test to test."""
        for session in json.loads(self._call("GET", "/api/sessions")):
            self._call("DELETE", f"/api/sessions/{session['id']}")

    def _call(self, method: str, path: str) -> bytes:
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.read()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def jupyter_lab(root: Path, timeout: float = 90) -> Iterator[Lab]:
    """Serve ``root`` with JupyterLab on a free loopback port until the block ends."""
    port, token = _free_port(), "browser-test"
    state = root / ".jupyter-state"
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(state / "config"),
               JUPYTER_RUNTIME_DIR=str(state / "runtime"))
    env.pop("NBGRADER_EXECUTION", None)  # learners run these notebooks, not the grader
    news = (state / "settings" / "@jupyterlab" / "apputils-extension"
            / "notification.jupyterlab-settings")
    news.parent.mkdir(parents=True)
    news.write_text(json.dumps({"fetchNews": "false"}))  # no "get news?" toast over the pictures
    log = open(state.with_suffix(".log"), "w")  # noqa: SIM115 (closed below)
    process = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root",
         "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         f"--LabApp.user_settings_dir={state / 'settings'}",
         f"--LabApp.workspaces_dir={state / 'workspaces'}",
         # window.jupyterapp, in both front ends: run commands, read notebook models
         "--LabApp.expose_app_in_browser=True",
         "--JupyterNotebookApp.expose_app_in_browser=True"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    lab = Lab(f"http://127.0.0.1:{port}", token, root, process)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{lab.url}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("JupyterLab did not start: "
                                       + state.with_suffix(".log").read_text()[-2000:]) from None
                time.sleep(0.3)
        yield lab
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


# The open notebook's code cells, read from its model (not the DOM, which JupyterLab renders
# lazily): execution count, tags, grade id, errors, text printed, and MIME types shown.
_CELLS_JS = """() => {
  const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  if (!panel || !panel.content || !panel.content.model) {
    return {path: null, cells: [], kernel: 'none'};
  }
  const cells = [];
  for (const cell of panel.content.model.cells) {
    if (cell.type !== 'code') continue;
    const outputs = cell.outputs.toJSON();
    cells.push({
      count: cell.executionCount,
      grade_id: (cell.getMetadata('nbgrader') || {}).grade_id || null,
      errors: outputs.filter(o => o.output_type === 'error').map(o => o.ename + ': ' + o.evalue),
      text: outputs.filter(o => o.output_type === 'stream').map(o => [].concat(o.text).join('')),
      mimes: outputs.flatMap(o => Object.keys(o.data || {})),
    });
  }
  const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
  // a kernel reads idle before its connection is up; only a connected one runs cells
  const status = !kernel ? 'none' : kernel.connectionStatus !== 'connected'
    ? kernel.connectionStatus : kernel.status;
  return {path: panel.context.path, cells, kernel: status};
}"""


def run_all(page, lab: Lab, path: str, timeout: float = 300, ui: str = "lab") -> list[dict]:
    """Open ``path`` (in JupyterLab, or Notebook 7 with ``ui="notebook"``), wait for its
    kernel, Run All, and wait until every code cell has run.

    Returns the code cells' state (see ``_CELLS_JS``). Test cells carry the ``raises-exception``
    tag, so a failing test does not stop Run All, as it does not for a learner.
    """
    page.goto(lab.notebook_url(path, ui))
    deadline = time.monotonic() + 90
    while (state := page.evaluate(_CELLS_JS))["path"] != path or state["kernel"] != "idle":
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not open with an idle kernel (open: {state['path']}, "
                               f"kernel {state['kernel']})")
        time.sleep(0.3)
    page.evaluate("window.jupyterapp.commands.execute('runmenu:run-all')")
    deadline = time.monotonic() + timeout
    while True:
        state = page.evaluate(_CELLS_JS)
        if state["kernel"] == "idle" and all(c["count"] for c in state["cells"]):
            return state["cells"]
        if time.monotonic() > deadline:
            waiting = [i for i, c in enumerate(state["cells"]) if not c["count"]]
            raise TimeoutError(f"{path}: code cells {waiting} had not run after {timeout:.0f} s "
                               f"(kernel {state['kernel']})")
        time.sleep(0.5)
