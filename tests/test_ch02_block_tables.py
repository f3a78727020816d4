"""Chapter 2's checks on a notebook with one wrong TODO: a TODO that calls an earlier one
(slot_id on locate, slot_mapping on slot_id, the waste and paged utilisation on
blocks_needed) loses its visible point alone when only the earlier one is wrong (the mutant and
alternative runs are in test_checks.py)."""

from __future__ import annotations

import pytest
from mutants.ch02 import MUTANTS
from one_wrong_todo import FunctionTodos, unwritten

from autograder.checks import ch02
from autograder.hidden import ch02 as hidden02
from course.v0 import block_tables as reference

_WRONG = {m.__name__: m for found in MUTANTS.values() for m, _ in found}

TODOS = FunctionTodos(reference, MUTANTS, ch02, hidden02, "02")


@pytest.mark.parametrize(("todo", "earlier", "wrong", "hint"), [
    ("slot_id", "locate", _WRONG["_table_indexed_by_offset"], "Fix locate first"),
    ("slot_id", "locate", unwritten, "Write locate first"),
    ("slot_mapping", "slot_id", _WRONG["_slot_without_stride"], "Fix slot_id first"),
    ("last_block_waste", "blocks_needed", _WRONG["_floor_blocks"], "Fix blocks_needed first"),
    ("paged_utilisation", "blocks_needed", _WRONG["_plus_one_blocks"],
     "Fix blocks_needed first"),
], ids=["slot_id-wrong_locate", "slot_id-unwritten_locate", "slot_mapping-wrong_slot_id",
        "last_block_waste-wrong_blocks_needed", "paged_utilisation-wrong_blocks_needed"])
def test_a_right_todo_beside_a_wrong_earlier_one_is_sent_to_fix_that_first(
        todo, earlier, wrong, hint):
    """Its visible test says which earlier TODO to fix, in both languages; its hidden test
    passes (the course's version of the earlier TODO lent)."""
    TODOS.sent_to_fix_first(todo, earlier, wrong, hint)


def test_the_todos_that_build_on_earlier_ones():
    assert TODOS.building_on_others() == {
        "blocks_needed": ["last_block_waste", "paged_utilisation"],
        "locate": ["slot_id", "slot_mapping"], "slot_id": ["slot_mapping"]}


@pytest.mark.one_wrong_todo
@pytest.mark.parametrize(("todo", "mutant"), TODOS.one_wrong_cases())
def test_one_wrong_todo_costs_that_todo_alone(todo, mutant):
    TODOS.costs_that_todo_alone(todo, mutant)
