"""One bug costs one TODO in chapter 10: a notebook right but for ``sliding_window_hit`` keeps
``hybrid_hit``'s points, visible and hidden, since its checks lend the course's version of the
TODO it builds on where the learner's fails; without the lending, the earlier TODO's bug
reaches them. ``hybrid_hit`` is the one function TODO that calls another (``allocate_slots``,
which called ``free_skipped_blocks``, is the library's now: ``course.v1.kv_coordinator``)."""

from __future__ import annotations

import types

import pytest
from mutants.ch10 import MUTANTS
from one_wrong_todo import FunctionTodos

from autograder.checks import ch10 as visible
from autograder.checks._lending import with_globals
from autograder.hidden import ch10 as hidden
from course.experiments import hybrid_sizing
from course.v1 import hybrid_cache

FUNCTIONS = ("request_bytes", "free_skipped_blocks", "sliding_window_hit", "hybrid_hit")
_reference = types.ModuleType("chapter_10_functions")
for _name in FUNCTIONS:
    setattr(_reference, _name, getattr(hybrid_sizing if _name == "request_bytes"
                                       else hybrid_cache, _name))
# window_first_key, a kernel, calls no TODO and no TODO calls it
TODOS = FunctionTodos(_reference, {name: MUTANTS[name] for name in FUNCTIONS}, visible, hidden,
                      "10")


def _ids(todo: str) -> list:
    return [pytest.param(mutant, id=mutant.__name__.strip("_")) for mutant, _ in MUTANTS[todo]]


def _reached(check, subject) -> bool:
    """Whether ``check`` fails on ``subject``: the earlier TODO's bug reaches it."""
    try:
        check(subject)
    except AssertionError:
        return True
    return False


def test_only_hybrid_hit_builds_on_another_todo():
    assert set(MUTANTS) == {*FUNCTIONS, "window_first_key"}
    assert TODOS.building_on_others() == {"sliding_window_hit": ["hybrid_hit"]}


@pytest.mark.one_wrong_todo
@pytest.mark.parametrize("mutant", _ids("sliding_window_hit"))
def test_a_wrong_sliding_window_hit_costs_hybrid_hit_nothing(mutant):
    hybrid_hit = with_globals(hybrid_cache.hybrid_hit, {"sliding_window_hit": mutant})
    visible.check_hybrid_hit(hybrid_hit)
    hidden.check_hybrid_hit_thoroughly(hybrid_hit)


@pytest.mark.one_wrong_todo
@pytest.mark.parametrize(("todo", "mutant"), TODOS.one_wrong_cases())
def test_one_wrong_todo_costs_that_todo_alone(todo, mutant):
    TODOS.costs_that_todo_alone(todo, mutant)


def _hybrid_hit_unlent(fn) -> None:
    visible.expect_cases(fn, visible.HYBRID_CASES, hidden.hybrid_case,
                         visible.HYBRID_HIT_IDEA, rel_tol=0, promise=visible.INT)


def test_without_the_lending_the_earlier_todos_bugs_reach_the_later_checks():
    """Else the lending above would be proved on mutants whose bug never reaches the later
    TODO's cases."""
    hits = [_reached(_hybrid_hit_unlent,
                     with_globals(hybrid_cache.hybrid_hit, {"sliding_window_hit": m}))
            for m, _ in MUTANTS["sliding_window_hit"]]
    assert sum(hits) >= len(hits) - 2, hits
