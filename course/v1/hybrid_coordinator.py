"""Chapter 10's group type: a sliding-window group in the KV cache of chapter 9's engine.

A sliding-window manager differs from chapter 9's full-attention manager in two rules only,
as vLLM's ``SlidingWindowManager`` does (``single_type_kv_cache_manager.py``, vLLM 0.34.0):
the blocks it skips (``free_skipped_blocks``: its window has left them behind, and the null
block keeps their places) and the hits it accepts (``sliding_window_hit``: the window's
blocks before the hit, not every block). A hybrid model's coordinator asks every group for
its hit until they agree (``hybrid_hit``), as ``HybridKVCacheCoordinator`` does::

    pool: 10 blocks of 4 tokens (block 0 is the null block, never handed out)

    request 0, 13 tokens computed:
        group 0, full attention          [3, 5, 8, 9]
        group 1, sliding window of 6     [0, 0, 4, 7]     blocks 0 and 1 freed as it slid

A new request with a hit of 12 tokens starts with the blocks its next token sees: every hit
block under full attention, the window's last ones under a sliding window, null before::

    full attention      [a, b, c]        cached blocks 0..2, each one more holder
    sliding window      [0, e, f]        block 0 not seen: null; blocks 1, 2 cached
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from course.v1.hybrid_cache import (
    free_skipped_blocks,
    hybrid_hit,
    skipped_tokens,
    sliding_window_hit,
)
from course.v1.kv_coordinator import (
    NULL_BLOCK,
    FullAttentionManager,
    KVCacheCoordinator,
    SingleTypeKVCacheManager,
)


class SlidingWindowManager(SingleTypeKVCacheManager):
    """A sliding window of ``window`` tokens: a query sees its last ``window`` tokens. Its two
    rules are chapter 10's functions (a demonstration's subclass sets a learner's)."""

    skip = staticmethod(free_skipped_blocks)
    window_hit = staticmethod(sliding_window_hit)

    def __init__(self, pool, group: int, block_size: int, window: int) -> None:
        if window < 1:
            raise ValueError(f"a sliding window sees at least its own token, got {window}")
        super().__init__(pool, group, block_size)
        self.window = window

    def hit_length(self, cached: set[int], max_length: int) -> int:
        return self.window_hit(cached, max_length, self.block_size, self.window)

    def hit_blocks(self, keys: Sequence[str], hit: int) -> list[int]:
        unseen = min(skipped_tokens(hit, self.window) // self.block_size, hit // self.block_size)
        return [NULL_BLOCK] * unseen + [self.pool.cached[self.group, key]
                                        for key in keys[unseen:hit // self.block_size]]

    def blocks_held(self, num_computed: int, num_new: int) -> int:
        skipped = skipped_tokens(num_computed, self.window) // self.block_size
        return super().blocks_held(num_computed, num_new) - skipped

    def remove_skipped_blocks(self, request_id: int, num_computed: int) -> list[int]:
        table = self.tables.get(request_id)
        if table is None:
            return []
        return self.skip(table, num_computed, self.window, self.block_size)


class HybridKVCacheCoordinator(KVCacheCoordinator):
    """Chapter 9's coordinator for a model whose groups may slide: a manager per group of its
    kind, and a hit every group accepts (``hybrid_hit``; a demonstration's subclass sets a
    learner's)."""

    sliding_manager: type[SlidingWindowManager] = SlidingWindowManager
    agreed_hit = staticmethod(hybrid_hit)

    def manager_for(self, group: int, window: int | None) -> SingleTypeKVCacheManager:
        if window is None:
            return FullAttentionManager(self.pool, group, self.block_size)
        return self.sliding_manager(self.pool, group, self.block_size, window)

    def find_longest_cache_hit(self, cached: list[set[int]], num_tokens: int) -> int:
        return self.agreed_hit(list(zip(cached, self.windows, strict=True)), num_tokens,
                               self.block_size)


def learners_kv_cache(free_skipped_blocks: Callable | None = None,
                      sliding_window_hit: Callable | None = None,
                      hybrid_hit: Callable | None = None) -> type[HybridKVCacheCoordinator]:
    """``HybridKVCacheCoordinator`` with a learner's functions where given: a sliding group
    skipping blocks by ``free_skipped_blocks`` and finding hits by ``sliding_window_hit``, and
    every group agreeing by ``hybrid_hit``."""
    manager: dict = {}
    if free_skipped_blocks is not None:
        manager["skip"] = staticmethod(free_skipped_blocks)
    if sliding_window_hit is not None:
        manager["window_hit"] = staticmethod(sliding_window_hit)
    own: dict = {"sliding_manager": type("SlidingWindowManager", (SlidingWindowManager,),
                                         manager)}
    if hybrid_hit is not None:
        own["agreed_hit"] = staticmethod(hybrid_hit)
    return type("HybridKVCacheCoordinator", (HybridKVCacheCoordinator,), own)
