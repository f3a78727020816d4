"""A notebook with one wrong TODO, for the tests that one bug costs one TODO: the course's
answers (a library module's functions), a mutant in the place of one, each finding the
others by name in the notebook's namespace, as the notebook's functions do."""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable
from types import ModuleType


def notebook_of(reference: ModuleType, todos: Iterable[str], wrong: str, mutant: Callable
                ) -> dict[str, Callable]:
    """TODO name -> its function: ``reference``'s answer, ``mutant`` for ``wrong``."""
    written = {name: mutant if name == wrong else getattr(reference, name) for name in todos}
    placed = {name: types.FunctionType(fn.__code__, dict(fn.__globals__), name, fn.__defaults__,
                                       fn.__closure__) for name, fn in written.items()}
    for fn in placed.values():
        fn.__globals__.update(placed)
    return placed


def _names(code: types.CodeType) -> set[str]:
    """The names ``code`` reads (global and attribute names), its comprehensions' included."""
    return set(code.co_names).union(*(_names(inner) for inner in code.co_consts
                                      if isinstance(inner, types.CodeType)))


def callers(reference: ModuleType, todos: Iterable[str], todo: str) -> list[str]:
    """The other TODOs whose answer in ``reference`` calls ``todo``, directly or through
    another TODO: the only ones a wrong ``todo`` can reach."""
    todos = set(todos)
    calls = {name: _names(getattr(reference, name).__code__) & todos for name in todos}
    reached = {todo}
    while grown := {name for name, called in calls.items() if called & reached} - reached:
        reached |= grown
    return sorted(reached - {todo})


def unwritten(*args, **kwargs):
    """A TODO left as the exercise has it."""
    raise NotImplementedError()
