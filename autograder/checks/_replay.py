"""Hypothesis' cases of a check, drawn once per class, replayed for every notebook.

The checks built on hypothesis are derandomized (``_helpers._settings``): on every answer
that passes, a check draws the same cases in the same order, since what hypothesis draws
next depends only on what it drew before and on whether each case passed. Drawing them is
most of such a check's time (chapter 3's thorough check of ``free`` spends about half of it
in hypothesis' engine, choosing and recording choices). So a grading records once, per
chapter, the choices of every case each check drew on the course's own solution
(``recording``, the cases of ``KV_COURSE_RECORD_CASES``), and the kernels forked for the
class's notebooks are handed them (``load``): a check then runs each recorded case through
hypothesis' own execution of the test (``replayed``), its values drawn from the recorded
choices instead of by the engine. Where a check's cases are plain data (numbers, strings,
and tuples, lists and dicts of them: ``_helpers.for_all``'s, whose strategies never call the
learner's code), the values are recorded too, and handed to that execution as an explicit
example is: nothing is drawn at all (about a tenth of the time of drawing from choices).

The verdict and the hint are those of a run without the record. Replay stops at the first
case that fails, or whose draws leave the record (a choice the strategy no longer allows,
more or fewer choices than recorded), and the check runs as it would have: hypothesis draws
the same cases up to that one, finds the same failure and shrinks it. A record is used only
by the same check with the same strategy and settings (``key``), with the same hypothesis
and the same check and library code (``fingerprint``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import marshal
import os
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

RECORD = "KV_COURSE_RECORD_CASES"  # a kernel's environment: the file a recording run writes
CASES = "KV_COURSE_CASES"  # a kernel's environment: the records its checks replay
_FORMAT = 2

# key -> (every case's choices, in the order drawn; every case's value, marshalled, or None
# where a value is not plain data): read-only, never rebound after ``load``
_RECORDS: types.MappingProxyType = types.MappingProxyType({})
_RECORDING: dict[str, tuple | None] = {}  # what this recording run drew (None: drawn twice,
# differently; such a key is not replayed)
_DREW: list[bytes | None] = []  # in a recording run, the value of the case being run
_PLAIN = (type(None), bool, int, float, complex, str, bytes)  # exactly these: no subclass


@functools.cache
def fingerprint() -> str:
    """What a record depends on besides its keys: the Python and hypothesis that drew it, and
    the source of the checks and of the library they draw cases with (read, not imported:
    the grader's own process imports neither)."""
    digest = hashlib.sha256(f"{_FORMAT} {sys.version} {metadata.version('hypothesis')}".encode())
    for package in ("autograder", "course"):
        home = Path(importlib.util.find_spec(package).origin).parent
        for path in sorted(home.rglob("*.py")):
            digest.update(path.relative_to(home.parent).as_posix().encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()


def load(path: Path) -> bool:
    """Take the records of ``path`` (written by ``recording``) for the checks this process
    runs; whether they were taken (not where the file is missing, unreadable, or written with
    other code or another hypothesis)."""
    global _RECORDS
    try:
        written, records = marshal.loads(path.read_bytes())
    except (OSError, ValueError, EOFError, TypeError):
        return False
    if written != fingerprint() or not isinstance(records, dict):
        return False
    _RECORDS = types.MappingProxyType(records)
    return True


def key(kind: str, subject: Any, max_examples: int, steps: int = 0) -> str | None:
    """What names a hypothesis run across processes: ``kind`` (``"for_all"``, ``"stateful"``),
    the check's own code (the caller of ``for_all`` or ``run_stateful``: its file, function
    and line), the strategy's description or the state machine's (its class, and every value
    its rules close over but the learner's code), and the settings that shape the draws. None
    where that cannot be told apart from another run's (a description holding an object's
    address)."""
    frame = sys._getframe(2)
    code = frame.f_code
    where = f"{Path(code.co_filename).name}:{code.co_qualname}:{frame.f_lineno}"
    described = _machine(subject) if kind == "stateful" else repr(subject)
    if " at 0x" in described:
        return None
    return f"{kind} {where} {max_examples} {steps} {described}"


def _machine(machine: type) -> str:
    """A state machine class, told apart from one built by the same code with other values:
    its name, and what its methods close over (sorted where a set's order would vary), less
    classes, modules and functions other than its own (the learner's code decides no draw;
    hypothesis' decorators close over the method they wrap)."""
    own = machine.__qualname__ + "."
    seen, todo = [], [(name, value) for name, value in sorted(vars(machine).items())
                      if callable(value)]
    while todo:
        name, function = todo.pop(0)
        for cell in getattr(function, "__closure__", None) or ():
            try:
                held = cell.cell_contents
            except ValueError:  # not set yet
                continue
            if isinstance(held, types.FunctionType):
                if held.__qualname__.startswith(own) or \
                        held.__module__.partition(".")[0] == "hypothesis":
                    todo.append((name, held))
            elif not isinstance(held, type | types.MethodType | types.ModuleType):
                seen.append(f"{name}={_stable(held)}")
    return f"{machine.__qualname__}({', '.join(seen)})"


def _stable(value: Any) -> str:
    if isinstance(value, set | frozenset):
        return f"{{{', '.join(sorted(map(_stable, value)))}}}"
    return repr(value)


def replayed(run_key: str | None, test: Callable[[], Callable[..., None]],
             argument: str | None = None) -> bool:
    """Whether every recorded case of ``run_key`` passed when run through ``test()`` (a
    hypothesis test: ``@given``, or a state machine's ``get_state_machine_test``): given its
    recorded value as ``argument`` where the record has values (as hypothesis runs an
    explicit example, in the same settings, seeded ``random`` and build context), else
    drawing exactly its recorded choices. False at once where there is no record; False at
    the first case that fails or draws otherwise: the caller then runs ``test`` as it would
    have."""
    record = _RECORDS.get(run_key) if run_key is not None else None
    if not record:
        return False
    from hypothesis.errors import StopTest
    from hypothesis.internal.conjecture.data import ConjectureData

    cases, values = record
    execution = _execution(test())
    if execution is None:
        return False
    given = values is not None and argument is not None
    for index, choices in enumerate(cases):
        data = ConjectureData.for_choices(choices)
        try:
            if given:  # a fresh copy of the value: the check may change what it is handed
                execution.execute_once(data, example_kwargs={
                    argument: marshal.loads(values[index])})
            else:
                execution.execute_once(data)
        except (StopTest, Exception):  # a failure, or draws past the record: run it afresh
            return False
        if not given and (data.misaligned_at is not None or tuple(data.choices) != choices):
            return False
    return True


def keeping(check: Callable[[Any], None]) -> Callable[[Any], None]:
    """``check``, which in a recording run first keeps the case it is handed (before it can
    change it), where it is plain data, for ``recording``; elsewhere ``check`` itself."""
    if not os.environ.get(RECORD):
        return check

    def kept(case: Any) -> None:
        _DREW.append(marshal.dumps(case) if _plain(case) else None)
        check(case)

    return kept


def _plain(value: Any) -> bool:
    """Whether ``value`` is plain data that ``marshal`` gives back as it was: numbers,
    strings, bytes and None, in tuples, lists and dicts (no set, whose order could differ)."""
    kind = type(value)
    if kind in _PLAIN:
        return True
    if kind in (tuple, list):
        return all(map(_plain, value))
    if kind is dict:
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return False


def _execution(test: Callable[..., None]) -> Any:
    """Hypothesis' own execution of one case of ``test`` (what its ``fuzz_one_input`` runs
    each input through); None where this hypothesis has it otherwise."""
    fuzz = getattr(getattr(test, "hypothesis", None), "fuzz_one_input", None)
    for cell in getattr(fuzz, "__closure__", None) or ():
        held = cell.cell_contents
        if type(held).__name__ == "StateForActualGivenExecution" and \
                hasattr(held, "execute_once"):
            return held
    return None


@contextmanager
def recording(run_key: str | None) -> Iterator[None]:
    """Within, in a recording run (``KV_COURSE_RECORD_CASES`` set): the choices of every
    case hypothesis runs to a pass are kept, and, if the whole run passes, written under
    ``run_key`` (with the rest of this run's records, to that file). Elsewhere, nothing."""
    path = os.environ.get(RECORD)
    if not path or run_key is None:
        yield
        return
    from hypothesis.internal.conjecture import engine
    from hypothesis.internal.conjecture.data import Status

    drawn: list[tuple] = []
    values: list[bytes | None] = []
    runner = engine.ConjectureRunner
    test_function = runner.test_function

    def kept(self: Any, data: Any) -> Any:
        _DREW.clear()
        result = test_function(self, data)
        if data.status == Status.VALID:
            drawn.append(tuple(data.choices))
            values.append(_DREW[0] if len(_DREW) == 1 else None)
        return result

    runner.test_function = kept
    try:
        yield
    finally:
        runner.test_function = test_function
    cases = (tuple(drawn), None if None in values else tuple(values))
    earlier = _RECORDING.setdefault(run_key, cases)
    if earlier is not None and earlier != cases:
        _RECORDING[run_key] = None
    _write(Path(path), {k: v for k, v in _RECORDING.items() if v})


def _write(path: Path, records: dict[str, tuple]) -> None:
    """Write ``records`` (key -> each case's choices and values) to ``path`` with this code's
    fingerprint, whole or not at all."""
    partial = path.parent / f".{path.name}.{os.getpid()}"
    partial.write_bytes(marshal.dumps((fingerprint(), records)))
    partial.replace(path)
