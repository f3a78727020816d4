"""Keeping a notebook's own code from switching off the checks that grade it.

A learner's cells run in the same Python process as the test cells, so they could replace a
check (``ch01.check_x = lambda f: None``), patch what checks rely on (``torch.allclose =
lambda *a, **k: True``) or swap a checks module in ``sys.modules``. Two defences:

1. ``arm()`` runs when the grading kernel starts, before the notebook's first cell
   (``autograder.arming``). It imports every checks module and records the identity of
   everything in them and of the library functions and builtins they use. ``verify()``, the
   first line of every test cell (restored from the source), raises ``AssertionError``
   naming anything that changed since, so the test scores zero.
2. ``suspicious_code`` runs in the grader's own process on the submitted source: a cell the
   learner wrote or changed that mentions the grader, the gradebook or ``sys.modules``, or
   rebinds builtins, is reported, and the notebook scores zero
   (``autograder.autograde.flagged_line``).

Limits, stated plainly: code running in the grading kernel can always defeat in-process
checks with enough effort (for example by patching this module before ``verify`` runs). These
defences stop the direct ways; for a hostile class, grade inside a container or as an
unprivileged user, and read the notebooks these defences flag.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.util
import math
import pkgutil
import re
import sys

_RECORD: dict[str, int] | None = None
_MODULES: list[str] = []  # the checks modules recorded (mutated, never rebound)

_BUILTINS = ("isinstance", "len", "all", "any", "getattr", "setattr", "hasattr", "id", "sorted",
             "abs", "max", "min", "sum", "range", "zip", "repr", "str", "float", "int", "list",
             "dict", "set", "tuple", "type", "print", "AssertionError", "Exception")


def _checks_of(chapter: str | None) -> list[str]:
    """The checks modules a graded chapter's test cells use (every chapter's when the chapter
    is not known), imported; with what they import of the other checks."""
    import autograder.checks as package
    from autograder.table import PARTS

    if chapter in PARTS:
        names = [PARTS[chapter].checks, PARTS[chapter].hidden]
    else:
        names = [f"autograder.checks.{m.name}" for m in pkgutil.iter_modules(package.__path__)]
        if importlib.util.find_spec("autograder.hidden") is not None:
            import autograder.hidden as hidden

            names += [f"autograder.hidden.{m.name}"
                      for m in pkgutil.iter_modules(hidden.__path__)]
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:  # a learner edition has no hidden checks
            continue
    return sorted(name for name in sys.modules
                  if name.startswith(("autograder.checks.", "autograder.hidden.")))


def _watched(modules: list[str]) -> dict[str, object]:
    """Everything whose replacement would change what a check concludes, by a stable name:
    the builtins and library functions checks compare with, and every attribute of the
    checks modules."""
    watched: dict[str, object] = {f"builtins.{name}": getattr(builtins, name)
                                  for name in _BUILTINS}
    watched["math.isclose"] = math.isclose
    if "torch" in sys.modules:  # the chapter's checks compare tensors
        torch = sys.modules["torch"]
        for name in ("allclose", "equal", "isclose", "isnan", "testing"):
            watched[f"torch.{name}"] = getattr(torch, name)
        watched["torch.testing.assert_close"] = torch.testing.assert_close
        watched["torch.Tensor.__eq__"] = torch.Tensor.__eq__
    for module_name in ["autograder.guard", "autograder.private", *modules]:
        module = sys.modules.get(module_name) or importlib.import_module(module_name)
        watched[f"sys.modules[{module_name}]"] = sys.modules.get(module_name)
        for attribute, value in vars(module).items():
            if not attribute.startswith("__") and attribute not in ("_RECORD", "_MODULES"):
                watched[f"{module_name}.{attribute}"] = value
    return watched


def arm(chapter: str | None = None) -> None:
    """Record what the checks of ``chapter`` (every chapter's, when None) rely on: once per
    kernel, before any learner code runs."""
    global _RECORD
    if _RECORD is None:
        _MODULES.extend(_checks_of(chapter))
        _RECORD = {name: id(value) for name, value in _watched(_MODULES).items()}


def verify() -> None:
    """Raise ``AssertionError`` when anything recorded by ``arm()`` was replaced; do nothing
    when the guard was never armed (a learner running the notebook, not the grader)."""
    if _RECORD is None:
        return
    from autograder.borrowing import entering_test

    entering_test()  # until the next cell starts, the course's answers may not be borrowed
    now = {name: id(value) for name, value in _watched(_MODULES).items()}
    changed = sorted(name for name, ident in _RECORD.items() if now.get(name) != ident)
    if changed:
        from autograder.hints import in_language

        raise AssertionError(in_language(
            "This test does not count: code in this notebook replaced what the checks use "
            f"({', '.join(changed[:5])}). Remove it."))


_SUSPICIOUS = re.compile(
    r"\bautograder\b|\bnbgrader\b|\bbuiltins\b|__builtins__|sys\.modules|gradebook")


def suspicious_code(source: str) -> str | None:
    """The first line of ``source`` that reaches for the grader or rebinds builtins, if any."""
    for line in source.splitlines():
        code = line.split("#", 1)[0]
        if _SUSPICIOUS.search(code):
            return line.strip()
    return None
