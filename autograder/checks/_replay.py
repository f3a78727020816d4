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
A state machine's case is recorded as values too (``_Tape``), where nothing it draws can depend
on what the learner's code did: no rule or invariant has a precondition and no rule a bundle,
so which rule runs next depends on the choices alone, and every value its rules draw comes from
a sample of plain values, integers in a range or booleans. Its steps (each rule and its
arguments) and its rules' draws (each with what it was drawn from) are handed to hypothesis'
own run of the machine, which runs them as it runs drawn ones (invariants, teardown); a draw
from anything else than what was recorded (the machine's state went otherwise) ends the
replay.

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
_STEPS: list[tuple | None] = []  # in a recording run, the steps of the state machine's case
_TRACE_DEPTH = [0]  # draws under way in a recording run: its steps are the outermost ones
_RULE, _DRAW = 0, 1  # a step's kinds: a rule and its arguments; a rule's own draw
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
        tape = None
        try:
            if given:  # a fresh copy of the value: the check may change what it is handed
                value = marshal.loads(values[index])
                if kind_of(run_key) == "stateful":  # the machine's steps, played back
                    from hypothesis.strategies._internal.core import DataObject

                    tape = _tape_class().playing(value)
                    value = DataObject(tape)
                execution.execute_once(data, example_kwargs={argument: value})
            else:
                execution.execute_once(data)
        except (StopTest, Exception):  # a failure, or draws past the record: run it afresh
            return False
        if tape is not None and not tape.played:
            return False
        if not given and (data.misaligned_at is not None or tuple(data.choices) != choices):
            return False
    return True


def kind_of(run_key: str) -> str:
    """``"for_all"`` or ``"stateful"``: the kind of run ``run_key`` names."""
    return run_key.partition(" ")[0]


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
    stateful = kind_of(run_key) == "stateful"

    def kept(self: Any, data: Any) -> Any:
        _DREW.clear()
        _STEPS.clear()
        result = test_function(self, data)
        if data.status == Status.VALID:
            drawn.append(tuple(data.choices))
            if stateful:
                values.append(None if None in _STEPS else marshal.dumps(tuple(_STEPS)))
            else:
                values.append(_DREW[0] if len(_DREW) == 1 else None)
        return result

    runner.test_function = kept
    untraced = _tracing_steps() if stateful else None
    try:
        yield
    finally:
        runner.test_function = test_function
        if untraced is not None:
            untraced()
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


def _tracing_steps() -> Callable[[], None]:
    """Until the returned function is called, every step of a state machine run in this
    process is kept in ``_STEPS`` (``None`` for one that cannot be played back as values):
    each rule hypothesis draws, with its arguments, and each value a rule draws, with what it
    was drawn from."""
    from hypothesis.internal.conjecture.data import ConjectureData
    from hypothesis.stateful import Rule
    from hypothesis.strategies._internal.core import DataObject

    conjecture_draw, object_draw = ConjectureData.draw, DataObject.draw

    def draw(self: Any, strategy: Any, label: Any = None, observe_as: Any = None) -> Any:
        outermost = _TRACE_DEPTH[0] == 0
        _TRACE_DEPTH[0] += 1
        try:
            value = conjecture_draw(self, strategy, label, observe_as)
        finally:
            _TRACE_DEPTH[0] -= 1
        if outermost and type(value) is tuple and len(value) == 2 and \
                isinstance(value[0], Rule):  # the next rule and its arguments
            _STEPS.append(_rule_step(self.hypothesis_runner, *value))
        return value

    def drawn_by_rule(self: Any, strategy: Any, label: Any = None) -> Any:
        value = object_draw(self, strategy, label)
        described = _described(strategy)
        _STEPS.append(None if described is None or not _plain(value) else
                      (_DRAW, marshal.dumps(described), marshal.dumps(value)))
        return value

    ConjectureData.draw, DataObject.draw = draw, drawn_by_rule

    def untraced() -> None:
        ConjectureData.draw, DataObject.draw = conjecture_draw, object_draw

    return untraced


def _rule_step(machine: Any, rule: Any, arguments: dict) -> tuple | None:
    """The step of running ``rule`` with ``arguments`` (a ``st.data()`` argument as None, the
    others marshalled as they were drawn); None where the machine's next rule could depend on
    its state (a precondition, a bundle) or an argument is not plain data."""
    from hypothesis.strategies._internal.core import DataObject

    if any(r.preconditions or r.bundles or r.targets for r in machine.rules) or \
            any(i.preconditions for i in machine.invariants) or \
            rule.preconditions or rule.bundles or rule.targets:
        return None
    kept = []
    for name, value in sorted(arguments.items()):
        if isinstance(value, DataObject):
            kept.append((name, None))
        elif _plain(value):
            kept.append((name, marshal.dumps(value)))
        else:
            return None
    return (_RULE, rule.function.__name__, tuple(kept))


def _described(strategy: Any) -> tuple | None:
    """All that a value drawn from ``strategy`` depends on besides the choices it is drawn
    from, where it is data: a sample of plain values (untransformed; one value alone is
    ``just`` it, which draws nothing), integers in a range, booleans; None for any other
    strategy."""
    from hypothesis.strategies._internal.lazy import unwrap_strategies
    from hypothesis.strategies._internal.misc import BooleansStrategy, JustStrategy
    from hypothesis.strategies._internal.numbers import IntegersStrategy
    from hypothesis.strategies._internal.strategies import SampledFromStrategy

    inner = unwrap_strategies(strategy)
    kind = type(inner)
    if kind in (SampledFromStrategy, JustStrategy) and not inner._transformations and \
            _plain(list(inner.elements)):
        return (kind.__name__, tuple(inner.elements))
    if kind is IntegersStrategy:
        return ("integers", inner.start, inner.end)
    if kind is BooleansStrategy:
        return ("booleans",)
    return None


class _Diverged(Exception):
    """A state machine's replayed steps left the record: its state went otherwise."""


@functools.cache
def _tape_class() -> type:
    """``_Tape``, made when first needed: hypothesis is imported only where checks run."""
    from hypothesis.internal.conjecture.data import ConjectureData
    from hypothesis.strategies._internal.core import DataObject

    class _Tape(ConjectureData):
        """A state machine's recorded case, played back to hypothesis' own run of the machine
        (``get_state_machine_test``): each rule it asks for, with its arguments, and each value
        a rule draws, are the recorded ones, where what it is drawn from is what it was
        (``_Diverged`` otherwise); it stops when the steps run out. Nothing is drawn."""

        @classmethod
        def playing(cls, steps: tuple) -> _Tape:
            tape = cls.for_choices(())
            tape.steps, tape.position = steps, 0
            return tape

        @property
        def played(self) -> bool:
            return self.position == len(self.steps)

        def _next(self) -> tuple:
            if self.played:
                raise _Diverged
            self.position += 1
            return self.steps[self.position - 1]

        def draw_boolean(self, p: float = 0.5, *, forced: bool | None = None,
                         fake_forced: bool = False) -> bool:
            # asked only by the machine's run, before each step: whether to stop here
            if not self.played and self.steps[self.position][0] != _RULE:
                raise _Diverged  # a rule drew less than it did
            if forced is not None and forced != self.played:
                raise _Diverged
            return self.played

        def draw(self, strategy: Any, label: Any = None, observe_as: Any = None) -> Any:
            step = self._next()
            described = _described(strategy)
            if step[0] == _RULE:  # the machine's next rule: never a strategy of data
                machine = self.hypothesis_runner
                pending = machine._initialize_rules_to_run
                rules = {r.function.__name__: r for r in (pending or machine.rules)}
                if described is not None or step[1] not in rules:
                    raise _Diverged
                return rules[step[1]], {name: DataObject(self) if value is None else
                                        marshal.loads(value) for name, value in step[2]}
            if described is None or marshal.dumps(described) != step[1]:
                raise _Diverged
            return marshal.loads(step[2])

    return _Tape
