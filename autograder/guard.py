"""Keeping a notebook's own code from switching off the checks that grade it.

A learner's cells run in the same Python process as the test cells, so they could replace a
check (``ch01.check_x = lambda f: None``), patch what checks rely on (``torch.allclose =
lambda *a, **k: True``) or swap a checks module in ``sys.modules``. Two defences:

1. ``arm()`` runs when the grading kernel starts, before the notebook's first cell
   (``autograder.arming``). It imports every checks module and records the identity of
   everything in them and of the library functions and builtins they use. ``verify()``, the
   first line of every test cell (restored from the source), raises ``AssertionError``
   naming anything that changed since, so the test scores zero.
2. The grader's own process reads the submitted source before any of it runs: a cell the
   learner wrote or changed that mentions the grader, the gradebook or ``sys.modules``, or
   rebinds builtins, is reported, and the notebook scores zero (``autograder.host.flagging``).

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
import sys

_RECORD: dict[str, int] | None = None
_MODULES: list[str] = []  # the checks modules recorded (mutated, never rebound)
_BUILTINS: list[str] = []  # the builtins their source names (the same)
_OWN_STATE = ("_RECORD", "_MODULES", "_BUILTINS")  # what arming writes: not watched

# Builtins the kernel itself rebinds around each cell it runs (ipykernel's ``input``,
# IPython's ``exit``, ``quit``, ``display`` and ``get_ipython``): never the learner's doing.
_REBOUND_PER_CELL = frozenset({"input", "exit", "quit", "display", "get_ipython"})


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


def _builtins_named(modules: list[str]) -> list[str]:
    """The builtins the checks' source names (``len``, ``isinstance``, ``AssertionError``...),
    read from the modules' files."""
    from autograder.seal import names_read

    names = set().union(*(names_read(sys.modules[module].__file__) for module in modules))
    return sorted(names & set(vars(builtins)) - _REBOUND_PER_CELL)


def _watched(modules: list[str]) -> dict[str, object]:
    """Everything whose replacement would change what a check concludes, by a stable name:
    the builtins the checks name, the library functions they compare with, and every
    attribute of the checks modules."""
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
        module = importlib.import_module(module_name)  # sys.modules' entry, if it has one
        watched[f"sys.modules[{module_name}]"] = sys.modules.get(module_name)
        for attribute, value in vars(module).items():
            if not attribute.startswith("__") and attribute not in _OWN_STATE:
                watched[f"{module_name}.{attribute}"] = value
    return watched


def arm(chapter: str | None = None) -> None:
    """Record what the checks of ``chapter`` (every chapter's, when None) rely on: once per
    kernel, before any learner code runs."""
    global _RECORD
    if _RECORD is None:
        _MODULES.extend(_checks_of(chapter))
        _BUILTINS.extend(_builtins_named(_MODULES))
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
