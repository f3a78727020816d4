"""What every chapter's checks share: calling learner code, comparing, and wording hints."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable
from typing import Any

Diagnosis = tuple[Callable[..., Any], str]
"""A known wrong formula (returning None where it does not apply) and what it misses."""


def describe_call(fn: Callable[..., Any], kwargs: dict[str, Any]) -> str:
    """``name(a=1, b=2)``, the way the hint shows a call."""
    args = ", ".join(f"{k}={_short(v)}" for k, v in kwargs.items())
    return f"{getattr(fn, '__name__', 'your function')}({args})"


def call(fn: Callable[..., Any], **kwargs: Any) -> Any:
    """Call the learner's ``fn``, turning its exceptions into hints."""
    try:
        return fn(**kwargs)
    except NotImplementedError:
        raise AssertionError(
            f"{getattr(fn, '__name__', 'this function')} is not written yet: replace "
            "`raise NotImplementedError()` in its cell with your code, run that cell, "
            "then run this test again."
        ) from None
    except Exception as exc:
        raise AssertionError(
            f"{describe_call(fn, kwargs)} raised {type(exc).__name__}: {exc}"
        ) from exc


def expect_equal(
    fn: Callable[..., Any],
    kwargs: dict[str, Any],
    expected: Any,
    idea: str,
    diagnoses: Iterable[Diagnosis] = (),
    rel_tol: float = 1e-9,
) -> None:
    """Assert ``fn(**kwargs) == expected`` (numbers within ``rel_tol``).

    On failure the hint names the call, the expected and returned values, the idea, and, when
    the returned value matches a known wrong formula in ``diagnoses``, what that formula misses.
    """
    got = call(fn, **kwargs)
    if _same(got, expected, rel_tol):
        return
    message = f"{describe_call(fn, kwargs)} returned {_short(got)}, expected {_short(expected)}. "
    likely = [text for wrong, text in diagnoses if _matches(got, wrong, kwargs, rel_tol)]
    if len(likely) == 1:
        message += likely[0] + " "
    elif likely:  # several known mistakes give this value on this input: name them all
        message += "Perhaps: " + " Or: ".join(likely) + " "
    raise AssertionError(message + idea)


def _matches(got: Any, wrong: Callable[..., Any], kwargs: dict[str, Any], rel_tol: float) -> bool:
    try:
        value = wrong(**kwargs)
    except Exception:  # a wrong formula may not apply to this input (say, 1 // 0)
        return False
    return value is not None and _same(got, value, rel_tol)


def _same(got: Any, expected: Any, rel_tol: float) -> bool:
    if isinstance(expected, numbers.Real) and not isinstance(expected, bool):
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            return False
        return math.isclose(got, expected, rel_tol=rel_tol, abs_tol=0)
    return got == expected


def _short(value: Any) -> str:
    text = repr(value)
    if len(text) <= 80:
        return text
    size = f", {len(value)} items" if hasattr(value, "__len__") else ""
    return f"{text[:60]}...{size}"
