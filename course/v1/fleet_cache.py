"""Chapter 14: the KV cache of an engine in a fleet.

Chapter 9's ``KVCacheCoordinator`` with two changes, both vLLM's: blocks are named by the
fleet's hash (``course.v1.block_hash``: canonical CBOR and SHA-256 from a shared seed, a
tenant's ``cache_salt`` folded into the first block), and the pool records what its prefix
cache gains and loses as KV events (``course.v1.kv_events``), which the engine takes after
each step and publishes (``take_events``, as vLLM's ``BlockPool.take_events``):

* a block cached under a hash no block had: ``BlockStored`` (one event per run of blocks a
  request caches together, with the hash of the block before them as parent);
* a cached block taken for other tokens: ``BlockRemoved``;
* the cache emptied (``reset``): ``AllBlocksCleared``.

A block cached under a hash another block already has is not stored (chapter 9's rule) and
raises no event.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import islice
from typing import Any

from course.v1.block_hash import FLEET_SEED, none_hash, request_block_hashes
from course.v1.kv_coordinator import BlockPool, KVCacheCoordinator, Request
from course.v1.kv_events import AllBlocksCleared, BlockRemoved, BlockStored


class EventBlockPool(BlockPool):
    """Chapter 9's pool, noting each block cached (``stored``, in order) and each cached block
    evicted (``removed``)."""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.stored: list[bytes] = []
        self.removed: list[bytes] = []

    def get_new_blocks(self, count: int) -> list[int]:
        evicted = [self.key_of[block][1] for block in islice(self.free_queue, count)
                   if block in self.key_of]
        blocks = super().get_new_blocks(count)
        self.removed.extend(evicted)
        return blocks

    def cache_block(self, group: int, key: Any, block: int) -> None:
        before = len(self.cached)
        super().cache_block(group, key, block)
        if len(self.cached) > before:
            self.stored.append(key)


class FleetKVCacheCoordinator(KVCacheCoordinator):
    """The KV cache of one engine of a fleet whose engines share ``seed``
    (``course.v1.block_hash.FLEET_SEED`` unless told otherwise), hashing blocks with
    ``hasher`` (the chapter's ``request_block_hashes``; a notebook gives its own)."""

    def __init__(self, num_blocks: int, block_size: int,
                 windows: Sequence[int | None] = (None,), enable_caching: bool = True,
                 seed: str = FLEET_SEED,
                 hasher: Callable[..., list[bytes]] = request_block_hashes) -> None:
        super().__init__(num_blocks, block_size, windows, enable_caching)
        self.pool = EventBlockPool(num_blocks)
        self.managers = [self.manager_for(group, window) for group, window in enumerate(windows)]
        self.first_parent = none_hash(seed)
        self.hasher = hasher
        self.events: list[Any] = []

    def hash_blocks(self, request: Request, tokens: list[int]) -> list[bytes]:
        return self.hasher(tokens, self.block_size, self.first_parent,
                           cache_salt=getattr(request, "cache_salt", None))

    def cache_blocks(self, request: Request) -> None:
        """Chapter 9's ``cache_blocks``, then a ``BlockStored`` for each run of blocks it
        cached."""
        self.note_removed()
        super().cache_blocks(request)
        if not self.pool.stored:
            return
        tokens = request.tokens
        keys = self.keys[request.id][1]
        position = {key: index for index, key in enumerate(keys)}
        runs: list[list[int]] = []
        for index in sorted(position[key] for key in self.pool.stored):
            if runs and runs[-1][-1] == index - 1:
                runs[-1].append(index)
            else:
                runs.append([index])
        for run in runs:
            first, last = run[0], run[-1]
            self.events.append(BlockStored(
                block_hashes=[keys[i] for i in run],
                parent_block_hash=keys[first - 1] if first else None,
                token_ids=tokens[first * self.block_size:(last + 1) * self.block_size],
                block_size=self.block_size))
        self.pool.stored.clear()

    def note_removed(self) -> None:
        if self.pool.removed:
            self.events.append(BlockRemoved(block_hashes=list(self.pool.removed)))
            self.pool.removed.clear()

    def take_events(self) -> list[Any]:
        """The events since they were last taken, in the order they happened."""
        self.note_removed()
        events, self.events = self.events, []
        return events

    def cached_hashes(self) -> set[bytes]:
        """Every hash the cache holds now (what its events, applied in order, describe)."""
        return {key for _, key in self.pool.cached}

    def reset(self) -> None:
        """Empty the prefix cache (vLLM's ``reset_prefix_cache``): every block's hash is
        forgotten; blocks held by requests stay theirs."""
        self.pool.cached.clear()
        self.pool.key_of.clear()
        self.pool.removed.clear()
        self.events.append(AllBlocksCleared())
