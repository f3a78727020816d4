"""Borrowed answers score zero: a TODO answered with the course's own answer fails its tests.

While a notebook is graded (``autograder.arming``), every answer of the chapter being graded
is replaced, where the library defines it, by a *tripwire*: the same function, or a stand-in
for a Triton kernel, that behaves exactly as the answer does except inside a test cell, where
it raises ``BorrowedAnswer``. Two ways a learner can borrow, and how each is caught:

* **what the checks are given is the answer**: an import or alias (``kv_bytes_per_token =
  kv_sizing.kv_bytes_per_token``, however it was reached: a module path, ``importlib``,
  ``getattr`` on the package), a method copied from the course's class, a subclass of it. Each
  check, on entry, looks at what it was given (``check_subject``): a tripwire, or a class whose
  methods include one, fails the test.
* **the learner's code calls the answer**: a wrapper, a subclass that delegates through
  ``super()``. A tripwire called in a test cell by anything but the course's own code (the
  library, the checks) fails the test.

Earlier chapters' answers are not tripwired: a notebook that builds on them uses them as the
notebook intends. Code that merely resembles the course's is not flagged; it is not looked at.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _folder(package: str) -> str:
    """A package's folder, found without importing it: Triton must not be imported before
    ``course.setup()`` has chosen its mode."""
    spec = importlib.util.find_spec(package)
    return str(Path(spec.origin).parent) + "/" if spec and spec.origin else "/nonexistent/"


# The course's own code: a tripwire may be called from here in a test (the library using its
# own answers, the checks using their oracles); from anywhere else, it was borrowed.
_OWN = tuple(_folder(package) for package in ("course", "kernels", "autograder"))
# A kernel is launched by the course's launchers (kernels/) and Triton itself: who launched it
# is the first caller outside them.
_LAUNCHERS = (_folder("kernels"), _folder("triton"))

_STATE = {"in_test": False}


class BorrowedAnswer(BaseException):
    """A TODO's answer is the course's own. A BaseException, so that ``except Exception`` in
    a learner's code cannot swallow it."""

    def _render_traceback_(self) -> list[str]:  # IPython shows the message alone
        return [str(self)]


def _message(name: str) -> str:
    from autograder.hints import in_language

    return in_language(f"This test does not count: the code it checks uses the course's own "
                       f"{name}. Write this TODO yourself; earlier chapters' functions you may "
                       "use as the notebook says.")


def _refuse_if_borrowed(name: str, launched: bool = False) -> None:
    """In a test, raise ``BorrowedAnswer`` unless the tripwire ``name`` was called by the
    course's own code. A kernel's caller (``launched``) is whoever launched it: the first
    caller outside the course's launchers and Triton."""
    if not _STATE["in_test"]:
        return
    caller = sys._getframe(2)  # 0: here, 1: the tripwire, 2: its caller
    while launched and caller is not None and caller.f_code.co_filename.startswith(_LAUNCHERS):
        caller = caller.f_back
    if caller is None or not caller.f_code.co_filename.startswith(_OWN):
        raise BorrowedAnswer(_message(name))


# tripwire -> the answer it stands for: for the hidden checks alone (a notebook cell that names
# the grader is not graded), which lend the course's version of one TODO to grade another
_ORIGINALS: dict[int, Callable] = {}


def course_version(value: Any) -> Any:
    """The course's own answer behind a tripwire; ``value`` itself where it is none. For the
    grader's code alone: the learner's code that calls it is refused (``autograder.seal``)."""
    (lambda __kv_gate__="kv-course gate": None).__code__  # noqa: B018 (autograder.seal)
    return _ORIGINALS.get(id(value), value)


class _KernelTripwire:
    """A Triton kernel's stand-in: ``kernel[grid](...)`` launches it, except in a test."""

    def __init__(self, original: Any, name: str) -> None:
        self._original, self.__kv_tripwire__ = original, name
        self.__name__ = getattr(getattr(original, "fn", original), "__name__", name)
        _ORIGINALS[id(self)] = original

    def __getitem__(self, grid: Any) -> Callable:
        launch = self._original[grid]

        def launched(*args: Any, **kwargs: Any) -> Any:
            _refuse_if_borrowed(self.__kv_tripwire__, launched=True)
            return launch(*args, **kwargs)

        return launched

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Called from inside another kernel (the interpreter runs kernels as Python): that
        kernel is the caller, so a learner's kernel that calls the course's is borrowing."""
        _refuse_if_borrowed(self.__kv_tripwire__, launched=True)
        return self._original(*args, **kwargs)


def tripwire(original: Any, name: str) -> Any:
    """A stand-in for ``original`` (a function, a method or a Triton kernel), named ``name``
    in the message a borrowed use gets."""
    if not inspect.isfunction(original):
        return _KernelTripwire(original, name)

    def stand_in(*args: Any, **kwargs: Any) -> Any:
        _refuse_if_borrowed(name)
        return original(*args, **kwargs)

    for attribute in ("__name__", "__qualname__", "__doc__", "__module__"):
        setattr(stand_in, attribute, getattr(original, attribute))
    stand_in.__kv_tripwire__ = name  # no __wrapped__: the original is not handed out
    _ORIGINALS[id(stand_in)] = original
    return stand_in


def _unwrapped(value: Any) -> Any:
    """What a C-level wrapper (``functools.partial``, a cache, a bound method) calls."""
    for _ in range(20):
        inner = getattr(value, "func", None) or getattr(value, "__func__", None) or \
            getattr(value, "__wrapped__", None)
        if inner is None or inspect.isclass(value):
            return value
        value = inner
    return value


def borrowed(subject: Any) -> str | None:
    """The name of the course's answer that ``subject`` (what a check is given) is or holds:
    a tripwire (also inside a partial, a cache or a bound method), or a class whose methods
    resolve to one (copied in, or inherited and not overridden); None when it holds none."""
    values = ((inspect.getattr_static(subject, name, None) for name in dir(subject))
              if inspect.isclass(subject) else [subject])
    for value in values:
        for layer in (value, _unwrapped(value)):  # a class is no tripwire, nor looked into
            name = getattr(layer, "__kv_tripwire__", None)
            if isinstance(name, str) and not inspect.isclass(layer):
                return name
    return None


def check_subject(*subjects: Any) -> None:
    """Fail the test when what a check was given is the course's own answer."""
    for subject in subjects:
        name = borrowed(subject)
        if name is not None:
            raise BorrowedAnswer(_message(name))


def entering_test() -> None:
    _STATE["in_test"] = True


def leaving_test() -> None:
    _STATE["in_test"] = False
