"""A notebook with one wrong TODO, for the tests that one bug costs one TODO.

In the chapters whose TODOs are functions: the course's answers (a library module's
functions), a mutant in the place of one, each finding the others by name in the notebook's
namespace, as the notebook's functions do; a wrong TODO is checked against the TODOs whose
answers call it (``FunctionTodos.callers``). In the chapters whose TODOs are a class's
methods: a mutant is the course's class with one mistake, and a check that never looks up
what the mutant changes (``looked_up``, ``reaches``) runs on it exactly as on the course's
class, so it cannot cost the wrong TODO's neighbours a point.
"""

from __future__ import annotations

import re
import types
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import pytest

CJK = re.compile(r"[\u4e00-\u9fff]")


def names_read(code: types.CodeType) -> set[str]:
    """The names ``code`` reads (global and attribute names), its comprehensions' included."""
    return set(code.co_names).union(*(names_read(inner) for inner in code.co_consts
                                      if isinstance(inner, types.CodeType)))


class _Noted:
    """A method of a class under record (a function, static or class method): each lookup of
    it notes its name, then returns what the lookup would have."""

    def __init__(self, name: str, attribute: Any, seen: set[str]) -> None:
        self.name, self.attribute, self.seen = name, attribute, seen

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        self.seen.add(self.name)
        return self.attribute.__get__(instance, owner)


_METHODS = (types.FunctionType, staticmethod, classmethod)
# What a class statement defines on every class, besides what its body says.
_BOOKKEEPING = {"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__",
                "__firstlineno__", "__static_attributes__", "__annotations__"}


def looked_up(check: Callable[[type], None], course: type) -> set[str]:
    """The methods of ``course`` (its own and its bases', up to ``object``) that ``check``
    looks up when it runs on ``course``: called, or taken as a bound method. Recorded on a
    subclass whose every method notes each lookup; fails where ``check`` fails on the course's
    class."""
    seen: set[str] = set()
    noted = {name: _Noted(name, attribute, seen) for owner in reversed(course.__mro__[:-1])
             for name, attribute in vars(owner).items() if isinstance(attribute, _METHODS)}
    if "__eq__" in noted:  # a class body's __eq__ alone would make its instances unhashable
        noted["__hash__"] = course.__hash__
    check(type(course.__name__, (course,), noted))
    return seen


def reaches(looked: set[str], mutant: type, course: type) -> bool:
    """Whether a check that looks up ``looked`` on ``course`` can meet what ``mutant`` (a
    subclass of ``course``) changes. Where it looks up none of the methods ``mutant``
    redefines, it runs on ``mutant`` step for step as on ``course``: the same calls with the
    same results (hypothesis's cases are derandomized). A changed constant or property is
    read, and no lookup of it is noted: a mutant that changes one reaches every check."""
    changed = {name: attribute for owner in mutant.__mro__ if owner not in course.__mro__
               for name, attribute in vars(owner).items() if name not in _BOOKKEEPING}
    return not all(isinstance(a, _METHODS) for a in changed.values()) or bool(
        looked & set(changed))


def unwritten(*args, **kwargs):
    """A TODO left as the exercise has it."""
    raise NotImplementedError()


class FunctionTodos:
    """A chapter's function TODOs: their answers in ``reference``, their mutants
    (``MUTANTS``), its visible and hidden checks modules and its number (``"01"``)."""

    def __init__(self, reference: ModuleType, mutants: Mapping[str, list], visible: ModuleType,
                 hidden: ModuleType, number: str) -> None:
        self.reference, self.todos = reference, list(mutants)
        self.mutants, self.visible, self.hidden, self.number = mutants, visible, hidden, number

    def notebook(self, wrong: str, mutant: Callable) -> dict[str, Callable]:
        """TODO name -> its function: the course's answer, ``mutant`` for ``wrong``."""
        written = {name: mutant if name == wrong else getattr(self.reference, name)
                   for name in self.todos}
        placed = {name: types.FunctionType(fn.__code__, dict(fn.__globals__), name,
                                           fn.__defaults__, fn.__closure__)
                  for name, fn in written.items()}
        for fn in placed.values():
            fn.__globals__.update(placed)
        return placed

    def callers(self, todo: str) -> list[str]:
        """The other TODOs whose answer calls ``todo``, directly or through another TODO: the
        only ones a wrong ``todo`` can reach."""
        todos = set(self.todos)
        calls = {name: names_read(getattr(self.reference, name).__code__) & todos for name in todos}
        reached = {todo}
        while grown := {name for name, called in calls.items() if called & reached} - reached:
            reached |= grown
        return sorted(reached - {todo})

    def building_on_others(self) -> dict[str, list[str]]:
        """TODO -> the TODOs that call it, for the TODOs some other one calls."""
        return {todo: self.callers(todo) for todo in self.todos if self.callers(todo)}

    def one_wrong_cases(self) -> list:
        """Every mutant of every TODO, as pytest parameters (todo, mutant)."""
        return [pytest.param(todo, mutant, id=f"{todo}-{mutant.__name__.strip('_')}")
                for todo, found in self.mutants.items() for mutant, _ in found]

    def costs_that_todo_alone(self, todo: str, mutant: Callable) -> None:
        """A notebook right but for ``todo``: the hidden test of every TODO that calls it
        passes (the course's version lent where the learner's fails). The other TODOs never
        run it: they are the course's answers, which tests/test_checks.py passes."""
        notebook = self.notebook(todo, mutant)
        for other in self.callers(todo):
            getattr(self.hidden, f"check_{other}_thoroughly")(notebook[other])

    def sent_to_fix_first(self, todo: str, earlier: str, wrong: Callable, hint: str) -> None:
        """``todo`` right beside a wrong ``earlier``: its visible test says which TODO to fix
        (``hint``), in both languages; its hidden test passes (the earlier TODO lent)."""
        from autograder.hints import in_language

        right = self.notebook(earlier, wrong)[todo]
        with pytest.raises(AssertionError, match=re.escape(hint)) as failed:
            getattr(self.visible, f"check_{todo}")(right)
        assert CJK.search(in_language(str(failed.value), "zh_CN", self.number))
        getattr(self.hidden, f"check_{todo}_thoroughly")(right)
