"""``python -m course doctor``: is this environment ready for the course, and if not, why.

In the open course that means what a learner, a grader and the tests need (``make setup``);
in a learner edition (``course/edition.json``, written by the edition's build) only what the
edition's notebooks need: no grader, no sandbox, no JupyterLab on Colab, and fixes that exist
there."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

EDITION = Path(__file__).with_name("edition.json")

_INSTALL = "pip install -e '.[dev]' (or run `make setup` in the course folder)"
_INSTALL_EDITION = ("pip install the edition's wheel (paged_kv_course-*.whl), or "
                    "`pip install .` in the edition's folder")


@dataclass
class Finding:
    name: str
    detail: str
    ok: bool
    fix: str = ""
    needed: bool = True  # False: reported with its fix, but the course works without it


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def edition() -> dict | None:
    """What this learner edition holds (its chapters, the answers revealed); None in the
    open course."""
    return json.loads(EDITION.read_text()) if EDITION.exists() else None


def _package(
    name: str, dist: str, minimum: tuple[int, ...], probe: Callable[[], None] | None = None,
    install: str = _INSTALL
) -> Finding:
    version = _version(dist)
    if version is None:
        return Finding(name, "not installed", False, install)
    if _as_tuple(version) < minimum:
        wanted = ".".join(map(str, minimum))
        return Finding(name, f"{version} (the course needs {wanted} or newer)", False,
                       f"pip install -U '{dist}>={wanted}'")
    try:
        importlib.import_module(dist)
        if probe:
            probe()
    except Exception as exc:  # report, don't crash: this is a diagnostic
        return Finding(name, f"{version}, but it fails: {type(exc).__name__}: {exc}", False,
                       f"pip install --force-reinstall '{dist}'")
    return Finding(name, version, True)


def _as_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def _triton_interpreter_runs() -> None:
    """Run a three-element vector add under the interpreter, in a fresh process."""
    script = (
        "import torch, triton, triton.language as tl\n"
        "@triton.jit\n"
        "def add(x, y, out, n, BLOCK: tl.constexpr):\n"
        "    i = tl.arange(0, BLOCK)\n"
        "    m = i < n\n"
        "    tl.store(out + i, tl.load(x + i, mask=m) + tl.load(y + i, mask=m), mask=m)\n"
        "x = torch.arange(3.0); out = torch.empty(3)\n"
        "add[(1,)](x, x, out, 3, BLOCK=4)\n"
        "assert out.tolist() == [0.0, 2.0, 4.0], out\n"
    )
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr else "no output")


def _mode() -> Finding:
    try:
        from course.runtime import detect

        runtime = detect()
    except Exception as exc:
        return Finding("mode", f"unknown: {type(exc).__name__}: {exc}", False,
                       "install torch first (see torch above)")
    return Finding("mode", runtime.description, True)


def _sandbox() -> Finding:
    """Whether grading will run each notebook in its bubblewrap sandbox. Learners do not need
    it (only grading does, and then refuses to grade without it unless told --sandbox off),
    so it is never counted as a problem."""
    # asked of the grader in a process of its own: the library imports nothing of the grader
    try:
        asked = subprocess.run([sys.executable, "-m", "autograder.host.bubblewrap"],
                               capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Finding("sandbox", f"unknown: the grader did not answer ({exc})", False,
                       "pip install -e '.[grader]'", needed=False)
    reason = None if asked.returncode == 0 else asked.stdout.strip() or "it did not say why"
    if reason is None:
        return Finding("sandbox", "grading runs each notebook in a bubblewrap sandbox", True)
    return Finding("sandbox", f"grading cannot sandbox notebooks: {reason}", False,
                   "until then, `python -m autograder grade` and `grade-all` stop before "
                   "grading unless told --sandbox off (unsandboxed)", needed=False)


def _grading() -> Finding:
    """Whether the grader earns full marks on chapter 1's own solution here, with the default
    limits (sandboxed where bwrap works), as ``grade`` and ``grade-all`` check before they
    grade (``autograder.host.proof``; cached, so a second doctor costs little)."""
    try:
        asked = subprocess.run([sys.executable, "-m", "autograder.host.proof"],
                               capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Finding("grading", f"unknown: the grader did not answer ({exc})", False,
                       "pip install -e '.[grader]'")
    said = (asked.stdout.strip() or asked.stderr.strip() or "it did not say why").splitlines()
    if asked.returncode == 0:
        return Finding("grading", said[-1], True)
    return Finding("grading", f"the grader cannot grade here: {said[-1]}", False,
                   "until then, `python -m autograder grade` and `grade-all` grade nothing")


def _jupyterlab_for_a_learner() -> Finding:
    """A learner edition's notebooks run in JupyterLab or on Colab (which brings its own
    front end): JupyterLab is reported, never counted as a problem."""
    found = _package("jupyterlab", "jupyterlab", (4, 2), install="pip install jupyterlab")
    if not found.ok:
        found.fix += " (to run the notebooks on this machine; Colab needs nothing)"
        found.needed = False
    return found


def diagnose() -> list[Finding]:
    """Every finding, in the order doctor prints them."""
    held = edition()
    in_edition = held is not None
    install = _INSTALL_EDITION if in_edition else _INSTALL
    findings = [Finding("python", platform.python_version(), sys.version_info >= (3, 10),
                        "use Python 3.10 or newer")]
    if held is not None:
        numbers = ", ".join(name[:2] for name in held["chapters"]) or "none"
        revealed = ", ".join(map(str, held["revealed"])) or "none"
        findings.insert(0, Finding("edition", f"learner edition: chapters {numbers}; the "
                                   f"course's answers to {revealed} included", True))
    findings.append(_package("torch", "torch", (2, 3), install=install))
    if sys.platform == "linux":
        findings.append(_package("triton", "triton", (3, 0), _triton_interpreter_runs,
                                 install))
    else:
        findings.append(Finding("triton", f"not available on {sys.platform}", False,
                                "Triton ships for Linux only: use Linux, WSL2 or Colab"))
    findings.append(_package("numpy", "numpy", (1, 26), install=install))
    if in_edition:
        findings.append(_jupyterlab_for_a_learner())
    else:
        findings += [_package("nbgrader", "nbgrader", (0, 9, 5)),
                     _package("jupyterlab", "jupyterlab", (4, 2))]
    findings += [
        _package("ipywidgets", "ipywidgets", (8, 1), install=install),
        _package("plotly", "plotly", (5, 20), install=install),
        _mode(),
    ]
    if not in_edition:  # grading is not part of a learner edition
        findings += [_sandbox(), _grading()]
    return findings


def main() -> int:
    findings = diagnose()
    width = max(len(f.name) for f in findings)
    for f in findings:
        mark = "ok " if f.ok else "BAD" if f.needed else "-- "
        print(f"{mark}  {f.name:<{width}}  {f.detail}")
        if not f.ok:
            print(f"     {'':<{width}}  fix: {f.fix}")
    problems = sum(not f.ok and f.needed for f in findings)
    print("ready for the course" if not problems else f"{problems} problem(s) found")
    return 1 if problems else 0
