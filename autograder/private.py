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

import contextlib
import copy
import dataclasses
import enum
import fractions
import functools
import hashlib
import importlib
import os
import pickle
import signal
import sys
import threading
import types
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
    (``autograder.seal``), whatever the learner's code did next. A check stops at its time
    limit (``out_of_time``), and is not run again on code that did not return in an earlier
    one."""
    check_subject(*args)
    sys.audit(CHECK_STARTED)
    try:
        hung, seconds = _hung_in(args), check_seconds()
        if hung is not None:
            raise AssertionError(tr_later(
                f"{hung} did not return within {seconds:g} s in an earlier test, so "
                "this test did not run it again; look for a loop that never ends (what "
                "changes each time round, and when does it stop?)"))
        with out_of_time():
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


# --- a learner's code that does not return --------------------------------------------------

SECONDS_SETTING = "KV_COURSE_CHECK_SECONDS"  # a check's time limit, in seconds
# Unless set: far above the slowest test cell of any chapter's solution, 1.9 s on a 2-core
# machine (its column in ``python -m autograder bench --breakdown``), under a cell's 120 s.
_CHECK_SECONDS = 30.0


def check_seconds() -> float:
    """How long one check may run, in seconds (``KV_COURSE_CHECK_SECONDS``, else 30)."""
    return float(os.environ.get(SECONDS_SETTING) or _CHECK_SECONDS)


class _OutOfTime(BaseException):
    """Raised in the learner's code when a check runs past its limit: a ``BaseException``,
    so that ``except Exception`` in that code does not swallow it."""


_HUNG: dict[int, tuple[Any, str]] = {}  # id(code) -> (the code, kept alive; its function name)
_TIMING = [0]  # checks under way with the limit armed: a hidden check may run a visible one


@contextlib.contextmanager
def out_of_time() -> Any:
    """The check inside stops after ``check_seconds()``: the learner's code it was running
    raises ``_OutOfTime`` (again each second, should that code catch it), and the check fails
    with a hint naming the function that did not return. Every function of the learner's that
    was running then is remembered: a later check given one fails at once (``_hung_in``), so
    an endless loop costs one limit, not a cell's limit for every test that calls it. Armed in
    the main thread, where signals are delivered, and only by the outermost check."""
    if _TIMING[0] or threading.current_thread() is not threading.main_thread() or \
            not hasattr(signal, "setitimer"):
        yield
        return

    def expired(number: int, frame: Any) -> None:
        raise _OutOfTime

    seconds = check_seconds()
    before = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    _TIMING[0] += 1
    try:
        yield
    except _OutOfTime as stopped:
        name = _remember_learner_frames(stopped.__traceback__)
        raise AssertionError(tr_later(
            f"{name} did not return within {seconds:g} s, so this test stopped it: look for a "
            "loop that never ends (what changes each time round, and when does it stop?), or "
            "work that grows far faster than it should")) from None
    finally:
        _TIMING[0] -= 1
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def _remember_learner_frames(trace: Any) -> str:
    """Remember the code of every learner's frame in ``trace``; the outermost one's name (the
    function the check called), or "your code"."""
    from autograder.seal import LEARNER, _library_roots, _owner_of

    library, names = _library_roots(), []
    while trace is not None:
        code = trace.tb_frame.f_code
        if _owner_of(code.co_filename, library) == LEARNER:
            _HUNG[id(code)] = (code, code.co_name)
            names.append(code.co_name)
        trace = trace.tb_next
    return next((name for name in names if not name.startswith("<")), "your code")


def _hung_in(args: tuple) -> str | None:
    """The name of a function, among what a check is given, that did not return in an
    earlier check; None if there is none."""
    if not _HUNG:
        return None
    for code in (code for arg in args for code in _codes_of(arg)):
        if id(code) in _HUNG and _HUNG[id(code)][0] is code:
            return _HUNG[id(code)][1]
    return None


def _codes_of(value: Any) -> list[Any]:
    """The code of a function, method or Triton kernel; of every function a class (or an
    instance's class) defines, along its bases."""
    value = getattr(value, "__func__", value)  # a bound method
    value = getattr(value, "fn", value) if not isinstance(value, type) else value  # a kernel
    if isinstance(value, types.FunctionType):
        return [value.__code__]
    if value is None or isinstance(value, int | float | str | bytes | tuple | list | dict):
        return []
    cls = value if isinstance(value, type) else type(value)
    codes = []
    for klass in cls.__mro__:
        for member in vars(klass).values():
            member = getattr(member, "__func__", member)  # a static or class method
            if isinstance(member, types.FunctionType):
                codes.append(member.__code__)
    return codes


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
