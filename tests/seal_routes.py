"""Run as a script: seal this process as a grading kernel is sealed, then try each route from
code compiled as a notebook cell's, and print what became of each attempt (JSON: route ->
"refused", "allowed" or what happened). With ``--rebound``, a cell first rebinds the seal's
names and a builtin its hook uses. ``tests/test_seal.py`` reads it."""

from __future__ import annotations

import json
import sys
import textwrap

import course

course.setup(quiet=True)

from autograder import guard, seal  # noqa: E402

seal.seal()
guard.arm()  # every chapter's checks imported as arming imports them, gated

ch01 = sys.modules["autograder.checks.ch01"]
hidden = sys.modules["autograder.hidden.ch01"]
CheckFailed = sys.modules["autograder.checks._helpers"].CheckFailed

GRADER_FILE = hidden.__file__
CELL = textwrap.dedent('''
    import collections, gc, importlib, os, subprocess, sys, threading, types

    CASE = dict(num_layers=2, num_kv_heads=3, head_dim=4, bytes_per_element=2)

    def right(num_layers, num_kv_heads, head_dim, bytes_per_element):
        return 2 * num_layers * num_kv_heads * head_dim * bytes_per_element

    def walking(num_layers, num_kv_heads, head_dim, bytes_per_element):
        frame = sys._getframe(1)
        while frame is not None:
            if "expected" in frame.f_locals:
                return frame.f_locals["expected"]
            frame = frame.f_back
        return 0

    def swallowing(**case):
        try:
            sys._getframe(1).f_locals
        except BaseException:
            pass
        return right(**case)

    def nesting(**case):
        ch01.check_kv_bytes_per_token(right)
        return right(**case)

    def named_tuple_inside(**case):
        collections.namedtuple("Point", "x y")
        return right(**case)

    def thread_frames():
        return sys._current_frames()

    def reading(path):
        with open(path) as handle:
            return handle.read()
''')


def cell(source: str, namespace: dict) -> None:
    exec(compile(source, "/tmp/ipykernel_0/cell.py", "exec"), namespace)  # a notebook cell


def outcome(attempt) -> str:
    try:
        attempt()
    except seal.Sealed:
        return "refused"
    except CheckFailed as failure:
        return "refused" if "reached for what the checks know" in str(failure) else "failed"
    except Exception as error:  # noqa: BLE001 (reported, not hidden)
        return f"{type(error).__name__}: {error}"
    return "allowed"


def main() -> None:
    learner = {"ch01": ch01, "hidden": hidden, "seal": seal, "GRADER_FILE": GRADER_FILE,
               "hidden05": sys.modules["autograder.hidden.ch05"],
               "hidden11": sys.modules["autograder.hidden.ch11"]}
    cell(CELL, learner)
    if "--rebound" in sys.argv:
        cell("import builtins\nseal.LEARNER = seal.GRADER\nseal._owner_of = lambda *a: 'library'\n"
             "seal._NEVER_TO_LEARNER = {}\nbuiltins.any = lambda *a: False", dict(learner))
    run = {}

    def attempt(route: str, source: str) -> None:
        run[route] = outcome(lambda: cell(source, dict(learner)))

    attempt("call a hidden oracle", "hidden.kv_token_case(**CASE)")
    attempt("call a hidden check", "hidden.check_kv_bytes_per_token_thoroughly(right)")
    attempt("open a hidden oracle to itself", "seal.opened(hidden.kv_token_case)")
    attempt("build a hidden model", "hidden05._Model(8, 4, 4, 64, 0.0, 'recompute', 0)")
    attempt("build a check's subclass of a library class", "hidden11._OracleHalf(None, 4)")
    attempt("copy a hidden oracle's code", "types.FunctionType(hidden.kv_token_case.__code__, {})")
    attempt("compile under a library's file name",
            "compile('x = 1', os.__file__, 'exec')")
    attempt("compile under the grader's file name", "compile('x = 1', GRADER_FILE, 'exec')")
    attempt("make a code object", "right.__code__.replace(co_name='other')")
    attempt("read a grader file", "reading(GRADER_FILE)")
    attempt("read a grader file through a link",
            "import tempfile\nlink = tempfile.mktemp()\nos.symlink(GRADER_FILE, link)\n"
            "reading(link)")
    attempt("list the garbage collector's objects", "gc.get_objects()")
    attempt("read other threads' frames", "thread_frames()")
    attempt("set a trace function", "sys.settrace(lambda *a: None)")
    attempt("start a program", "subprocess.run(['cat', GRADER_FILE])")
    attempt("import a library module", "import csv, json.tool")
    attempt("read its own frames outside a check", "sys._getframe().f_back")
    attempt("call a visible check from a cell", "ch01.check_kv_bytes_per_token(right)")
    attempt("walk up from inside a check", "ch01.check_kv_bytes_per_token(walking)")
    attempt("swallow the refusal inside a check", "ch01.check_kv_bytes_per_token(swallowing)")
    attempt("call a check from inside a check", "ch01.check_kv_bytes_per_token(nesting)")
    attempt("define a named tuple inside a check",
            "ch01.check_kv_bytes_per_token(named_tuple_inside)")
    print(json.dumps(run))


if __name__ == "__main__":
    main()
    sys.stdout.flush()
