"""One bug costs one TODO: a test of a TODO (visible or hidden), rerun with the course's own
versions of the TODOs it builds on where the learner's fails it.

    learner's class ──check──> passes: full marks
        │ fails
        v
    the same class, the TODOs it builds on lent from the course ──check──> passes: the bug is
        │ fails                                        in a TODO lent, whose own test costs it
        v
    the learner's own failure, shrunk to its smallest case: this TODO's bug

A TODO written as a function calls the earlier TODOs by their names in the notebook's
namespace: ``one_bug_one_todo_of_function`` lends by running a copy of the learner's function
whose global names of those TODOs are the course's (a helper of the learner's own that calls
them is not reached).

Both runs of a class see the TODOs the notebook defines after the test (a test runs where its cell
stands) as the course's: their absence is no one's bug.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from autograder.borrowing import course_version
from autograder.checks._helpers import verdict_only


def one_bug_one_todo(check: Callable[[type], None], cls: type, course: type,
                     todos: Iterable[str], others: Iterable[str],
                     companions: Mapping[str, Iterable[str]] | None = None) -> None:
    """``check`` on ``cls``; where it fails, again with ``course``'s version of the methods
    ``others`` (the TODOs the checked method builds on, each with its ``companions``: given
    methods that must come from the same hand, say one way of keying blocks). Fails, with the
    learner's own failure, only where both fail. ``todos`` are every TODO method of the class:
    those ``cls`` lacks are the course's in both runs."""

    def course_method(name: str):
        return course_version(inspect.getattr_static(course, name))

    later = {name: course_method(name) for name in todos if not hasattr(cls, name)}
    own_class = type(cls.__name__, (cls,), later) if later else cls
    try:
        with verdict_only():  # whether it fails; shrunk only if the learner is to read it
            check(own_class)
    except AssertionError:
        lent = {}
        for name in others:
            for method in (name, *(companions or {}).get(name, ())):
                lent[method] = course_method(method)
        try:
            with verdict_only():
                check(type(cls.__name__, (own_class,), lent))
        except AssertionError as failed_with_lent:
            check(own_class)  # the same cases again, shrunk: the learner reads the smallest
            raise failed_with_lent from None


def with_globals(fn: Callable, lent: Mapping[str, Any]) -> Callable:
    """A copy of the function ``fn`` that finds the names ``lent`` as given, every other
    global name as ``fn`` does (the notebook's namespace); a call of ``fn`` by its own name
    (a wrapper that calls itself for another dtype) reaches the copy, lent names and all."""
    namespace = {**fn.__globals__, **lent}
    copy = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__,
                              fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    if fn.__globals__.get(fn.__name__) is fn:
        namespace[fn.__name__] = copy
    return copy


def one_bug_one_todo_of_function(check: Callable[[Callable], None], fn: Callable,
                                 course: Mapping[str, Any]) -> None:
    """``check`` on the learner's function ``fn``; where it fails, again on ``fn`` with the
    earlier TODOs it calls (``course``: name -> the course's answer) lent. Fails, with the
    learner's own failure, only where both fail. A callable that is not a plain function (a
    class, a ``functools.partial``) is checked as it is."""
    if not isinstance(fn, types.FunctionType):
        check(fn)
        return
    try:
        with verdict_only():
            check(fn)
    except AssertionError:
        lent = {name: course_version(value) for name, value in course.items()}
        try:
            with verdict_only():
                check(with_globals(fn, lent))
        except AssertionError as failed_with_lent:
            check(fn)
            raise failed_with_lent from None
