"""Chapter 6's checks on a notebook with one wrong TODO: a TODO that calls an earlier one
(blockwise_decode_attention on merge_partials, decode_step on write_kv and
paged_decode_attention) loses its visible point alone when only the earlier one is wrong (the
mutant and alternative runs are in test_checks.py)."""

from __future__ import annotations

import pytest
from mutants.ch06 import MUTANTS, _merge_without_rescaling_acc, _no_scale
from one_wrong_todo import FunctionTodos

from autograder.checks import ch06
from autograder.hidden import ch06 as hidden06
from kernels import paged_attention_ref as reference

TODOS = FunctionTodos(reference, MUTANTS, ch06, hidden06, "06")


@pytest.mark.parametrize(("todo", "earlier", "wrong", "hint"), [
    ("blockwise_decode_attention", "merge_partials", _merge_without_rescaling_acc,
     "If merge_partials fails its own test, fix that first."),
    ("decode_step", "paged_decode_attention", _no_scale,
     "If write_kv or paged_decode_attention fails its own test, fix that first"),
], ids=["blockwise-wrong_merge", "decode_step-wrong_attention"])
def test_a_right_todo_beside_a_wrong_earlier_one_is_sent_to_fix_that_first(
        todo, earlier, wrong, hint):
    """Its visible test says which earlier TODO to fix, in both languages; its hidden test
    passes (the course's version of the earlier TODO lent)."""
    TODOS.sent_to_fix_first(todo, earlier, wrong, hint)


def test_the_todos_that_build_on_earlier_ones():
    assert TODOS.building_on_others() == {
        "write_kv": ["decode_step"], "paged_decode_attention": ["decode_step"],
        "merge_partials": ["blockwise_decode_attention"]}


@pytest.mark.one_wrong_todo
@pytest.mark.parametrize(("todo", "mutant"), TODOS.one_wrong_cases())
def test_one_wrong_todo_costs_that_todo_alone(todo, mutant):
    TODOS.costs_that_todo_alone(todo, mutant)
