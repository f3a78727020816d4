"""What every chapter's checks share: calling learner code, comparing, and wording hints."""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import math
import numbers
import os
import shutil
import tempfile
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from autograder.checks import _replay
from autograder.hints import in_language

Diagnosis = tuple[Callable[..., Any], str]
"""A known wrong formula (returning None where it does not apply) and what it misses."""


class CheckFailed(AssertionError):
    """A check's verdict, shown in a notebook as the test's name and its hint, without the
    traceback through the checks (IPython asks the exception how to show itself)."""

    def __init__(self, hint: str, test: str) -> None:
        super().__init__(hint)
        self.test = test

    def _render_traceback_(self) -> list[str]:
        if os.environ.get("KV_COURSE_TRACEBACK"):
            return traceback.format_exception(self)
        return [in_language(f"{self.test} failed."), str(self),
                in_language("(For the traceback through the checks: %env KV_COURSE_TRACEBACK=1, "
                            "then run this cell again.)")]


class LearnerRaised(AssertionError):
    """The learner's code raised: the hint names the exception; a check that knows the
    scenario and the step adds them (``learner_call``)."""


def describe_call(fn: Callable[..., Any], kwargs: dict[str, Any]) -> str:
    """``name(a=1, b=2)``, the way the hint shows a call."""
    args = ", ".join(f"{k}={_short(v)}" for k, v in kwargs.items())
    return f"{getattr(fn, '__name__', 'your function')}({args})"


def not_written(name: str) -> str:
    """The hint for a TODO whose stub still raises NotImplementedError."""
    return (f"{name} is not written yet: replace `raise NotImplementedError()` in its cell "
            "with your code, run that cell, then run this test again.")


def learner_call(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` for the learner's ``name``, its exceptions turned into hints.

    A stub's NotImplementedError (also when a Triton launch wraps it) says the TODO is not
    written yet; any other exception is named with the first line of its message (Triton's
    compile errors run to pages). A failing check's AssertionError passes through.
    """
    try:
        return fn(*args, **kwargs)
    except AssertionError:
        raise
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, NotImplementedError) or "NotImplementedError" in text:
            raise AssertionError(not_written(name)) from None
        first = text.splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LearnerRaised(f"{name}(...) raised {first[:400]}") from exc


def mistakes(formulas: Iterable[Diagnosis], kwargs: dict[str, Any]) -> list[tuple[Any, str]]:
    """What each known wrong formula gives on ``kwargs`` (None where it does not apply), with
    what it misses: the ``mistakes`` of ``autograder.checks._contract.expect``."""
    found = []
    for wrong, text in formulas:
        try:
            value = wrong(**kwargs)
        except Exception:  # a wrong formula may not apply to this input (say, 1 // 0)
            value = None
        found.append((value, text))
    return found


def _settings(max_examples: int, **extra: Any) -> Any:
    """Derandomized (the same cases every run, so a grade never changes), no example database
    (nothing is written next to the notebook), one report: the shrunk, smallest failure
    (found, not shrunk, within ``verdict_only``), without hypothesis' explanation."""
    from hypothesis import HealthCheck, Phase, settings

    _keep_hypothesis_files_away()
    # no explain phase: its notes are not shown, and it traces every frame of the run
    skipped = (Phase.explain,) if _SHRINKING.get() else (Phase.shrink, Phase.explain)
    extra["phases"] = [p for p in Phase if p not in skipped]
    return settings(max_examples=max_examples, derandomize=True, database=None, deadline=None,
                    print_blob=False, report_multiple_bugs=False,
                    suppress_health_check=list(HealthCheck), **extra)


_SHRINKING = contextvars.ContextVar("shrinking", default=True)


@contextlib.contextmanager
def verdict_only() -> Iterator[None]:
    """Within: a check built on hypothesis that fails, fails on the case it first found,
    without shrinking it to the smallest (which takes most of a failing run's time). For runs
    whose failure's words nobody reads, only whether they fail: the same cases are tried, so
    the verdict is the same."""
    shrinking = _SHRINKING.set(False)
    try:
        yield
    finally:
        _SHRINKING.reset(shrinking)


def _keep_hypothesis_files_away() -> None:
    """hypothesis caches what it learns in ``.hypothesis/`` of the working folder: the
    learner's folder, or nbgrader's ``autograded/``, which ``generate_feedback`` copies into
    the learner's feedback. Unless told where (``HYPOTHESIS_STORAGE_DIRECTORY``), it goes to a
    temporary folder of this process instead, removed when the process ends."""
    if "home" not in _HYPOTHESIS and not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        from hypothesis.configuration import set_hypothesis_home_dir

        _HYPOTHESIS["home"] = tempfile.mkdtemp(prefix="kv-course-hypothesis-")
        atexit.register(shutil.rmtree, _HYPOTHESIS["home"], True)
        set_hypothesis_home_dir(_HYPOTHESIS["home"])


_HYPOTHESIS: dict[str, str] = {}  # one folder per process (mutated, never rebound: the
# grader's guard notices a rebound name)


def run_stateful(machine: type, max_examples: int, steps: int) -> None:
    """Run a hypothesis ``RuleBasedStateMachine``; a failure's hint is the smallest failing
    sequence of operations (the machine's own message), without hypothesis' report."""
    from hypothesis.stateful import get_state_machine_test, run_state_machine_as_test

    chosen = _settings(max_examples, stateful_step_count=steps)
    run_key = _replay.key("stateful", machine, max_examples, steps)
    if _replay.replayed(run_key, lambda: get_state_machine_test(machine, settings=chosen),
                        "data"):
        return
    try:
        with _replay.recording(run_key):
            run_state_machine_as_test(machine, settings=chosen)
    except AssertionError as failure:
        raise AssertionError(str(failure)) from None


def for_all(strategy: Any, check: Callable[[Any], None], max_examples: int = 150) -> None:
    """Run ``check`` on cases drawn by the hypothesis ``strategy``, which never calls the
    learner's code (a class's notebooks are handed the cases it drew: ``_replay``).

    When a case fails, hypothesis shrinks it and the hint shows the smallest failing input.
    """
    from hypothesis import given

    # ``run``'s source seeds hypothesis' derandomized draws: it stays as it is, and a
    # recording run keeps each case through ``check``
    check = _replay.keeping(check)

    @_settings(max_examples)
    @given(strategy)
    def run(case: Any) -> None:
        check(case)

    run_key = _replay.key("for_all", strategy, max_examples)
    if _replay.replayed(run_key, lambda: run, "case"):
        return
    try:
        with _replay.recording(run_key):
            run()
    except AssertionError as failure:
        raise AssertionError(str(failure)) from None  # the hint alone, not hypothesis' report


def _same(got: Any, expected: Any, rel_tol: float) -> bool:
    """Whether the learner's ``got`` is ``expected``, by the expected value's own equality:
    a learner's class whose ``==`` differs is never handed the expected value to compare
    (it could answer yes, or keep it)."""
    if isinstance(expected, numbers.Real) and not isinstance(expected, bool):
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            return False
        return math.isclose(got, expected, rel_tol=rel_tol, abs_tol=0)
    if type(got).__eq__ is not type(expected).__eq__:
        return False
    if isinstance(expected, list | tuple):
        return len(got) == len(expected) and all(
            _same(g, e, rel_tol) for g, e in zip(got, expected, strict=True))
    if isinstance(expected, dict):
        return got.keys() == expected.keys() and all(
            _same(got[key], value, rel_tol) for key, value in expected.items())
    return got == expected


def _short(value: Any) -> str:
    text = repr(value)
    if len(text) <= 80:
        return text
    size = f", {len(value)} items" if hasattr(value, "__len__") else ""
    return f"{text[:60]}...{size}"
