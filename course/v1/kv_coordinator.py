"""The KV cache behind the engine of chapters 9 on, in vLLM V1's shape: one pool of blocks,
one manager per KV-cache group, and a coordinator the scheduler asks for prefix hits and for
room (``vllm/v1/core/kv_cache_coordinator.py``, ``single_type_kv_cache_manager.py``,
``block_pool.py``, vLLM 0.34.0)::

    scheduler ── get_computed_tokens(request) ──> KVCacheCoordinator
              ── allocate_slots(request, n) ────>     managers: one per group, each a table
              ── cache_blocks(request) ─────────>     per request; they differ only in their
              ── free(request) ─────────────────>     hit rule and the blocks they skip
                                                      pool: BlockPool, shared by every group

A model's layers fall into groups by the kind of attention they run. Chapter 9's model has
one group, full attention (``FullAttentionManager``); chapter 10 adds sliding-window groups
(``course.v1.hybrid_coordinator``), whose manager frees the blocks its window has left behind
and finds hits by its own rule. The scheduler sees none of it: it asks the coordinator.

Contracts. ``get_computed_tokens`` changes nothing: it finds the longest prefix, in whole
blocks and short of the request's last token, whose blocks every group has cached.
``allocate_slots(request, num_new)`` makes room for the request's next ``num_new`` tokens after
its ``num_computed_tokens``: a request it has not seen starts from its hit (its computed tokens
must be what ``get_computed_tokens`` found); first each group gives back the blocks it no
longer needs (those frees stand whatever follows), then the new blocks every group needs, and
the hit blocks no request holds, are taken all together or not at all (``False``: nothing
taken, and a new request gets no tables). ``cache_blocks`` caches a request's full blocks
whose K/V are computed, so a hit never reads a block still being written. ``free`` gives back
a request's blocks, the last first, so its prefix outlives its tail in the free queue.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

from course.v0.prefix_cache import prefix_keys

NULL_BLOCK = 0  # the pool's block 0: stands in a table for a block no longer needed


class Request(Protocol):
    """What the KV cache reads of a request (``course.v1.chunked_scheduler.ChunkedRequest``)."""

    id: int
    num_computed_tokens: int

    @property
    def tokens(self) -> list[int]: ...


def full_attention_hit(cached: set[int], max_length: int, block_size: int) -> int:
    """The longest cached prefix, in tokens, of at most ``max_length``: the run of cached
    blocks from block 0 (``cached``: the indices of the request's blocks found in the cache),
    read left to right."""
    blocks = 0
    while blocks < max_length // block_size and blocks in cached:
        blocks += 1
    return blocks * block_size


class BlockPool:
    """``num_blocks`` blocks, block 0 the null block (never handed out). A block no request
    holds waits in the free queue, least recently freed first, keeping its cache key until it
    is taken for other tokens (evicted)."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"a pool needs the null block and one more, got {num_blocks}")
        self.num_blocks = num_blocks
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        self.ref_counts = [0] * num_blocks
        self.cached: dict[tuple[int, str], int] = {}  # (group, prefix key) -> block
        self.key_of: dict[int, tuple[int, str]] = {}  # block -> (group, prefix key)

    def num_free(self) -> int:
        return len(self.free_queue)

    def get_new_blocks(self, count: int) -> list[int]:
        """``count`` blocks from the front of the free queue, each evicted from the cache."""
        if count > len(self.free_queue):
            raise ValueError(f"{count} blocks asked for, {len(self.free_queue)} free")
        blocks = []
        for _ in range(count):
            block, _ = self.free_queue.popitem(last=False)
            if block in self.key_of:  # its contents are about to change
                del self.cached[self.key_of.pop(block)]
            self.ref_counts[block] = 1
            blocks.append(block)
        return blocks

    def touch(self, blocks: Sequence[int]) -> None:
        """One more holder for each of ``blocks`` (a prefix hit): out of the free queue."""
        for block in blocks:
            if block != NULL_BLOCK:
                if self.ref_counts[block] == 0:
                    del self.free_queue[block]
                self.ref_counts[block] += 1

    def free_blocks(self, blocks: Sequence[int]) -> None:
        """One holder fewer for each of ``blocks``, in order; a block no one holds goes to the
        back of the free queue, its key kept."""
        for block in blocks:
            if block != NULL_BLOCK:
                self.ref_counts[block] -= 1
                if self.ref_counts[block] == 0:
                    self.free_queue[block] = None

    def cached_block(self, group: int, key: str) -> int | None:
        return self.cached.get((group, key))

    def cache_block(self, group: int, key: str, block: int) -> None:
        """Cache ``block`` under ``key`` in ``group``, unless the key is cached already (the
        first block cached under it stays the one found) or the block is."""
        if (group, key) not in self.cached and block not in self.key_of:
            self.cached[group, key] = block
            self.key_of[block] = (group, key)


class SingleTypeKVCacheManager:
    """One group's block tables over the shared ``pool``. A subclass sets the group's hit rule
    (``hit_length``, ``hit_blocks``) and the blocks it skips (``remove_skipped_blocks``)."""

    window: int | None = None

    def __init__(self, pool: BlockPool, group: int, block_size: int) -> None:
        self.pool, self.group, self.block_size = pool, group, block_size
        self.tables: dict[int, list[int]] = {}

    def cached_indices(self, keys: Sequence[str]) -> set[int]:
        """The indices of the request's full blocks (``keys``) this group has cached."""
        return {i for i, key in enumerate(keys) if self.pool.cached_block(self.group, key)
                is not None}

    def hit_length(self, cached: set[int], max_length: int) -> int:
        """The longest hit, in tokens, of at most ``max_length``, that this group accepts."""
        raise NotImplementedError

    def hit_blocks(self, keys: Sequence[str], hit: int) -> list[int]:
        """The table a new request starts with for a hit of ``hit`` tokens."""
        return [self.pool.cached[self.group, key] for key in keys[:hit // self.block_size]]

    def remove_skipped_blocks(self, request_id: int, num_computed: int) -> list[int]:
        """The blocks this group no longer needs once ``num_computed`` tokens are computed,
        taken out of the request's table (the pool takes them back)."""
        return []

    def blocks_held(self, num_computed: int, num_new: int) -> int:
        """The blocks a request holds in this group for a step that computes ``num_new``
        tokens after ``num_computed`` (with no prefix hit)."""
        return -(-(num_computed + num_new) // self.block_size)

    def num_blocks_to_allocate(self, request_id: int, num_tokens: int,
                               hit: Sequence[int]) -> int:
        """Blocks to take for the request to hold ``num_tokens`` tokens: new ones past its
        table (``hit`` for a new request), and the hit's blocks waiting in the free queue."""
        table = self.tables.get(request_id, hit)
        revived = sum(1 for b in hit if b != NULL_BLOCK and self.pool.ref_counts[b] == 0)
        return max(0, -(-num_tokens // self.block_size) - len(table)) + revived

    def start(self, request_id: int, hit: Sequence[int]) -> None:
        """A new request's table: its ``hit`` blocks, each one more holder."""
        self.pool.touch(hit)
        self.tables[request_id] = list(hit)

    def allocate(self, request_id: int, num_tokens: int) -> None:
        """New blocks for the request's table to hold ``num_tokens`` tokens."""
        table = self.tables[request_id]
        table += self.pool.get_new_blocks(max(0, -(-num_tokens // self.block_size) - len(table)))

    def cache_blocks(self, request_id: int, keys: Sequence[str]) -> None:
        """Cache the request's blocks whose ``keys`` are given (its full, computed ones)."""
        for block, key in zip(self.tables[request_id], keys, strict=False):
            if block != NULL_BLOCK:
                self.pool.cache_block(self.group, key, block)

    def free(self, request_id: int) -> None:
        """Give back every block of the request, the last first."""
        self.pool.free_blocks(list(reversed(self.tables.pop(request_id, []))))


class FullAttentionManager(SingleTypeKVCacheManager):
    """Full attention: every token's K/V stays needed, and a hit is the run of cached blocks
    from the first one."""

    def hit_length(self, cached: set[int], max_length: int) -> int:
        return full_attention_hit(cached, max_length, self.block_size)


class KVCacheCoordinator:
    """The KV cache of a model whose groups have ``windows`` (None: full attention), from one
    pool of ``num_blocks`` blocks of ``block_size`` tokens; with ``enable_caching`` False,
    nothing is cached and every request starts from its first token. A model with one group
    asks that group for its hit; chapter 10's ``HybridKVCacheCoordinator`` asks every group
    until they agree."""

    def __init__(self, num_blocks: int, block_size: int,
                 windows: Sequence[int | None] = (None,), enable_caching: bool = True) -> None:
        if block_size < 1 or not windows:
            raise ValueError("blocks of at least one token, and at least one group")
        self.block_size, self.windows = block_size, tuple(windows)
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks)
        self.managers = [self.manager_for(group, window) for group, window in enumerate(windows)]
        self.keys: dict[int, tuple[list[int], list[str]]] = {}  # id -> (tokens, their keys)
        # a drafter that reads the target's hidden state at each position (an EAGLE head,
        # chapter 12) needs the last block of a hit computed again
        self.use_eagle = False

    def manager_for(self, group: int, window: int | None) -> SingleTypeKVCacheManager:
        if window is not None:
            raise ValueError("a sliding-window group needs chapter 10's HybridKVCacheCoordinator")
        return FullAttentionManager(self.pool, group, self.block_size)

    def find_longest_cache_hit(self, cached: list[set[int]], num_tokens: int) -> int:
        """The longest hit, in tokens, every group accepts (``cached``: each group's cached
        block indices) for a request of ``num_tokens`` tokens: short of its last token."""
        if len(self.managers) != 1:
            raise ValueError("several groups: chapter 10's HybridKVCacheCoordinator")
        max_length = (num_tokens - 1) // self.block_size * self.block_size
        return self.managers[0].hit_length(cached[0], max_length)

    def most_blocks(self, prompt_len: int, num_tokens: int, chunk: int) -> int:
        """The most blocks a request of ``num_tokens`` tokens holds at once, in every group
        together, run alone: its first ``prompt_len`` in chunks of ``chunk``, then one a
        step. A pool that cannot hold them can never serve it."""
        steps, computed = [], 0
        while computed < num_tokens:
            new = min(chunk, prompt_len - computed) if computed < prompt_len else 1
            steps.append((computed, new))
            computed += new
        return max((sum(m.blocks_held(c, n) for m in self.managers) for c, n in steps),
                   default=0)

    def get_computed_tokens(self, request: Request) -> int:
        """The tokens of ``request``'s longest prefix hit (0 without caching; with
        ``use_eagle``, the longest a block shorter than that); nothing changes."""
        if not self.enable_caching or not request.tokens:
            return 0
        keys = self.block_keys(request, len(request.tokens) // self.block_size)
        cached = [m.cached_indices(keys) for m in self.managers]
        hit = self.find_longest_cache_hit(cached, len(request.tokens))
        if self.use_eagle and hit:
            # the longest hit a block shorter (vLLM drops the last matched block): the draft
            # head's K/V at a hit's last token were made from the token after it, which the
            # hit's key does not hold, and its hidden state must be computed again
            hit = self.find_longest_cache_hit(cached, hit - self.block_size + 1)
        return hit

    def allocate_slots(self, request: Request, num_new: int) -> bool:
        """Room for ``request``'s next ``num_new`` tokens after its ``num_computed_tokens``;
        ``True`` when made (the module's contract)."""
        computed = request.num_computed_tokens
        if num_new < 1 or computed < 0:
            raise ValueError(f"request {request.id}: {computed} tokens computed and {num_new} "
                             "new; a step computes at least one token after those computed")
        hits = [[] for _ in self.managers]
        if request.id not in self.managers[0].tables and computed:
            if computed != self.get_computed_tokens(request):
                raise ValueError(f"request {request.id} is new with {computed} tokens computed, "
                                 f"but its prefix hit is {self.get_computed_tokens(request)}")
            keys = self.block_keys(request, computed // self.block_size)
            hits = [m.hit_blocks(keys, computed) for m in self.managers]
        for manager in self.managers:
            self.pool.free_blocks(manager.remove_skipped_blocks(request.id, computed))
        needed = sum(m.num_blocks_to_allocate(request.id, computed + num_new, hit)
                     for m, hit in zip(self.managers, hits, strict=True))
        if needed > self.pool.num_free():
            return False
        if request.id not in self.managers[0].tables:
            # every group's hit is held before any new block is taken: taken first, a new
            # block could evict another group's hit from the free queue
            for manager, hit in zip(self.managers, hits, strict=True):
                manager.start(request.id, hit)
        for manager in self.managers:
            manager.allocate(request.id, computed + num_new)
        return True

    def cache_blocks(self, request: Request) -> None:
        """Cache, in every group, the request's full blocks whose tokens are all computed."""
        if self.enable_caching and request.id in self.managers[0].tables:
            full = min(request.num_computed_tokens, len(request.tokens)) // self.block_size
            keys = self.block_keys(request, full)
            for manager in self.managers:
                manager.cache_blocks(request.id, keys)

    def free(self, request: Request) -> None:
        """Give back every block ``request`` holds, in every group."""
        for manager in self.managers:
            manager.free(request.id)
        self.keys.pop(request.id, None)

    def block_keys(self, request: Request, count: int) -> list[str]:
        """The prefix keys of ``request``'s first ``count`` full blocks. A request's tokens only
        grow, so its keys are kept (as vLLM's request keeps its block hashes) and computed
        again only when it has more full blocks than they cover, or its tokens are not the
        ones they were computed from: once a block, not once a step, which made caching cost
        the square of a request's length."""
        tokens = request.tokens
        known = self.keys.get(request.id)
        if known is None or len(known[1]) < count or tokens[:len(known[0])] != known[0]:
            covered = tokens[:len(tokens) // self.block_size * self.block_size]
            known = (covered, self.hash_blocks(request, covered))
            self.keys[request.id] = known
        return known[1][:count]

    def hash_blocks(self, request: Request, tokens: list[int]) -> list[str]:
        """The keys of the full blocks of ``tokens``, a prefix of ``request``'s: chapter 4's
        chained keys (chapter 14's fleet hashes them as every engine of a fleet must)."""
        return prefix_keys(tokens, self.block_size)

    def block_table(self, request_id: int, group: int = 0) -> list[int]:
        return self.managers[group].tables[request_id]

    def num_free(self) -> int:
        return self.pool.num_free()

    def num_held(self) -> int:
        """Blocks some request holds (the null block aside)."""
        return self.pool.num_blocks - 1 - self.pool.num_free()
