"""One bug costs one TODO in chapter 12: no TODO's answer calls another's, and each check is
given the learner's one function (the hidden checks that serve the tiny model through the
speculative engine give it the course's other three, the engine's defaults), so a wrong TODO
reaches no other TODO's check."""

from __future__ import annotations

import types

from mutants.ch12 import MUTANTS
from one_wrong_todo import FunctionTodos

from autograder.checks import ch12 as visible
from autograder.hidden import ch12 as hidden
from course.v1 import spec_decode

_reference = types.ModuleType("chapter_12_functions")
for _name in MUTANTS:
    setattr(_reference, _name, getattr(spec_decode, _name))
TODOS = FunctionTodos(_reference, MUTANTS, visible, hidden, "12")


def test_no_todo_builds_on_another():
    assert set(MUTANTS) == {"ngram_propose", "accept_greedy", "schedule_lookahead", "rollback"}
    assert TODOS.building_on_others() == {}

