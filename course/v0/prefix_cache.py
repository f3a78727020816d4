"""Chapter 4's reference: chained block hashes and a prefix-caching BlockManager.

Answers are the bodies between ``### BEGIN SOLUTION`` and ``### END SOLUTION``: chapter 4's
notebook renders its cells from them, and a learner edition replaces them with stubs.

A full block's key chains its parent's key, so it names the whole prefix up to its end::

    tokens    [ t0 .. t15 ][ t16 .. t31 ][ t32 .. t40 ]      block size 16
    key       k0 = H(ROOT, t0..t15, extra)                    a partial last block
              k1 = H(k0, t16..t31, extra)                     has no key
    The same 16 tokens after a different prefix get a different key, as they must: their
    keys and values differ (attention mixed in everything before them).

This manager follows vLLM's v1 design: only full blocks are shared, through the cache; a freed
block keeps its key (evictable, lazily) until the pool reuses it; the free queue is LRU, and a
sequence's blocks are freed tail first, so its prefix outlives its tail. There is no fork or
copy-on-write here (chapter 3 covered those).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict

from course.language import tr
from course.v0.block_manager import NoFreeBlocksError

ROOT_KEY = hashlib.sha256(b"paged-kv-course prefix cache root").hexdigest()


def block_key(parent_key: str, tokens: list[int], extra_keys: tuple = ()) -> str:
    """sha256 of a canonical encoding of (parent key, the block's tokens, extra keys), as a hex
    string.

    ``parent_key`` is a hex string, ``tokens`` a list of ints, ``extra_keys`` a tuple of strings
    (a LoRA adapter's name, a cache salt). Inputs that differ anywhere get different keys, also
    when a value moves between ``tokens`` and ``extra_keys``; equal inputs get the same key in
    every process (so not Python's ``hash()``, which changes with ``PYTHONHASHSEED``).
    """
    ### BEGIN SOLUTION
    payload = json.dumps([parent_key, [int(t) for t in tokens], [str(e) for e in extra_keys]],
                         separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()
    ### END SOLUTION


def prefix_keys(tokens: list[int], block_size: int, extra_keys: tuple = ()) -> list[str]:
    """Keys of the full blocks of ``tokens``, chained from ``ROOT_KEY``; a partial last block
    has none."""
    ### BEGIN SOLUTION
    keys, parent = [], ROOT_KEY
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = block_key(parent, tokens[start:start + block_size], extra_keys)
        keys.append(parent)
    return keys
    ### END SOLUTION


class PrefixCachingBlockManager:
    """Blocks on demand, with full blocks cached by key and reused by later prompts.

    Contracts: ``allocate`` reuses the longest run of cached blocks from the start of the
    prompt (at most (n - 1) // block_size of them, so the last token is always computed),
    takes the rest fresh, all or nothing, and returns how many prompt tokens were hits; a block
    is cached as soon as it is full; a block whose count drops to zero stays cached and becomes
    evictable, least recently used first; taking a fresh block takes the least recently used
    free block, cached or not (so it may evict a cached block while never-used ones wait), and
    an evicted block forgets its key.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Every block with no reference, least recently used first: never-used blocks, and
        # cached blocks waiting to be reused (evictable). O(1) to pop, append or remove.
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.ref_counts = [0] * num_blocks
        self.cache: dict[str, int] = {}  # key -> block
        self.keys: dict[int, str] = {}  # block -> key, for cached blocks
        self.tables: dict[int, list[int]] = {}
        self.tokens: dict[int, list[int]] = {}
        self.extra: dict[int, tuple] = {}
        self.seq_keys: dict[int, list[str]] = {}  # keys of each sequence's full blocks

    def block_table(self, seq_id: int) -> list[int]:
        return list(self.tables[seq_id])

    def seq_len(self, seq_id: int) -> int:
        return len(self.tokens[seq_id])

    def ref_count(self, block: int) -> int:
        return self.ref_counts[block]

    def num_free_blocks(self) -> int:
        """Blocks that can be handed out: never used, or cached and evictable."""
        return len(self.free_queue)

    def is_cached(self, block: int) -> bool:
        return block in self.keys

    def evictable_blocks(self) -> list[int]:
        """Cached blocks with no reference, least recently used first."""
        return [b for b in self.free_queue if b in self.keys]

    def _cache_full_blocks(self, seq_id: int) -> None:
        """Key the sequence's newly full blocks and cache each one whose key is new.

        Keys chain from the sequence's own tokens, so they are right even for a block whose
        twin another sequence cached first (that block just stays uncached: no de-duplication).
        """
        keys, tokens, size = self.seq_keys[seq_id], self.tokens[seq_id], self.block_size
        while (len(keys) + 1) * size <= len(tokens):
            start = len(keys) * size
            keys.append(block_key(keys[-1] if keys else ROOT_KEY,
                                  tokens[start:start + size], self.extra[seq_id]))
            block = self.tables[seq_id][len(keys) - 1]
            if keys[-1] not in self.cache and block not in self.keys:
                self.cache[keys[-1]] = block
                self.keys[block] = keys[-1]

    def _release_block(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free_queue[block] = None  # most recently used end

    def check_invariants(self) -> None:
        holders = [0] * self.num_blocks
        for table in self.tables.values():
            for block in table:
                holders[block] += 1
        assert holders == self.ref_counts, tr("a reference count differs from the tables")
        assert all((count == 0) == (b in self.free_queue) for b, count in
                   enumerate(self.ref_counts)), tr("a block is free and used, or neither")
        assert all(self.keys[b] == k for k, b in self.cache.items()), tr("cache maps disagree")
        assert len(self.cache) == len(self.keys), tr("cache maps disagree")

    def _take_block(self) -> int:
        """The least recently used free block, evicted (its key forgotten) if it was cached."""
        ### BEGIN SOLUTION
        if not self.free_queue:
            raise NoFreeBlocksError("no free block")
        block, _ = self.free_queue.popitem(last=False)
        key = self.keys.pop(block, None)
        if key is not None:
            del self.cache[key]
        self.ref_counts[block] = 1
        return block
        ### END SOLUTION

    def allocate(self, seq_id: int, tokens: list[int], extra_keys: tuple = ()) -> int:
        """Allocate a new sequence's prompt, reusing cached blocks; return the hit tokens.

        An id that already has blocks raises ``ValueError``. Hits are the longest run of cached
        blocks from the start (at most (n - 1) // block_size). If the fresh blocks plus the
        revived hits (hits with no reference: they leave the free queue) outnumber the free
        blocks, ``NoFreeBlocksError`` and nothing changes. Otherwise the hits are revived
        first, then the fresh blocks taken: taken first, a fresh block could evict a hit.
        """
        ### BEGIN SOLUTION
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id} already has blocks")
        keys = prefix_keys(tokens, self.block_size, extra_keys)
        max_hits = (len(tokens) - 1) // self.block_size if tokens else 0
        hits = []
        for key in keys[:max_hits]:
            if key not in self.cache:
                break
            hits.append(self.cache[key])
        needed = -(-len(tokens) // self.block_size) - len(hits)
        revived = sum(1 for b in hits if self.ref_counts[b] == 0)
        if needed + revived > len(self.free_queue):
            raise NoFreeBlocksError(f"sequence {seq_id} needs {needed} new and {revived} "
                                    f"revived blocks, {len(self.free_queue)} are free")
        for block in hits:
            if self.ref_counts[block] == 0:
                del self.free_queue[block]  # revived: no longer evictable
            self.ref_counts[block] += 1
        self.tables[seq_id] = hits + [self._take_block() for _ in range(needed)]
        self.tokens[seq_id] = list(tokens)
        self.extra[seq_id] = tuple(extra_keys)
        self.seq_keys[seq_id] = []
        self._cache_full_blocks(seq_id)
        return len(hits) * self.block_size
        ### END SOLUTION

    def append_slot(self, seq_id: int, token: int) -> tuple[int, int]:
        """Add one generated token; return (block, offset) for its K and V."""
        ### BEGIN SOLUTION
        table, length = self.tables[seq_id], len(self.tokens[seq_id])
        offset = length % self.block_size
        if offset == 0:
            table.append(self._take_block())
        self.tokens[seq_id].append(token)
        self._cache_full_blocks(seq_id)
        return table[-1], offset
        ### END SOLUTION

    def free(self, seq_id: int) -> None:
        """Drop the sequence; its blocks, tail first, become free (cached ones evictable)."""
        ### BEGIN SOLUTION
        if seq_id not in self.tables:
            raise KeyError(f"sequence {seq_id} is unknown or already freed")
        for block in reversed(self.tables.pop(seq_id)):
            self._release_block(block)
        del self.tokens[seq_id], self.extra[seq_id], self.seq_keys[seq_id]
        ### END SOLUTION
