"""The notebooks' helpers: charts, animations, demonstrations and cases in its modules, and
here what every notebook cell that runs the learner's own code uses to choose it when ready.

A picture or experiment in a chapter runs the learner's function. When that is not written
yet, or disagrees with the course's own version, the course's version draws it instead, and
the cell says so in one line. In a class's learner edition the course's version of a chapter
not yet revealed is not there (it raises ``NotImplementedError``); then ``learner_or_course``
returns a stand-in, and a cell that ``needs`` it stops at once with one line saying what to
finish (``NotReady``; such cells carry the ``raises-exception`` tag, so Run All goes on).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from course.language import tr

_GRADED = {"now": False}


def grading() -> bool:
    """True while the notebook is being graded: animations and heavy plots skip themselves.
    The grader says so before the notebook's first cell (``being_graded``)."""
    return _GRADED["now"]


def being_graded() -> None:
    """Called by the grader in a graded notebook's kernel, before its first cell."""
    _GRADED["now"] = True


class NotReady(Exception):
    """A cell needs a TODO that is not finished; shown as its one-line message."""

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of a traceback
        return [str(self)]


class _StandIn:
    """What ``learner_or_course`` returns when neither version can run yet."""

    def __init__(self, why: str) -> None:
        self.why = why

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotReady(self.why)


def needs(*functions: Any) -> None:
    """Stop this cell, with one line saying what to finish, if any of ``functions`` is a
    stand-in for an unfinished TODO."""
    for function in functions:
        if isinstance(function, _StandIn):
            raise NotReady(function.why)


def learner_or_course(
    learner: Callable[..., Any], course: Callable[..., Any], **probe: Any
) -> Callable[..., Any]:
    """The learner's function if it runs on ``probe`` (and agrees with the course's version
    there, where this edition has one); else the course's version, where there is one; else
    a stand-in that ``needs`` turns into one line saying what to finish. Prints one line
    saying which, and why."""
    name = getattr(learner, "__name__", "your function")
    return _choose(learner, course, _attempt(learner, probe), _attempt(course, probe),
                   name, tr(f"{name} (its TODO above)"), tr("is not written yet"),
                   tr("its test cell"))


def learner_or_course_probed(learner: Callable[..., Any], course: Callable[..., Any],
                             probe: Callable[[Callable[..., Any]], Any]) -> Any:
    """``learner_or_course`` judged on what ``probe(fn)`` gives (a value to compare, each call
    building its own engine, pool or requests): the learner's function, the course's, or the
    stand-in."""

    def probing(fn: Callable[..., Any]) -> Callable[[], Any]:
        def probed() -> Any:
            return probe(fn)

        probed.__name__ = getattr(learner, "__name__", "your function")
        return probed

    mine, ours = probing(learner), probing(course)
    chosen = learner_or_course(mine, ours)
    return learner if chosen is mine else course if chosen is ours else chosen


def learner_or_course_class(learner: type, course: type, probe: Callable[[type], Any]) -> Any:
    """``learner_or_course`` for a class built up over several TODOs. ``probe(cls)`` plays a
    short scenario on a fresh instance of ``cls`` and returns what it observed, in terms any
    correct class reports alike (never which free block it happened to pick)."""
    name = learner.__name__
    return _choose(learner, course, _attempt(functools.partial(probe, learner), {}),
                   _attempt(functools.partial(probe, course), {}), name,
                   tr(f"your {name} (its TODOs above)"),
                   tr("is not finished yet (a method raises NotImplementedError)"),
                   tr("its test cells"))


def _choose(learner: Any, course: Any, mine: Any, ours: Any, name: str, todo: str,
            unfinished: str, tests: str) -> Any:
    """The learner's version, the course's or a stand-in, from what each did on the probe."""
    if mine is _NOT_READY:
        if ours is _NOT_READY:
            return _StandIn(tr(f"Finish {todo} to see this."))
        print(tr(f"Note: {name} {unfinished}, so the course's own version draws this."))
        return course
    if isinstance(mine, _Raised):
        if ours is _NOT_READY:
            return _StandIn(tr(f"Your {name} raised {mine} here: fix it (see {tests}) to see "
                                "this."))
        print(tr(f"Note: your {name} raised {mine}, so the course's own version draws this."))
        return course
    if ours is _NOT_READY or isinstance(ours, _Raised):
        print(tr(f"Using your {name} (whether it is right: see {tests})."))
        return learner
    if not _same(mine, ours):
        print(tr(f"Note: your {name} disagrees with the course's own version here (see "
                 f"{tests}), so the course's own version draws this."))
        return course
    print(tr(f"Using your {name}."))
    return learner


_NOT_READY = object()


class _Raised:
    def __init__(self, exc: Exception) -> None:
        self.text = f"{type(exc).__name__} ({exc})"

    def __str__(self) -> str:
        return self.text


def _attempt(fn: Callable[..., Any], probe: dict[str, Any]) -> Any:
    try:
        return fn(**probe)
    except NotImplementedError:
        return _NOT_READY
    except Exception as exc:
        return _Raised(exc)


def _same(a: Any, b: Any) -> bool:
    """Equal values: tensors within float tolerance, field by field inside dataclasses,
    lists, tuples and dicts."""
    if hasattr(a, "shape") and hasattr(b, "shape"):
        import torch

        return a.shape == b.shape and bool(torch.allclose(a.double(), b.double(), atol=1e-4,
                                                          rtol=1e-3, equal_nan=True))
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(_same(getattr(a, f.name), getattr(b, f.name))
                                           for f in dataclasses.fields(a))
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)
