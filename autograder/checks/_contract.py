"""One case of a function TODO, checked against its whole contract (chapters 1 and 2).

``expect`` calls the learner's function once and reports, in this order, the first thing that
breaks: what it raised or returned against what was expected (the one known mistake that
gives this value, else the idea), then the type the TODO promises (``7168.0`` is not the
``int`` 7168). A function whose own stub still raises is told so. Otherwise, before any of
that is shown, an earlier TODO the function may build on is tried on the same input
(``Earlier``): when that one is wrong or unwritten, the hint says to fix it first, since the
later test cannot pass before it does.

Expected values come from the hidden module through ``private``, asked before the learner's
code runs; nothing here computes an answer.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from autograder.checks._helpers import _same, _short, describe_call, not_written


@dataclass(frozen=True)
class Raises:
    """The expected outcome of a case that must raise ``error``."""

    error: type[BaseException]


@dataclass(frozen=True)
class Promise:
    """The type a TODO promises, in words, and a test of a returned value (None: kept)."""

    words: str
    broken: Callable[[Any], str | None]

    def __call__(self, value: Any) -> str | None:
        return self.broken(value)


def _whole(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    return type(value).__name__


INT = Promise("an int", lambda v: None if _whole(v) else f"a {_kind(v)}")
TUPLE_OF_INTS = Promise(
    "a tuple of two int",
    lambda v: (f"a {_kind(v)}" if not isinstance(v, tuple)
               else next((f"its item {i} is a {_kind(x)}" for i, x in enumerate(v)
                          if not _whole(x)), None)))
LIST_OF_INTS = Promise(
    "a list of int",
    lambda v: (f"a {_kind(v)}" if not isinstance(v, list)
               else next((f"its item {i} is a {_kind(x)}" for i, x in enumerate(v)
                          if not _whole(x)), None)))


@dataclass(frozen=True)
class Earlier:
    """An earlier TODO ``name`` that the function checked may call, and what it must give on
    ``kwargs`` (a value, or ``Raises``), with the type it promises."""

    name: str
    kwargs: dict[str, Any]
    expected: Any
    promise: Promise | None = None


def expect(fn: Callable[..., Any], kwargs: dict[str, Any], expected: Any, idea: str,
           known: Iterable[tuple[Any, str]] = (), rel_tol: float = 1e-9,
           promise: Promise | None = None, earlier: Iterable[Earlier] = ()) -> None:
    """Assert ``fn(**kwargs)`` gives ``expected`` (a value, or ``Raises``) of the promised
    type; on failure, raise AssertionError with a hint (see the module's doc)."""
    failure = _verdict(fn, kwargs, expected, idea, list(known), rel_tol, promise)
    if failure is None:
        return
    if isinstance(failure, _OwnStub):
        raise AssertionError(failure)  # its own stub first, whatever it builds on
    raise AssertionError(_blame_earlier(fn, kwargs, list(earlier)) or failure)


def _verdict(fn: Callable[..., Any], kwargs: dict[str, Any], expected: Any, idea: str,
             known: list[tuple[Any, str]], rel_tol: float, promise: Promise | None
             ) -> str | None:
    call = describe_call(fn, kwargs)
    wanted = f"it to raise {expected.error.__name__}" if isinstance(expected, Raises) \
        else _short(expected)
    try:
        got = fn(**kwargs)
    except NotImplementedError as exc:
        written = not_written(getattr(fn, "__name__", "this function"))
        return _OwnStub(written) if _raised_by(fn, exc) else written
    except Exception as exc:
        if isinstance(expected, Raises) and isinstance(exc, expected.error):
            return None
        return f"{call} raised {type(exc).__name__}: {exc}; expected {wanted}. {idea}"
    if isinstance(expected, Raises):
        return f"{call} returned {_short(got)}, expected {wanted}. {idea}"
    kind = promise(got) if promise is not None else None
    if kind is not None and isinstance(expected, list | tuple) \
            and not isinstance(got, type(expected)):  # an array is no list: say so first
        return f"{call} returned {_short(got)}, {kind}; it promises {promise.words}."
    if not _equal(got, expected, rel_tol):
        likely = [text for value, text in known
                  if value is not None and _equal(got, value, rel_tol)]
        # the one known mistake that gives this value; where this input cannot tell two
        # apart, both (the visible cases are chosen so that the first failure tells)
        said = " Or: ".join(likely) if likely else idea
        if len(likely) > 1:
            said = "Perhaps: " + said
        return f"{call} returned {_short(got)}, expected {_short(expected)}. {said}"
    if kind is not None:
        return f"{call} returned {_short(got)}, {kind}; it promises {promise.words}."
    return None


class _OwnStub(str):
    """The hint for a function whose own stub raised NotImplementedError (not one it calls)."""


def _raised_by(fn: Callable[..., Any], exc: BaseException) -> bool:
    """Whether ``exc`` was raised in ``fn``'s own code, rather than in a function it called."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code is getattr(fn, "__code__", None)


def _equal(got: Any, expected: Any, rel_tol: float) -> bool:
    if isinstance(expected, list | tuple):
        return (isinstance(got, type(expected)) and len(got) == len(expected)
                and all(_same(g, e, rel_tol) for g, e in zip(got, expected, strict=True)))
    return bool(_same(got, expected, rel_tol))


def _blame_earlier(fn: Callable[..., Any], kwargs: dict[str, Any], earlier: list[Earlier]
                   ) -> str | None:
    """The hint when an earlier TODO that ``fn``'s notebook defines is unwritten or wrong on
    the input that broke ``fn``; None when each one found is right (or none is found)."""
    namespace = getattr(fn, "__globals__", {})
    for before in earlier:
        other = namespace.get(before.name)
        if not callable(other) or other is fn:
            continue
        call = describe_call(fn, kwargs)
        verdict = _verdict(other, before.kwargs, before.expected, "", [], 1e-9, before.promise)
        if verdict is None:
            continue
        if verdict == not_written(getattr(other, "__name__", before.name)):
            return (f"{call} cannot pass yet: {before.name}, which it may build on, is not "
                    f"written. Write {before.name} first, then run this test again.")
        return (f"{call} cannot pass yet: {verdict.strip()} Fix {before.name} first (its own "
                "test says why), then run this test again.")
    return None


def expect_cases(fn: Callable, cases: list[dict], ask: Callable, idea: str | Callable,
                 rel_tol: float = 1e-9, promise: Promise | None = None,
                 earlier: Callable[[dict], list[Earlier]] | None = None) -> None:
    """``fn`` on each case (its keyword arguments); ``ask(**case)`` gives the expected value
    (or ``Raises``) and the values known mistakes give; ``idea`` may depend on the case;
    ``earlier(case)``, the earlier TODOs ``fn`` may build on, with what they must give.
    Every question is asked before the learner's code runs."""
    asked = [(case, *ask(**case), idea(case) if callable(idea) else idea,
              earlier(case) if earlier else []) for case in cases]
    for case, expected, known, why, before in asked:
        expect(fn, case, expected, why, known, rel_tol=rel_tol, promise=promise,
               earlier=before)
