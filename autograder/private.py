"""What a visible check may not ship, and how it still runs where that is missing.

Visible checks (``autograder.checks.chNN``) ship to learners. Whatever would answer a TODO
lives in the chapter's hidden module (``autograder.hidden.chNN``, the grader's alone): the
oracles that compute expected values, the models that say what a class should hold, the known
mistakes a hint names. A visible check reaches them through ``private("NN")``:

    open course        the hidden module itself
    recording          the hidden module, every call and attribute read written down
    learner edition    a replay of those recordings: the same answers to the same questions

Recordings are made when a learner edition is built, by running its visible checks on the
course's own answer (``record``). A call is known by the visible check it runs in, what it
asks (a function's dotted path on the module, or a model instance's method or attribute), its
arguments, and how many times that exact question was asked before in the same run of the
check; a check asks the same questions in the same order whatever the learner wrote, up to
the point where it fails. So visible checks must never pass the learner's objects (or
anything computed from them) to ``private``, and must ask what a hint needs before they
know whether it will be needed.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import fractions
import functools
import hashlib
import importlib
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autograder.borrowing import check_subject
from autograder.checks._helpers import CheckFailed
from autograder.hints import in_language
from autograder.seal import CHECK_ENDED, CHECK_STARTED
from autograder.table import parts_of
from course.language import tr_later

RECORDED = Path(__file__).resolve().parent / "checks" / "recorded"

_STATE: dict[str, Any] = {"scope": None, "counts": {}, "recorder": None}


class NotRecorded(AssertionError):
    """A visible check asked, in the learner edition, a question no recording answers."""


def visible(check: Callable) -> Callable:
    """Mark a visible check: every question it asks ``private`` is numbered from its start,
    and what it is given must not be the course's own answer (``autograder.borrowing``)."""

    @functools.wraps(check)
    def run(*args: Any, **kwargs: Any) -> Any:
        (lambda __kv_gate__="kv-course entry": None).__code__  # noqa: B018 (autograder.seal)
        outer = _STATE["scope"], _STATE["counts"]
        _STATE["scope"], _STATE["counts"] = f"{check.__module__}.{check.__name__}", {}
        try:
            return _verdict(check, args, kwargs, tr_later("visible test"))
        finally:
            _STATE["scope"], _STATE["counts"] = outer

    return run


def _verdict(check: Callable, args: tuple, kwargs: dict, kind: str) -> Any:
    """Run ``check``, unless what it is given is the course's own answer; its failure becomes
    a ``CheckFailed`` that names the TODO's test. While a notebook is graded, a check in
    which the learner's code reached for what the checks know fails as it ends
    (``autograder.seal``), whatever the learner's code did next."""
    check_subject(*args)
    sys.audit(CHECK_STARTED)
    try:
        return check(*args, **kwargs)
    except CheckFailed:
        raise
    except AssertionError as failure:
        todo = check.__name__.removeprefix("check_").removesuffix("_thoroughly")
        chapter = check.__module__.rpartition(".ch")[2][:2]  # autograder.checks.ch03
        raise CheckFailed(in_language(str(failure), chapter=chapter),
                          in_language(f"The {kind} of {todo}")) from failure
    finally:
        sys.audit(CHECK_ENDED)


def thorough(check: Callable) -> Callable:
    """Mark a hidden check: what it is given must not be the course's own answer."""

    @functools.wraps(check)
    def run(*args: Any, **kwargs: Any) -> Any:
        (lambda __kv_gate__="kv-course entry": None).__code__  # noqa: B018 (autograder.seal)
        return _verdict(check, args, kwargs, tr_later("hidden test"))

    return run


def private(number: str) -> Any:
    """Chapter ``number``'s hidden module, or what stands in for it (see the module's doc)."""
    if _STATE["recorder"] is not None:
        return _STATE["recorder"].module(number)
    recording = RECORDED / f"ch{number}.pkl"
    if recording.exists():
        return _replay(recording)
    return importlib.import_module(parts_of(number).hidden)


# --- questions and their keys ----------------------------------------------------------------


def _canonical(value: Any) -> Any:
    """A hashable, process-independent description of an argument."""
    if isinstance(value, _Instance):
        return ("instance", value._name)
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return (type(value).__name__, repr(value))
    if isinstance(value, fractions.Fraction):
        return ("Fraction", str(value))
    if isinstance(value, enum.Enum):
        return ("enum", type(value).__qualname__, value.name)
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(_canonical(v) for v in value))
    if isinstance(value, set | frozenset):
        return ("set", tuple(sorted(repr(_canonical(v)) for v in value)))
    if isinstance(value, dict):
        return ("dict", tuple((repr(_canonical(k)), _canonical(v)) for k, v in value.items()))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__qualname__, tuple(
            (f.name, _canonical(getattr(value, f.name))) for f in dataclasses.fields(value)))
    if hasattr(value, "detach") and hasattr(value, "dtype"):  # a tensor
        import torch

        data = value.detach().cpu().contiguous()
        digest = hashlib.sha256(data.view(-1).view(torch.uint8).numpy().tobytes())
        return ("tensor", str(data.dtype), tuple(data.shape), digest.hexdigest())
    raise TypeError(f"a visible check passed {type(value).__name__} to a private question; "
                    "only data built by the check itself may be passed")


def _key(path: str, args: tuple, kwargs: dict) -> tuple:
    question = (path, _canonical(args), _canonical(dict(sorted(kwargs.items()))))
    asked = _STATE["counts"].get(question, 0)
    _STATE["counts"][question] = asked + 1
    return (_STATE["scope"] or "", repr(question), asked)


# --- recording -------------------------------------------------------------------------------


class _Instance:
    """A model instance that a private question returned, as visible code sees it."""

    def __init__(self, name: str, ask: Callable[[str, tuple, dict, bool], Any]) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_ask", ask)

    def __getattr__(self, attribute: str) -> Any:
        return self._ask(f"{self._name}::{attribute}", (), {}, True)

    def __setattr__(self, attribute: str, value: Any) -> None:
        raise TypeError("visible checks read private models; they never change them")


class _Method:
    """A private function, or a model's method: asked when called."""

    def __init__(self, ask: Callable[[str, tuple, dict, bool], Any], path: str) -> None:
        self.ask, self.path = ask, path

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.ask(self.path, args, kwargs, False)


class _Module:
    def __init__(self, ask: Callable[[str, tuple, dict, bool], Any]) -> None:
        self._ask = ask

    def __getattr__(self, name: str) -> _Method:
        return _Method(self._ask, name)


class Recorder:
    """Runs hidden modules for visible checks and writes down every answer."""

    def __init__(self) -> None:
        self.answers: dict[str, dict[tuple, Any]] = {}
        self.objects: dict[str, Any] = {}

    def module(self, number: str) -> _Module:
        hidden = importlib.import_module(parts_of(number).hidden)
        answers = self.answers.setdefault(number, {})

        def ask(path: str, args: tuple, kwargs: dict, attribute: bool) -> Any:
            key = _key(path, args, kwargs)
            target = self._target(hidden, path)
            if attribute and callable(target) and not isinstance(target, type):
                answers[key] = ("method", None)  # a model's method: asked when called
                return _Method(ask, path)
            if not attribute and not callable(target):
                raise TypeError(f"{path} is not a function: visible checks ask private "
                                "questions by calling functions")
            value = target if attribute else target(*self._live(args), **self._live(kwargs))
            if _is_hidden_object(value):
                name = f"{key[0]}|{path}#{key[2]}"
                self.objects[name] = value
                answers[key] = ("instance", name)
                return _Instance(name, ask)
            answers[key] = ("value", _frozen(value))
            return copy.deepcopy(value)

        return _Module(ask)

    def _target(self, hidden: Any, path: str) -> Any:
        if "::" in path:
            name, attribute = path.rsplit("::", 1)
            return getattr(self.objects[name], attribute)
        return getattr(hidden, path)

    def _live(self, value: Any) -> Any:
        """Arguments with model instances as the hidden module made them."""
        if isinstance(value, _Instance):
            return self.objects[value._name]
        if isinstance(value, list | tuple):
            return type(value)(self._live(v) for v in value)
        if isinstance(value, dict):
            return {k: self._live(v) for k, v in value.items()}
        return value

    def save(self, folder: Path) -> list[Path]:
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        for number, answers in sorted(self.answers.items()):
            path = folder / f"ch{number}.pkl"
            path.write_bytes(pickle.dumps(answers, protocol=4))
            written.append(path)
        return written


def _is_hidden_object(value: Any) -> bool:
    module = type(value).__module__ or ""
    return module.startswith("autograder.hidden.") and not isinstance(value, type)


def _frozen(value: Any) -> Any:
    try:
        frozen = pickle.loads(pickle.dumps(value, protocol=4))
    except Exception as exc:
        raise TypeError(f"a private answer must be data that ships ({exc})") from None
    if "autograder.hidden" in repr(pickle.dumps(frozen, protocol=4)):
        raise TypeError("a private answer holds an object of a hidden module, which the "
                        "learner edition cannot load")
    return frozen


def record(run_visible_checks: Callable[[], None]) -> Recorder:
    """Run ``run_visible_checks`` with every private question written down."""
    recorder = Recorder()
    _STATE["recorder"] = recorder
    try:
        run_visible_checks()
    finally:
        _STATE["recorder"] = None
    return recorder


# --- replaying -------------------------------------------------------------------------------


@functools.cache
def _replay(recording: Path) -> Any:
    answers = pickle.loads(recording.read_bytes())

    def ask(path: str, args: tuple, kwargs: dict, attribute: bool) -> Any:
        key = _key(path, args, kwargs)
        if key not in answers:
            raise NotRecorded(tr_later(
                "This visible test asked something its recording does not answer; it needs "
                "the course's full edition. Run the next cells and grade the notebook to see "
                "what went wrong."))
        kind, value = answers[key]
        if kind == "method":
            return _Method(ask, path)
        if kind == "instance":
            return _Instance(value, ask)
        return copy.deepcopy(value)

    return _Module(ask)
