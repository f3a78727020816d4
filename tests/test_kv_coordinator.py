"""The KV cache of chapters 9 to 11 (``course.v1.kv_coordinator``,
``course.v1.hybrid_coordinator``): the rules that were chapter 10's graded ``allocate_slots`` are
the library's now, and this file holds it to them.

* Scenarios built to reach each rule: the frees come before the counting (a step that fits
  only with the blocks its window frees succeeds), and stand when the step is refused; a step
  is all or none, and a new request refused gets no tables; a new request's hit blocks are
  all held before a new block is taken (in a pool where a block taken first would evict
  another group's hit); ``get_computed_tokens`` changes nothing and stops short of the last
  token; the free queue keeps a request's prefix longer than its tail.
* A hypothesis state machine over ``HybridKVCacheCoordinator`` (and chapter 9's coordinator of
  one group): drawn windows (None for full attention), block sizes and pools; requests that
  share prefixes, admitted from their hit, grown by drawn steps, cached, finished and
  preempted. After every rule the pool's books balance (each block's ref count is the number
  of tables holding it, a block is in the free queue exactly when that is 0, the null block is
  never handed out, the cache's two maps agree, a block held in one group only); each call is
  compared, down to the free queue's order, with a second reading of the rules written another
  way (``Reference``: tables of the pool's books, a hit found by trying every length), and a
  step's tokens read no null block in their windows.
* The library's coordinator changed one rule at a time (``MUTANTS``): each is caught.
"""

from __future__ import annotations

import copy
from collections import Counter, OrderedDict
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from course.v0.prefix_cache import prefix_keys
from course.v1.chunked_scheduler import ChunkedRequest
from course.v1.hybrid_cache import skipped_tokens
from course.v1.hybrid_coordinator import HybridKVCacheCoordinator, learners_kv_cache
from course.v1.kv_coordinator import (
    NULL_BLOCK,
    BlockPool,
    FullAttentionManager,
    KVCacheCoordinator,
)

# --- the pool's books, and a second reading of the rules ----------------------------------


@dataclass
class Books:
    """What a KV cache holds, in terms any two readings of the rules can compare exactly."""

    tables: dict[tuple[int, int], list[int]]  # (group, request) -> block table
    free: list[int]  # the free queue, its front first
    refs: list[int]  # block -> ref count
    cached: dict[tuple[int, str], int]  # (group, prefix key) -> block


def books(kv: KVCacheCoordinator) -> Books:
    return Books({(m.group, r): list(t) for m in kv.managers for r, t in m.tables.items()},
                 list(kv.pool.free_queue), list(kv.pool.ref_counts), dict(kv.pool.cached))


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


class Reference:
    """The rules read another way, on ``Books``: a hit is the longest length, tried one at a
    time from the longest, whose tokens before it that every group reads are all cached; a
    step's blocks are counted from the tables as the frees left them, and taken from the
    queue's front once the hit's are out of it."""

    def __init__(self, windows, block_size: int, enable_caching: bool = True) -> None:
        self.windows, self.block_size, self.caching = list(windows), block_size, enable_caching

    def _first_read(self, window: int | None, length: int) -> int:
        """The first position the token at ``length`` reads."""
        return 0 if window is None else max(0, length - window + 1)

    def hit(self, b: Books, tokens: list[int]) -> int:
        if not self.caching or not tokens:
            return 0
        size, keys = self.block_size, prefix_keys(tokens, self.block_size)
        for length in range((len(tokens) - 1) // size * size, 0, -size):
            if all((group, keys[p // size]) in b.cached
                   for group, window in enumerate(self.windows)
                   for p in range(self._first_read(window, length), length)):
                return length
        return 0

    def _release(self, b: Books, block: int) -> None:
        b.refs[block] -= 1
        if b.refs[block] == 0:
            b.free.append(block)

    def allocate(self, b: Books, request: int, tokens: list[int], computed: int,
                 num_new: int) -> bool:
        size, groups = self.block_size, range(len(self.windows))
        new = (0, request) not in b.tables
        if new:
            keys = prefix_keys(tokens, size)
            tables = []
            for group, window in enumerate(self.windows):
                unseen = self._first_read(window, computed) // size
                tables.append([NULL_BLOCK if i < unseen else b.cached[group, keys[i]]
                               for i in range(computed // size)])
        else:
            tables = [b.tables[group, request] for group in groups]
            for table, window in zip(tables, self.windows, strict=True):
                if window is not None:
                    for i in range(min(skipped_tokens(computed, window) // size, len(table))):
                        if table[i] != NULL_BLOCK:
                            self._release(b, table[i])
                            table[i] = NULL_BLOCK
        revived = [x for t in tables for x in t if x != NULL_BLOCK and b.refs[x] == 0] \
            if new else []
        counts = [max(0, _blocks(computed + num_new, size) - len(t)) for t in tables]
        if sum(counts) + len(revived) > len(b.free):
            return False
        for table in tables if new else []:
            for block in table:
                if block != NULL_BLOCK:
                    if b.refs[block] == 0:
                        b.free.remove(block)
                    b.refs[block] += 1
        for table, count in zip(tables, counts, strict=True):
            for _ in range(count):
                block = b.free.pop(0)
                b.cached = {k: v for k, v in b.cached.items() if v != block}
                b.refs[block] = 1
                table.append(block)
        for group, table in enumerate(tables):
            b.tables[group, request] = table
        return True

    def cache(self, b: Books, request: int, tokens: list[int], computed: int) -> None:
        if not self.caching or (0, request) not in b.tables:
            return
        full = min(computed, len(tokens)) // self.block_size
        keys = prefix_keys(tokens[:full * self.block_size], self.block_size)
        for group in range(len(self.windows)):
            for block, key in zip(b.tables[group, request], keys, strict=False):
                if block != NULL_BLOCK and (group, key) not in b.cached \
                        and block not in b.cached.values():
                    b.cached[group, key] = block

    def free(self, b: Books, request: int) -> None:
        for group in range(len(self.windows)):
            for block in reversed(b.tables.pop((group, request), [])):
                if block != NULL_BLOCK:
                    self._release(b, block)


def check_books(kv: KVCacheCoordinator) -> None:
    """The pool's books balance: see the module's docstring."""
    pool = kv.pool
    held = Counter(b for m in kv.managers for t in m.tables.values() for b in t)
    assert pool.ref_counts[NULL_BLOCK] == 0 and NULL_BLOCK not in pool.free_queue
    assert NULL_BLOCK not in pool.key_of
    for block in range(1, pool.num_blocks):
        assert pool.ref_counts[block] == held[block], (block, pool.ref_counts, held)
        assert (block in pool.free_queue) == (held[block] == 0), (block, pool.free_queue)
    assert len(pool.free_queue) + sum(1 for b in held if b != NULL_BLOCK) \
        == pool.num_blocks - 1
    assert len(pool.cached) == len(pool.key_of)
    assert all(pool.cached[key] == block for block, key in pool.key_of.items())
    requests = set(kv.managers[0].tables)
    for manager in kv.managers:
        assert set(manager.tables) == requests  # a request has a table in every group, or none
        for table in manager.tables.values():
            assert len(set(table) - {NULL_BLOCK}) == len(table) - table.count(NULL_BLOCK)
            nulls = table.count(NULL_BLOCK)
            assert table[:nulls] == [NULL_BLOCK] * nulls  # the null blocks stand in front
            assert manager.window is not None or nulls == 0
            for block in table[nulls:]:
                owner = pool.key_of.get(block)
                assert owner is None or owner[0] == manager.group, (block, owner)
    owners = [{m.group for m in kv.managers if any(b in t for t in m.tables.values())}
              for b in held if b != NULL_BLOCK]
    assert all(len(groups) == 1 for groups in owners)


def read_blocks_held(kv: KVCacheCoordinator, request: ChunkedRequest, num_new: int) -> None:
    """Every key the step's tokens read (their windows' under a sliding window) is in a block
    the request's table holds: no null block, none the pool took back."""
    start, size = request.num_computed_tokens, kv.block_size
    for manager in kv.managers:
        table = manager.tables[request.id]
        assert len(table) == _blocks(start + num_new, size)
        for position in range(start, start + num_new):
            first = 0 if manager.window is None else max(0, position - manager.window + 1)
            for key in range(first, position + 1):
                assert table[key // size] != NULL_BLOCK, (manager.group, position, key, table)
                assert kv.pool.ref_counts[table[key // size]] >= 1


def _request(request_id: int, tokens: list[int], computed: int = 0) -> ChunkedRequest:
    return ChunkedRequest(request_id, list(tokens), 100, num_computed_tokens=computed)


def _computed_and_cached(kv: KVCacheCoordinator, tokens: list[int]) -> ChunkedRequest:
    """Request 0 of ``tokens``, all of them computed in one step and cached."""
    request = _request(0, tokens)
    assert kv.allocate_slots(request, len(tokens))
    request.num_computed_tokens = len(tokens)
    kv.cache_blocks(request)
    return request


# --- the pool ---------------------------------------------------------------------------------


def test_a_pool_hands_out_blocks_from_the_front_of_its_free_queue_never_the_null_block():
    pool = BlockPool(5)
    assert list(pool.free_queue) == [1, 2, 3, 4] and pool.num_free() == 4
    assert pool.get_new_blocks(2) == [1, 2] and pool.ref_counts == [0, 1, 1, 0, 0]
    pool.cache_block(0, "a", 1)
    pool.cache_block(0, "a", 2)  # the first block cached under a key stays the one found
    pool.cache_block(1, "b", 1)  # a block is cached under one key only
    assert pool.cached == {(0, "a"): 1} and pool.key_of == {1: (0, "a")}
    pool.free_blocks([2, 1])
    assert list(pool.free_queue) == [3, 4, 2, 1] and pool.cached_block(0, "a") == 1
    pool.touch([NULL_BLOCK, 1])  # a hit on a free block takes it out of the queue, kept cached
    assert list(pool.free_queue) == [3, 4, 2] and pool.ref_counts[1] == 1
    pool.touch([1])
    pool.free_blocks([1, NULL_BLOCK])
    assert pool.ref_counts[1] == 1 and 1 not in pool.free_queue
    pool.free_blocks([1])
    assert pool.get_new_blocks(4) == [3, 4, 2, 1] and pool.cached == {} == pool.key_of
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)
    with pytest.raises(ValueError):
        BlockPool(1)


def test_a_finished_requests_prefix_outlives_its_tail_in_the_free_queue():
    kv = HybridKVCacheCoordinator(9, 2, [None, 3])
    request = _request(0, list(range(8)))
    assert kv.allocate_slots(request, 8)
    full, sliding = (list(kv.block_table(0, group)) for group in (0, 1))
    kv.free(request)
    assert list(kv.pool.free_queue) == full[::-1] + sliding[::-1]


# --- allocate_slots's rules, each reached by a scenario -----------------------------------


def test_the_window_frees_before_the_step_is_counted_and_the_step_fits_thanks_to_it(
        kv_class=HybridKVCacheCoordinator):
    """A pool of 3 blocks and the null block, blocks of 1, full attention beside a window of
    1: the second token fits only with the block the first one's window left behind."""
    kv = kv_class(4, 1, [None, 1])
    request = _request(0, [5, 6, 7])
    assert kv.allocate_slots(request, 1) is True and kv.num_free() == 1
    request.num_computed_tokens = 1
    assert kv.allocate_slots(request, 1) is True
    assert kv.block_table(0, 1)[0] == NULL_BLOCK and kv.num_free() == 0
    check_books(kv)


def test_the_windows_frees_stand_when_the_step_is_refused(kv_class=HybridKVCacheCoordinator):
    """Two full groups and a window of 1 in 3 blocks: the second token needs a block in each
    group, 3, with 1 free even once the window's block is back: refused, and the window's
    block stays freed, the full groups' tables as they were."""
    kv = kv_class(4, 1, [None, None, 1])
    request = _request(0, [5, 6, 7])
    assert kv.allocate_slots(request, 1) is True and kv.num_free() == 0
    full = [list(kv.block_table(0, group)) for group in (0, 1)]
    sliding = kv.block_table(0, 2)[0]
    request.num_computed_tokens = 1
    assert kv.allocate_slots(request, 1) is False
    assert kv.block_table(0, 2) == [NULL_BLOCK] and list(kv.pool.free_queue) == [sliding]
    assert [kv.block_table(0, group) for group in (0, 1)] == full
    check_books(kv)


def test_a_step_is_all_or_none_and_a_new_request_refused_gets_no_tables(
        kv_class=HybridKVCacheCoordinator):
    """Two groups in 5 blocks: a second request of 6 tokens (3 blocks in each group) would fit
    one group, not both: nothing taken, no table in any group; nor for a step of a running
    request (its tables as they were)."""
    kv = kv_class(6, 2, [None, 4])
    first = _request(0, list(range(4)))
    assert kv.allocate_slots(first, 4) is True and kv.num_free() == 1
    before = books(kv)
    assert kv.allocate_slots(_request(1, list(range(10, 16))), 6) is False
    assert books(kv) == before and all(1 not in m.tables for m in kv.managers)
    first.num_computed_tokens = 4
    assert kv.allocate_slots(first, 2) is False  # window 4 frees nothing at 4 tokens
    assert books(kv) == before
    check_books(kv)


def _hit_scenario(kv_class) -> tuple[KVCacheCoordinator, ChunkedRequest, list[int]]:
    """8 usable blocks of 2 tokens, full attention beside a window of 3. Request 0's 8 tokens
    are cached in both groups and freed: the free queue is its full group's blocks, then its
    sliding group's, the last first. Request 1 shares its 8 tokens and has one more: its hit
    of 8 revives 4 full blocks and the window's last, and it takes a new block in each group
    (7 of 8). Taken first, a new block would come from the queue's front: a block of the
    full group's hit, evicted for another table."""
    kv = kv_class(9, 2, [None, 3])
    first = _computed_and_cached(kv, list(range(8)))
    kv.free(first)
    second = _request(1, [*range(8), 99])
    hit_blocks = [kv.pool.cached[group, key] for group in (0, 1)
                  for key in prefix_keys(second.tokens, 2)]
    assert list(kv.pool.free_queue)[:4] == hit_blocks[:4][::-1]  # the full group's hit first
    return kv, second, hit_blocks


def test_a_new_requests_hit_blocks_are_held_before_any_new_block_is_taken(
        kv_class=HybridKVCacheCoordinator):
    kv, second, hit_blocks = _hit_scenario(kv_class)
    before = books(kv)
    second.num_computed_tokens = kv.get_computed_tokens(second)
    assert second.num_computed_tokens == 8 and books(kv) == before
    assert kv.allocate_slots(second, 1) is True
    full, sliding = kv.block_table(1, 0), kv.block_table(1, 1)
    assert full[:4] == hit_blocks[:4]
    assert sliding[:4] == [NULL_BLOCK] * 3 + [hit_blocks[7]]
    assert all(kv.pool.cached.get((group, key)) == block
               for group, table in ((0, full), (1, sliding))
               for key, block in zip(prefix_keys(second.tokens, 2), table, strict=False)
               if block != NULL_BLOCK)
    assert kv.num_free() == 1
    check_books(kv)


def test_get_computed_tokens_changes_nothing_and_never_reaches_the_last_token(
        kv_class=HybridKVCacheCoordinator):
    """Every block of an 8-token request cached: a request of the same 8 tokens hits 6 (its
    last token is computed), one of 9 hits 8; nothing in the pool changes, its free queue's
    order neither."""
    kv = kv_class(12, 2, [None, 3])
    first = _computed_and_cached(kv, list(range(8)))
    kv.free(first)
    before = books(kv)
    assert kv.get_computed_tokens(_request(1, list(range(8)))) == 6
    assert kv.get_computed_tokens(_request(2, list(range(9)))) == 8
    assert kv.get_computed_tokens(_request(3, list(range(7)))) == 6
    assert kv.get_computed_tokens(_request(4, [0])) == 0
    assert books(kv) == before


def test_blocks_are_cached_once_their_tokens_are_computed(kv_class=HybridKVCacheCoordinator):
    """A request's blocks, room made for all 8 tokens but 3 computed: only its first block is
    cached (a hit never reads a block still being written); at 8, all four, in both groups."""
    kv = kv_class(12, 2, [None, 3])
    request = _request(0, list(range(8)))
    assert kv.allocate_slots(request, 8)
    request.num_computed_tokens = 3
    kv.cache_blocks(request)
    assert sorted(group for group, _ in kv.pool.cached) == [0, 1]
    request.num_computed_tokens = 8
    kv.cache_blocks(request)
    assert len(kv.pool.cached) == 8


def test_a_requests_block_keys_are_kept_as_it_grows_and_made_again_for_other_tokens():
    """The keys a request's blocks are cached and found by are its tokens' prefix keys at every
    length, however it grew; a request of the same id with other tokens gets its own."""
    kv = KVCacheCoordinator(16, 2)
    request = _request(0, [5, 6, 7])
    for length in range(3, 11):
        assert kv.block_keys(request, length // 2) == prefix_keys(request.tokens, 2)
        request.output.append(length)
    other = _request(0, [9, 9, 9, 9, 9])
    assert kv.block_keys(other, 2) == prefix_keys(other.tokens, 2)
    kv.free(other)
    assert kv.keys == {}


def test_without_caching_nothing_is_cached_or_hit():
    kv = HybridKVCacheCoordinator(12, 2, [None, 3], enable_caching=False)
    request = _request(0, list(range(8)))
    assert kv.allocate_slots(request, 8)
    request.num_computed_tokens = 8
    kv.cache_blocks(request)
    assert kv.pool.cached == {} and kv.get_computed_tokens(_request(1, list(range(9)))) == 0


@pytest.mark.parametrize(("computed", "num_new"), [(-1, 2), (0, 0), (2, -1)])
def test_a_step_of_no_token_or_before_the_first_is_refused_and_changes_nothing(computed,
                                                                               num_new):
    kv = HybridKVCacheCoordinator(12, 2, [None, 3])
    running = _request(0, list(range(8)))
    assert kv.allocate_slots(running, 6)
    before = books(kv)
    for request in (running, _request(1, list(range(8)))):
        request.num_computed_tokens = computed
        with pytest.raises(ValueError):
            kv.allocate_slots(request, num_new)
        assert books(kv) == before


def test_a_new_request_must_start_from_its_hit():
    kv = HybridKVCacheCoordinator(12, 2, [None, 3])
    _computed_and_cached(kv, list(range(8)))
    before = books(kv)
    with pytest.raises(ValueError, match="prefix hit is 6"):
        kv.allocate_slots(_request(1, list(range(8)), computed=4), 2)
    assert books(kv) == before


def test_chapter_9s_coordinator_holds_one_full_attention_group():
    with pytest.raises(ValueError, match="HybridKVCacheCoordinator"):
        KVCacheCoordinator(8, 2, [None, 4])
    kv = KVCacheCoordinator(8, 2, [None, None])
    assert all(isinstance(m, FullAttentionManager) for m in kv.managers)
    with pytest.raises(ValueError, match="several groups"):
        kv.get_computed_tokens(_request(0, [1, 2, 3]))
    with pytest.raises(ValueError):
        KVCacheCoordinator(8, 2, [])
    with pytest.raises(ValueError):
        HybridKVCacheCoordinator(8, 2, [0])


# --- the state machine ----------------------------------------------------------------------


class CoordinatorMachine(RuleBasedStateMachine):
    """Requests on a KV cache of ``kv_class``, each call compared with ``Reference``."""

    kv_class: type[KVCacheCoordinator] = HybridKVCacheCoordinator
    windows = st.lists(st.one_of(st.none(), st.integers(1, 9)), min_size=1, max_size=3)

    def __init__(self) -> None:
        super().__init__()
        self.kv: KVCacheCoordinator | None = None
        self.requests: dict[int, ChunkedRequest] = {}
        self.next_id = 0

    @initialize(data=st.data(), block_size=st.integers(1, 4), num_blocks=st.integers(2, 24),
                caching=st.sampled_from([True, True, True, False]),
                shared=st.lists(st.integers(0, 2), max_size=16))
    def start(self, data, block_size, num_blocks, caching, shared) -> None:
        drawn = data.draw(self.windows)
        self.kv = self.kv_class(num_blocks, block_size, drawn, caching)
        self.reference = Reference(drawn, block_size, caching)
        self.books = books(self.kv)
        self.shared = shared  # the prefix requests share, from a few tokens: many hits

    # --- which requests -------------------------------------------------------------------

    def running(self) -> list[ChunkedRequest]:
        return [r for r in self.requests.values() if (0, r.id) in self.books.tables]

    def waiting(self) -> list[ChunkedRequest]:
        return [r for r in self.requests.values() if (0, r.id) not in self.books.tables]

    def same(self) -> None:
        assert books(self.kv) == self.books, (books(self.kv), self.books)

    def step(self, request: ChunkedRequest, num_new: int) -> None:
        """allocate_slots against the reference; a step made is computed, a new request
        refused starts again from nothing."""
        new = (0, request.id) not in self.books.tables
        expected = self.reference.allocate(self.books, request.id, request.tokens,
                                           request.num_computed_tokens, num_new)
        made = self.kv.allocate_slots(request, num_new)
        assert made is expected, (made, expected)
        self.same()
        if made:
            read_blocks_held(self.kv, request, num_new)
            request.num_computed_tokens += num_new
        elif new:
            assert all(request.id not in m.tables for m in self.kv.managers)
            request.num_computed_tokens = 0

    # --- rules ----------------------------------------------------------------------------

    @precondition(lambda self: self.kv is not None and len(self.requests) < 6)
    @rule(prefix=st.integers(0, 16), own=st.lists(st.integers(3, 40), max_size=6))
    def add(self, prefix: int, own: list[int]) -> None:
        prompt = (self.shared[:prefix] + own) or [3]
        self.requests[self.next_id] = ChunkedRequest(self.next_id, prompt, 100)
        self.next_id += 1

    @precondition(lambda self: self.kv is not None and self.waiting())
    @rule(pick=st.integers(0, 5), size=st.integers(1, 12))
    def admit(self, pick: int, size: int) -> None:
        """A waiting request (new, or preempted) from its hit, as chapter 9's scheduler
        admits one."""
        waiting = self.waiting()
        request = waiting[pick % len(waiting)]
        hit = self.kv.get_computed_tokens(request)
        self.same()  # nothing changes
        assert hit == self.reference.hit(self.books, request.tokens)
        assert hit % self.kv.block_size == 0 and 0 <= hit < request.num_tokens
        request.num_computed_tokens = hit
        self.step(request, min(size, request.num_tokens - hit))

    @precondition(lambda self: self.kv is not None and self.running())
    @rule(pick=st.integers(0, 5), size=st.integers(1, 9),
          generated=st.lists(st.integers(0, 40), min_size=9, max_size=9))
    def grow(self, pick: int, size: int, generated: list[int]) -> None:
        """The next ``size`` tokens of a running request (generated ones where its known
        tokens run out)."""
        running = self.running()
        request = running[pick % len(running)]
        request.output += generated[:max(0, request.num_computed_tokens + size
                                         - request.num_tokens)]
        self.step(request, size)

    @precondition(lambda self: self.kv is not None and self.running())
    @rule(pick=st.integers(0, 5))
    def cache(self, pick: int) -> None:
        running = self.running()
        request = running[pick % len(running)]
        self.reference.cache(self.books, request.id, request.tokens, request.num_computed_tokens)
        self.kv.cache_blocks(request)
        self.same()

    @precondition(lambda self: self.kv is not None and self.running())
    @rule(pick=st.integers(0, 5), finished=st.booleans())
    def free(self, pick: int, finished: bool) -> None:
        """A request finished (gone), or preempted by recompute (waiting, from nothing)."""
        running = self.running()
        request = running[pick % len(running)]
        self.reference.free(self.books, request.id)
        self.kv.free(request)
        self.same()
        request.num_computed_tokens = 0
        if finished:
            del self.requests[request.id]

    @precondition(lambda self: self.kv is not None and self.requests)
    @rule(pick=st.integers(0, 5), num_new=st.sampled_from([0, -1]))
    def bad_step(self, pick: int, num_new: int) -> None:
        requests = list(self.requests.values())
        request = requests[pick % len(requests)]
        with pytest.raises(ValueError):
            self.kv.allocate_slots(request, num_new)
        self.same()

    @precondition(lambda self: self.kv is not None and self.waiting())
    @rule(pick=st.integers(0, 5))
    def not_from_its_hit(self, pick: int) -> None:
        waiting = self.waiting()
        request = waiting[pick % len(waiting)]
        hit = self.reference.hit(self.books, request.tokens)
        request.num_computed_tokens = hit + self.kv.block_size
        if request.num_computed_tokens < request.num_tokens:
            with pytest.raises(ValueError):
                self.kv.allocate_slots(request, 1)
            self.same()
        request.num_computed_tokens = 0

    @invariant()
    def books_balance(self) -> None:
        if self.kv is not None:
            check_books(self.kv)
            for request in self.running():
                assert all(len(m.tables[request.id]) >= _blocks(request.num_computed_tokens,
                                                                self.kv.block_size)
                           for m in self.kv.managers)


class FullAttentionMachine(CoordinatorMachine):
    """Chapter 9's coordinator: one full-attention group."""

    kv_class = KVCacheCoordinator
    windows = st.just([None])


def _run(machine: type, examples: int, steps: int = 40, shrink: bool = True) -> None:
    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else [])
    run_state_machine_as_test(machine, settings=settings(
        max_examples=examples, stateful_step_count=steps, derandomize=True, database=None,
        deadline=None, phases=phases, suppress_health_check=list(HealthCheck)))


@pytest.mark.parametrize("machine", [CoordinatorMachine, FullAttentionMachine],
                         ids=["hybrid", "full attention"])
def test_drawn_runs_keep_the_books_and_follow_the_reference(machine):
    _run(machine, 120 if machine is CoordinatorMachine else 30)


# --- the rules, each broken alone, are caught -----------------------------------------------


class _CountsBeforeFreeing(HybridKVCacheCoordinator):
    def allocate_slots(self, request, num_new):
        computed = request.num_computed_tokens
        if request.id in self.managers[0].tables and num_new >= 1:
            needed = sum(m.num_blocks_to_allocate(request.id, computed + num_new, [])
                         for m in self.managers)
            if needed > self.pool.num_free():
                return False
        return super().allocate_slots(request, num_new)


class _UndoesTheFreesWhenRefused(HybridKVCacheCoordinator):
    def allocate_slots(self, request, num_new):
        saved = (copy.deepcopy([m.tables for m in self.managers]),
                 OrderedDict(self.pool.free_queue), list(self.pool.ref_counts))
        made = super().allocate_slots(request, num_new)
        if not made:
            for manager, tables in zip(self.managers, saved[0], strict=True):
                manager.tables = tables
            self.pool.free_queue, self.pool.ref_counts = saved[1], saved[2]
        return made


def _allocating(order: str):
    """allocate_slots whose new request takes its new blocks before holding its hit
    (``"new first"``), or holds and takes group by group (``"per group"``)."""

    class Coordinator(HybridKVCacheCoordinator):
        def allocate_slots(self, request, num_new):
            if (request.id in self.managers[0].tables or not request.num_computed_tokens
                    or num_new < 1
                    or request.num_computed_tokens != self.get_computed_tokens(request)):
                return super().allocate_slots(request, num_new)  # the rest as the library's
            total = request.num_computed_tokens + num_new
            keys = prefix_keys(request.tokens, self.block_size)
            hits = [m.hit_blocks(keys, request.num_computed_tokens) for m in self.managers]
            if sum(m.num_blocks_to_allocate(request.id, total, hit)
                   for m, hit in zip(self.managers, hits, strict=True)) > self.num_free():
                return False
            if order == "new first":
                fresh = [self.pool.get_new_blocks(max(0, _blocks(total, self.block_size)
                                                      - len(hit))) for hit in hits]
                for manager, hit, blocks in zip(self.managers, hits, fresh, strict=True):
                    manager.start(request.id, hit)
                    manager.tables[request.id] += blocks
            else:
                for manager, hit in zip(self.managers, hits, strict=True):
                    manager.start(request.id, hit)
                    manager.allocate(request.id, total)
            return True

    return Coordinator


class _TakesWhatFits(HybridKVCacheCoordinator):
    def allocate_slots(self, request, num_new):
        made = super().allocate_slots(request, num_new)
        if not made and request.id in self.managers[0].tables:
            total = request.num_computed_tokens + num_new
            for manager in self.managers:  # each group that fits alone
                if manager.num_blocks_to_allocate(request.id, total, []) <= self.num_free():
                    manager.allocate(request.id, total)
        return made


class _RefusedNewRequestKeepsEmptyTables(HybridKVCacheCoordinator):
    def allocate_slots(self, request, num_new):
        new = request.id not in self.managers[0].tables
        made = super().allocate_slots(request, num_new)
        if new and not made and not request.num_computed_tokens:
            for manager in self.managers:
                manager.tables[request.id] = []
        return made


class _CachesTokensNotComputed(HybridKVCacheCoordinator):
    def cache_blocks(self, request):
        keys = prefix_keys(request.tokens, self.block_size)
        if self.enable_caching and request.id in self.managers[0].tables:
            for manager in self.managers:
                manager.cache_blocks(request.id, keys)


class _FreesTheFirstBlockFirst(HybridKVCacheCoordinator):
    def free(self, request):
        for manager in self.managers:
            self.pool.free_blocks(manager.tables.pop(request.id, []))


class _HitReachesTheLastToken(HybridKVCacheCoordinator):
    def find_longest_cache_hit(self, cached, num_tokens):
        return super().find_longest_cache_hit(cached, num_tokens + 1)


class _HitHoldsItsBlocks(HybridKVCacheCoordinator):
    def get_computed_tokens(self, request):
        hit = super().get_computed_tokens(request)
        if hit:  # a block of the hit touched and given back: at the queue's end, if it was free
            block = next(iter(self.pool.cached.values()))
            self.pool.touch([block])
            self.pool.free_blocks([block])
        return hit


_WINDOW_NEVER_FREES = learners_kv_cache(free_skipped_blocks=lambda table, n, window, size: [])

_FREES_FIRST = test_the_window_frees_before_the_step_is_counted_and_the_step_fits_thanks_to_it
_FREES_STAND = test_the_windows_frees_stand_when_the_step_is_refused
_HITS_FIRST = test_a_new_requests_hit_blocks_are_held_before_any_new_block_is_taken
_ALL_OR_NONE = test_a_step_is_all_or_none_and_a_new_request_refused_gets_no_tables
_COMPUTED_ONLY = test_blocks_are_cached_once_their_tokens_are_computed
_HIT_CHANGES_NOTHING = test_get_computed_tokens_changes_nothing_and_never_reaches_the_last_token

MUTANTS = [  # (the library's coordinator with one rule broken, the scenario built for it)
    (_CountsBeforeFreeing, _FREES_FIRST),
    (_UndoesTheFreesWhenRefused, _FREES_STAND),
    (_allocating("new first"), _HITS_FIRST),
    (_allocating("per group"), _HITS_FIRST),
    (_TakesWhatFits, _ALL_OR_NONE),
    (_RefusedNewRequestKeepsEmptyTables, _ALL_OR_NONE),
    (_CachesTokensNotComputed, _COMPUTED_ONLY),
    (_HitReachesTheLastToken, _HIT_CHANGES_NOTHING),
    (_HitHoldsItsBlocks, _HIT_CHANGES_NOTHING),
    (_WINDOW_NEVER_FREES, _FREES_FIRST),
]
_IDS = ["counts before freeing", "undoes the frees when refused", "new blocks before the hit",
        "hit and new blocks group by group", "takes what fits",
        "a new request refused keeps empty tables", "caches tokens not computed",
        "hit reaches the last token", "a hit holds its blocks", "the window never frees"]


@pytest.mark.parametrize(("mutant", "scenario"), MUTANTS, ids=_IDS)
def test_each_rule_broken_alone_fails_its_scenario(mutant, scenario):
    with pytest.raises(AssertionError):
        scenario(kv_class=mutant)


@pytest.mark.parametrize("mutant", [m for m, _ in MUTANTS] + [_FreesTheFirstBlockFirst],
                         ids=[*_IDS, "frees the first block first"])
def test_each_rule_broken_alone_fails_the_drawn_runs(mutant):
    """The state machine finds each broken rule on its own, without the scenario built for
    it (found, not shrunk)."""
    machine = type(f"{mutant.__name__}Machine", (CoordinatorMachine,), {"kv_class": mutant})
    with pytest.raises(AssertionError):
        _run(machine, 150, shrink=False)
