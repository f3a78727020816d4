"""``autograder.seal`` on its own: each route to what the checks know, tried by code compiled
as a notebook cell's in a process sealed as a grading kernel is (``tests/seal_routes.py``),
is refused, and what a learner's code may do (import a library, define a named tuple inside
a check, read its own frames outside one) is allowed. Through the real pipeline, every
chapter's attacks: tests/test_grading.py, tests/test_zh_grading.py, tests/test_attacks.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REFUSED = ["call a hidden oracle", "open a hidden oracle to itself", "build a hidden model",
           "build a check's subclass of a library class",
           "copy a hidden oracle's code", "compile under a library's file name",
           "compile under the grader's file name", "make a code object", "read a grader file",
           "read a grader file through a link", "list the garbage collector's objects",
           "read other threads' frames", "set a trace function", "start a program",
           "walk up from inside a check", "swallow the refusal inside a check",
           "call a check from inside a check"]
ALLOWED = ["import a library module", "read its own frames outside a check",
           "call a visible check from a cell", "define a named tuple inside a check",
           # what a check tells a cell that calls it is what its feedback would say anyway
           "call a hidden check"]


@pytest.fixture(scope="module", params=["as armed", "after a cell rebinds the seal's names"])
def routes(request) -> dict[str, str]:
    """Each route's outcome; the second time after a cell rebinds the seal's module names
    and a builtin its hook uses (the hook reads its own copies)."""
    extra = ["--rebound"] if request.param != "as armed" else []
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("seal_routes.py")),
                           *extra], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_route_is_tried(routes):
    assert sorted(routes) == sorted(REFUSED + ALLOWED)


@pytest.mark.parametrize("route", REFUSED)
def test_a_route_to_what_the_checks_know_is_refused(route, routes):
    assert routes[route] == "refused"


@pytest.mark.parametrize("route", ALLOWED)
def test_what_a_learners_code_may_do_is_allowed(route, routes):
    assert routes[route] == "allowed"
