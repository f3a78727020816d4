"""The given ``check_invariants`` of chapters 3 and 4: silent on every state the reference
reaches, loud on books that do not balance."""

from __future__ import annotations

import pytest

from course.experiments.prefix_sim import chat
from course.notebook.block_scenarios import beam_search, interleaved_growth, running_out
from course.v0.block_manager import BlockManager, NoFreeBlocksError
from course.v0.prefix_cache import PrefixCachingBlockManager


def _play(manager: BlockManager, script) -> None:
    for kind, *args in script:
        try:
            {"allocate": manager.allocate, "append": manager.append_slot,
             "fork": manager.fork, "free": manager.free}[kind](*args)
        except NoFreeBlocksError:  # the running-out scenario runs out, by design
            pass
        manager.check_invariants()


@pytest.mark.parametrize(("script", "blocks"), [(interleaved_growth(), 12),
                                                 (beam_search(width=4), 24), (running_out(), 5)])
def test_block_manager_books_balance_through_every_scenario(script, blocks):
    _play(BlockManager(blocks, 4), script)


def test_block_manager_invariants_catch_unbalanced_books():
    manager = BlockManager(6, 4)
    manager.allocate(0, 6)
    manager.fork(0, 1)
    manager.ref_counts[0] += 1
    with pytest.raises(AssertionError, match="reference count"):
        manager.check_invariants()
    manager.ref_counts[0] -= 1
    manager.free_blocks.append(manager.block_table(0)[1])
    with pytest.raises(AssertionError, match="in use is also free"):
        manager.check_invariants()
    manager.free_blocks.pop()
    manager.free_blocks.popleft()
    with pytest.raises(AssertionError, match="lost"):
        manager.check_invariants()


def test_prefix_cache_books_balance_while_requests_come_and_go():
    manager = PrefixCachingBlockManager(40, 4)
    requests = chat(12, system_prompt=20, mean_user=6, mean_output=5, seed=2)
    for index, request in enumerate(requests):
        manager.allocate(index, request.prompt)
        for token in request.output:
            manager.append_slot(index, token)
        manager.check_invariants()
        if index >= 2:
            manager.free(index - 2)
            manager.check_invariants()


def test_prefix_cache_invariants_catch_unbalanced_books():
    manager = PrefixCachingBlockManager(8, 4)
    manager.allocate(0, list(range(9)))
    manager.ref_counts[0] += 1
    with pytest.raises(AssertionError, match="reference count"):
        manager.check_invariants()
    manager.ref_counts[0] -= 1
    manager.free_queue[manager.block_table(0)[0]] = None
    with pytest.raises(AssertionError, match="free and used"):
        manager.check_invariants()
    del manager.free_queue[manager.block_table(0)[0]]
    manager.keys[manager.block_table(0)[0]] = "another key"
    with pytest.raises(AssertionError, match="cache maps disagree"):
        manager.check_invariants()
