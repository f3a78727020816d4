"""One bug costs one TODO in chapter 10: a notebook right but for ``sliding_window_hit`` keeps
``hybrid_hit``'s points, visible and hidden, and one right but for ``free_skipped_blocks`` keeps
``allocate_slots``'s, since each check lends the course's version of the TODO it builds on
where the learner's fails; without the lending, the earlier TODO's bug reaches them."""

from __future__ import annotations

import pytest
from mutants.ch10 import MUTANTS

from autograder.checks import ch10 as visible
from autograder.checks._lending import with_globals
from autograder.hidden import ch10 as hidden
from course import hybrid_cache
from course.hybrid_manager import HybridBlockManager


def _ids(todo: str) -> list:
    return [pytest.param(mutant, id=mutant.__name__.strip("_")) for mutant, _ in MUTANTS[todo]]


def _reached(check, subject) -> bool:
    """Whether ``check`` fails on ``subject``: the earlier TODO's bug reaches it."""
    try:
        check(subject)
    except AssertionError:
        return True
    return False


@pytest.mark.one_wrong_todo
@pytest.mark.parametrize("mutant", _ids("sliding_window_hit"))
def test_a_wrong_sliding_window_hit_costs_hybrid_hit_nothing(mutant):
    hybrid_hit = with_globals(hybrid_cache.hybrid_hit, {"sliding_window_hit": mutant})
    visible.check_hybrid_hit(hybrid_hit)
    hidden.check_hybrid_hit_thoroughly(hybrid_hit)


@pytest.mark.one_wrong_todo
@pytest.mark.parametrize("mutant", _ids("free_skipped_blocks"))
def test_a_wrong_free_skipped_blocks_costs_allocate_slots_nothing(mutant):
    allocate_slots = with_globals(HybridBlockManager.allocate_slots,
                                  {"free_skipped_blocks": mutant})
    pool = type("HybridBlockManager", (HybridBlockManager,), {"allocate_slots": allocate_slots})
    visible.check_allocate_slots(pool)
    hidden.check_allocate_slots_thoroughly(pool)


def _hybrid_hit_unlent(fn) -> None:
    visible.expect_cases(fn, visible.HYBRID_CASES, hidden.hybrid_case,
                         visible.HYBRID_HIT_IDEA, rel_tol=0, promise=visible.INT)


def _allocation_unlent(pool) -> None:
    for run in [visible.ALLOCATION, *visible.FREED_DECIDES]:
        visible.run_steps("allocate_slots", pool, *run, hidden.allocation_outcomes(*run))


def test_without_the_lending_the_earlier_todos_bugs_reach_the_later_checks():
    """Else the lending above would be proved on mutants whose bug never reaches the later
    TODO's cases."""
    hits = [_reached(_hybrid_hit_unlent,
                     with_globals(hybrid_cache.hybrid_hit, {"sliding_window_hit": m}))
            for m, _ in MUTANTS["sliding_window_hit"]]
    pools = [_reached(_allocation_unlent, type(
        "HybridBlockManager", (HybridBlockManager,), {"allocate_slots": with_globals(
            HybridBlockManager.allocate_slots, {"free_skipped_blocks": m})}))
             for m, _ in MUTANTS["free_skipped_blocks"]]
    assert sum(hits) >= len(hits) - 2 and sum(pools) >= len(pools) - 2, (hits, pools)
