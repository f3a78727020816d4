"""Chapter 6's checks on a notebook with one wrong TODO: a TODO that calls an earlier one
(blockwise_decode_attention on merge_partials, decode_step on write_kv and
paged_decode_attention) loses its visible point alone when only the earlier one is wrong (the
mutant and alternative runs are in test_checks.py)."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from mutants.ch06 import MUTANTS, _merge_without_rescaling_acc, _no_scale
from one_wrong_todo import callers, notebook_of

from autograder.checks import ch06
from autograder.hidden import ch06 as hidden06
from autograder.hints import in_language
from kernels import paged_attention_ref as reference


def _notebook(wrong: str, mutant: Callable) -> dict[str, Callable]:
    return notebook_of(reference, MUTANTS, wrong, mutant)


def _callers(todo: str) -> list[str]:
    return callers(reference, MUTANTS, todo)


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
    right = _notebook(earlier, wrong)[todo]
    with pytest.raises(AssertionError, match=re.escape(hint)) as failed:
        getattr(ch06, f"check_{todo}")(right)
    assert re.search(r"[\u4e00-\u9fff]", in_language(str(failed.value), "zh_CN", "06"))
    getattr(hidden06, f"check_{todo}_thoroughly")(right)




def test_the_todos_that_build_on_earlier_ones():
    assert {todo: _callers(todo) for todo in MUTANTS if _callers(todo)} == {
        "write_kv": ["decode_step"], "paged_decode_attention": ["decode_step"],
        "merge_partials": ["blockwise_decode_attention"]}


_ONE_WRONG_TODO = [(todo, mutant) for todo, found in MUTANTS.items() for mutant, _ in found]


@pytest.mark.parametrize(("todo", "mutant"), _ONE_WRONG_TODO,
                         ids=[f"{todo}-{m.__name__.strip('_')}" for todo, m in _ONE_WRONG_TODO])
def test_one_wrong_todo_costs_that_todo_alone(todo, mutant):
    """A notebook right but for one TODO: the hidden test of every TODO that calls it passes
    (the course's version lent where the learner's fails). The other TODOs never run it: they
    are the course's answers, which test_checks.py passes."""
    notebook = _notebook(todo, mutant)
    for other in _callers(todo):
        getattr(hidden06, f"check_{other}_thoroughly")(notebook[other])
