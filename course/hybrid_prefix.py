"""Prefix caching across the groups of a hybrid model: chapter 4's cache, kept per group.

A full block is cached in its group under its prefix key (chapter 4's ``prefix_keys``): the
same tokens after the same prefix are the same K/V in every layer of the group. A block whose
request no longer holds it keeps its key in the free queue (evicted last, and only when the
pool reuses it), so a sliding window's old blocks stay hits for a while after the window left
them. A new request takes the longest hit that every group accepts (``hybrid_hit``), and of it
each group takes only the blocks its next token sees: all of them under full attention, the
window's last ones under a sliding window, the null block before::

    hit of 12 tokens, blocks of 4, a window of 6: the next token (position 12) sees 7..12

    full attention      [a, b, c]        cached blocks 0..2, each one more reference
    sliding window      [0, e, f]        block 0 not seen: null; blocks 1, 2 cached

Contracts, beside ``HybridBlockManager``'s: a block is in the free queue exactly when no
request holds it; a cached block is found under one key of one group; a hit never covers a
request's last token (its logits give the next one).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from course.hybrid_cache import NULL_BLOCK, hybrid_hit, skipped_tokens
from course.hybrid_manager import HybridBlockManager
from course.prefix_cache import prefix_keys


class HybridPrefixCache(HybridBlockManager):
    """A ``HybridBlockManager`` whose full blocks stay cached, per group, by prefix key."""

    # how a hit is found (a demonstration's subclass finds it with a learner's hybrid_hit)
    find_hit = staticmethod(hybrid_hit)

    def __init__(self, num_blocks: int, block_size: int, windows: Sequence[int | None]
                 ) -> None:
        super().__init__(num_blocks, block_size, windows)
        # the free queue, least recently freed first: an evictable cached block keeps its key
        self.free_blocks: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        self.references = [0] * num_blocks
        self.cached: dict[tuple[int, str], int] = {}  # (group, prefix key) -> block
        self.key_of: dict[int, tuple[int, str]] = {}  # block -> (group, prefix key)

    def allocate_prefix(self, request: int, tokens: list[int]) -> int:
        """Give a new ``request`` (``tokens``: all it knows so far) the longest cached prefix
        every group accepts; return its length in tokens, which count as computed."""
        keys = prefix_keys(tokens, self.block_size)
        found = [({i for i, key in enumerate(keys) if (group, key) in self.cached}, window)
                 for group, window in enumerate(self.windows)]
        hit = self.find_hit(found, len(tokens), self.block_size)
        tables = []
        for group, window in enumerate(self.windows):
            unseen = 0 if window is None else skipped_tokens(hit, window) // self.block_size
            table = [NULL_BLOCK] * min(unseen, hit // self.block_size)
            for index in range(len(table), hit // self.block_size):
                block = self.cached[group, keys[index]]
                if self.references[block] == 0:
                    del self.free_blocks[block]
                self.references[block] += 1
                table.append(block)
            tables.append(table)
        self.tables[request] = tables
        return hit

    def cache_full_blocks(self, request: int, tokens: list[int], num_computed: int) -> None:
        """Cache, in every group, each block of ``request`` whose tokens are all computed and
        that is not cached yet (a block another request cached first under the same key
        stays the one found)."""
        full = num_computed // self.block_size
        keys = prefix_keys(tokens[:full * self.block_size], self.block_size)
        for group, table in enumerate(self.tables[request]):
            for block, key in zip(table[:full], keys, strict=True):
                if block != NULL_BLOCK and block not in self.key_of \
                        and (group, key) not in self.cached:
                    self.cached[group, key] = block
                    self.key_of[block] = (group, key)

    def num_free(self) -> int:
        return len(self.free_blocks)

    def _take(self) -> int:
        block, _ = self.free_blocks.popitem(last=False)
        if block in self.key_of:  # evicted: its contents are about to change
            del self.cached[self.key_of.pop(block)]
        self.references[block] = 1
        return block

    def _give_back(self, blocks: list[int]) -> None:
        for block in blocks:
            self.references[block] -= 1
            if self.references[block] == 0:
                self.free_blocks[block] = None
