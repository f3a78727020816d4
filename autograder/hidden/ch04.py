"""Chapter 4's hidden checks, and the model the visible checks ask what a manager should hold.

The model is the contract written plainly and differently from any manager: its cache is
keyed by the *whole token prefix* (no hashing at all) and its free blocks are a plain LRU
list, so it predicts every block table exactly. The visible checks' harness asks it
(``model``, through ``autograder.private``) after every operation; the stateful checks here
run the same harness on random interleavings, with eviction, revival and the sentinel KV
pool. ``block_key`` and ``prefix_keys`` are checked on random inputs for their properties.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from autograder.borrowing import course_version
from autograder.checks._helpers import for_all, not_written, run_stateful, verdict_only
from autograder.checks._lending import (
    one_bug_one_todo,
    one_bug_one_todo_of_function,
    with_globals,
)
from autograder.checks.ch04 import (
    _KEY_IDEA,
    ROOT,
    _allocate_cases,
    _check_prefix,
    _differ,
    _Harness,
    _key,
    _revival_cases,
    check_block_key,
    check_free,
)
from autograder.private import thorough
from course.v0.block_manager import NoFreeBlocksError

# --- block_key and prefix_keys -------------------------------------------------------------


@thorough
def check_block_key_thoroughly(fn: Callable) -> None:
    """The visible cases, then random blocks: distinct inputs never share a key; equal inputs
    always do."""
    check_block_key(fn)
    blocks = st.tuples(st.sampled_from([ROOT, "a" * 64, "b" * 64]),
                       st.lists(st.integers(0, 50_000), min_size=1, max_size=16),
                       st.sampled_from([(), ("lora-1",), ("salt", 7)]))

    def distinct(pair):
        a, b = pair
        if (a[0], list(a[1]), a[2]) == (b[0], list(b[1]), b[2]):
            if _key(fn, *a) != _key(fn, *b):
                raise AssertionError(f"block_key{a} changed between calls. {_KEY_IDEA}")
        else:
            _differ(fn, a, b, "different inputs must get different keys.")

    for_all(st.tuples(blocks, blocks), distinct, max_examples=200)

    @st.composite
    def moved(draw):  # one run of values, split at two points between tokens and extra keys
        values = draw(st.lists(st.integers(0, 99), min_size=2, max_size=8))
        first, second = draw(st.lists(st.integers(1, len(values)), min_size=2, max_size=2,
                                      unique=True))
        return tuple((ROOT, values[:cut], tuple(str(v) for v in values[cut:]))
                     for cut in (first, second))

    for_all(moved(), lambda pair: _differ(
        fn, *pair, "a value that moved from the tokens into the extra keys is a different "
        "input: the encoding must keep the two apart."), max_examples=100)


@thorough
def check_prefix_keys_thoroughly(fn: Callable) -> None:
    """Random token lists and block sizes, lengths on block boundaries, repeated blocks;
    where the learner's prefix_keys fails them, again with the course's block_key lent to it,
    so that a wrong block_key costs block_key alone."""
    from course.v0.prefix_cache import block_key

    cases = st.tuples(st.lists(st.integers(0, 3), max_size=40), st.integers(1, 9),
                      st.sampled_from([(), ("lora-3",)]))

    def check(subject: Callable) -> None:
        for_all(cases, lambda c: _check_prefix(subject, *c), max_examples=100)

    one_bug_one_todo_of_function(check, fn, {"block_key": block_key})


# --- the manager: a model keyed by whole prefixes ------------------------------------------


class _Model:
    """The contract, written plainly: cache keyed by the whole token prefix, LRU list."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.size = block_size
        self.lru = list(range(num_blocks))  # free blocks, least recently used first
        self.refs = [0] * num_blocks
        self.cache: dict[tuple, int] = {}
        self.key_of: dict[int, tuple] = {}
        self.tables: dict[int, list[int]] = {}
        self.tokens: dict[int, list[int]] = {}
        self.extra: dict[int, tuple] = {}
        self.keyed: dict[int, int] = {}  # how many of a sequence's blocks were keyed

    def prefix(self, tokens, extra, blocks: int) -> tuple:
        return (tuple(extra), tuple(tokens[:blocks * self.size]))

    def take(self) -> int:
        block = self.lru.pop(0)
        if block in self.key_of:
            del self.cache[self.key_of.pop(block)]
        self.refs[block] = 1
        return block

    def cache_full(self, seq: int) -> None:
        """Cache each block the moment it becomes full, if its prefix is not cached yet (a
        duplicate is never cached later: no de-duplication)."""
        tokens, table = self.tokens[seq], self.tables[seq]
        for i in range(self.keyed.get(seq, 0), len(tokens) // self.size):
            key = self.prefix(tokens, self.extra[seq], i + 1)
            if key not in self.cache and table[i] not in self.key_of:
                self.cache[key] = table[i]
                self.key_of[table[i]] = key
        self.keyed[seq] = len(tokens) // self.size

    def hits(self, tokens, extra) -> list[int]:
        found = []
        for i in range((len(tokens) - 1) // self.size if tokens else 0):
            block = self.cache.get(self.prefix(tokens, extra, i + 1))
            if block is None:
                break
            found.append(block)
        return found

    def admits(self, tokens, extra) -> bool:
        hits = self.hits(tokens, extra)
        revived = sum(1 for b in hits if self.refs[b] == 0)
        return -(-len(tokens) // self.size) - len(hits) + revived <= len(self.lru)

    def allocate(self, seq, tokens, extra) -> int:
        hits = self.hits(tokens, extra)
        for block in hits:
            if self.refs[block] == 0:
                self.lru.remove(block)
            self.refs[block] += 1
        fresh = [self.take() for _ in range(-(-len(tokens) // self.size) - len(hits))]
        self.tables[seq], self.tokens[seq], self.extra[seq] = hits + fresh, list(tokens), extra
        self.cache_full(seq)
        return len(hits) * self.size

    def append(self, seq, token) -> None:
        if len(self.tokens[seq]) % self.size == 0:
            self.tables[seq].append(self.take())
        self.tokens[seq].append(token)
        self.cache_full(seq)

    def free(self, seq) -> None:
        for block in reversed(self.tables.pop(seq)):
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.lru.append(block)
        del self.tokens[seq], self.extra[seq], self.keyed[seq]

    def view(self) -> dict:
        """What a manager should hold now, as plain data: each sequence's block table, every
        block's reference count, the cached blocks, the evictable blocks (LRU first) and the
        number of free blocks."""
        return {"tables": {seq: list(table) for seq, table in self.tables.items()},
                "refs": list(self.refs), "cached": sorted(self.key_of),
                "evictable": [b for b in self.lru if b in self.key_of], "free": len(self.lru)}


def model(num_blocks: int, block_size: int) -> _Model:
    """A fresh model of an empty pool, for the visible checks' harness."""
    return _Model(num_blocks, block_size)


def _machine(cls: type, operations: set[str]) -> type:
    prompts = st.lists(st.integers(0, 2), max_size=12)  # few token values: many shared prefixes

    class PrefixCacheMachine(RuleBasedStateMachine):
        h: _Harness
        next_id = 0

        @initialize(num_blocks=st.integers(1, 10), block_size=st.sampled_from([1, 2, 3, 4]))
        def create(self, num_blocks: int, block_size: int) -> None:
            self.h = _Harness(cls, num_blocks, block_size, model(num_blocks, block_size))

        @rule(tokens=prompts, salted=st.booleans())
        def allocate(self, tokens: list[int], salted: bool) -> None:
            self.h.allocate(self.next_id, tokens, ("salt",) if salted else ())
            self.next_id += 1

        @rule(data=st.data())
        def append(self, data: st.DataObject) -> None:
            if self.h.tokens and "append" in operations:
                seq = data.draw(st.sampled_from(sorted(self.h.tokens)))
                self.h.append(seq, data.draw(st.integers(0, 2)))

        @rule(data=st.data())
        def free(self, data: st.DataObject) -> None:
            if self.h.tokens and "free" in operations:
                self.h.free(data.draw(st.sampled_from(sorted(self.h.tokens))))

        @invariant()
        def books_balance(self) -> None:
            if hasattr(self, "h"):
                self.h.verify()

    return PrefixCacheMachine


def _stateful(cls: type, operations: set[str], max_examples: int = 120) -> None:
    run_stateful(_machine(cls, operations), max_examples, steps=30)


@thorough
def check_take_block_thoroughly(cls: type) -> None:
    """Random takes and releases on pools with random cached blocks, against an LRU list: the
    block taken is always the least recently used, and it is always uncached afterwards."""

    @st.composite
    def cases(draw):
        size = draw(st.integers(1, 8))
        cached = draw(st.sets(st.integers(0, size - 1)))
        ops = draw(st.lists(st.tuples(st.booleans(), st.integers(0, 7)), max_size=30))
        return size, sorted(cached), ops

    def take(bm, log: list[str], free: int) -> int | None:
        """``bm._take_block()`` with ``free`` blocks free: the block, or None where it rightly
        raised NoFreeBlocksError; any other outcome fails, in the learner's terms."""
        log.append("bm._take_block()")
        try:
            block = bm._take_block()
        except NotImplementedError:
            raise AssertionError(not_written("_take_block")) from None
        except NoFreeBlocksError:
            if free:
                raise AssertionError(f"After {'; '.join(log)}: it raised NoFreeBlocksError "
                                     f"with {free} free blocks.") from None
            return None
        except Exception as exc:
            if free:
                raise AssertionError(f"After {'; '.join(log)}: it raised "
                                     f"{type(exc).__name__}: {exc}.") from None
            raise AssertionError(f"After {'; '.join(log)}: an empty pool raised "
                                 f"{type(exc).__name__}: {exc}; expected NoFreeBlocksError."
                                 ) from None
        if not free:
            raise AssertionError(f"After {'; '.join(log)}: an empty pool must raise "
                                 "NoFreeBlocksError.")
        if bm.ref_count(block) != 1:
            raise AssertionError(f"After {'; '.join(log)}: block {block}'s reference count is "
                                 f"{bm.ref_count(block)}; a block taken has one reference.")
        return block

    def run(case) -> None:
        size, cached, ops = case
        bm = cls(size, 4)
        bm.cache = {f"key-{b}": b for b in cached}
        bm.keys = {b: f"key-{b}" for b in cached}
        lru, held = list(range(size)), []
        log = [f"bm = PrefixCachingBlockManager({size}, 4), blocks {cached} cached"]
        for take_one, pick in ops:
            if take_one or not held:
                got = take(bm, log, len(lru))
                if got is None:
                    continue
                expected = lru.pop(0)
                if got != expected or bm.is_cached(got) or f"key-{got}" in bm.cache:
                    raise AssertionError(
                        f"After {'; '.join(log)}: it returned block {got}, expected {expected} "
                        f"(least recently used), with its key forgotten. Forget the key of an "
                        "evicted block, and take from the LRU end.")
                held.append(got)
            else:
                block = held.pop(pick % len(held))
                log.append(f"bm._release_block({block})")
                bm._release_block(block)
                lru.append(block)

    for_all(cases(), run, max_examples=150)


_TODOS = ("_take_block", "allocate", "append_slot", "free")


def _one_bug_one_todo(check: Callable[[type], None], cls: type, others: tuple[str, ...]
                      ) -> None:
    """``lending.one_bug_one_todo`` with the course's manager. Keys come from one encoding:
    where the course's ``allocate`` is lent, so is the course's keying of full blocks
    (``_cache_full_blocks``), or a learner's other canonical encoding would never be found by
    the course's lookups."""
    from course.v0.prefix_cache import PrefixCachingBlockManager as Course

    one_bug_one_todo(check, cls, Course, _TODOS, others,
                     companions={"allocate": ("_cache_full_blocks",)})


def _keyed_by_the_course(cls: type) -> type:
    """``cls`` keying blocks as the course does: its ``allocate`` finds the course's
    ``block_key`` and ``prefix_keys`` where it calls them by name (the notebook's answers to
    TODOs 1 and 2), and full blocks are keyed by the course's ``_cache_full_blocks``. A helper
    of the learner's own that calls them keeps the learner's."""
    from course.v0 import prefix_cache as course

    lent = {"_cache_full_blocks": course_version(
        inspect.getattr_static(course.PrefixCachingBlockManager, "_cache_full_blocks"))}
    allocate = inspect.getattr_static(cls, "allocate", None)
    if isinstance(allocate, types.FunctionType):
        lent["allocate"] = with_globals(allocate, {
            name: course_version(getattr(course, name)) for name in ("block_key", "prefix_keys")})
    return type(cls.__name__, (cls,), lent)


@thorough
def check_allocate_thoroughly(cls: type) -> None:
    """The visible scenarios (hits waiting in the free queue among them), revived blocks counted
    against capacity (a scenario of free's visible test), then random prompts with shared
    prefixes and salts into random small pools, with appends and frees between them. allocate
    builds on block_key and prefix_keys too: it is judged with the course's keys first, so
    that a wrong key costs its own TODO alone, and where that fails, with the learner's own
    (which another canonical encoding needs)."""

    def check(subject: type) -> None:
        _allocate_cases(subject)
        _revival_cases(subject)  # the stateful run finds a revival left uncounted only late
        _stateful(subject, {"append", "free"})  # frees put cached blocks back to be revived

    others = ("_take_block", "append_slot", "free")
    try:
        with verdict_only():
            _one_bug_one_todo(check, _keyed_by_the_course(cls), others)
    except AssertionError:
        _one_bug_one_todo(check, cls, others)


@thorough
def check_append_slot_thoroughly(cls: type) -> None:
    """Random interleavings of allocate, append_slot and free."""
    _one_bug_one_todo(lambda subject: _stateful(subject, {"append", "free"}), cls,
                      ("_take_block", "allocate", "free"))


@thorough
def check_free_thoroughly(cls: type) -> None:
    """The visible scenarios, then random interleavings of every operation, with eviction,
    revival and the sentinel."""

    def check(subject: type) -> None:
        check_free(subject)
        _parent_evicted(subject)
        _stateful(subject, {"append", "free"}, max_examples=200)

    _one_bug_one_todo(check, cls, ("_take_block", "allocate", "append_slot"))


def _parent_evicted(cls: type) -> None:
    """A block cached while its parent's key lives in another block, which is evicted first: a
    later prompt must stop at the evicted parent and not reuse the child (a lookup that skips
    a miss maps KV of another position into the table)."""
    h = _Harness(cls, 7, 2, model(7, 2))
    h.allocate(0, [1, 2, 3])  # block 0 caches [1, 2]
    h.allocate(1, [1])  # no hit: the last token is computed
    for token in (2, 3, 4):  # its first block duplicates [1, 2] (not cached); [1, 2, 3, 4] is
        h.append(1, token)
    h.free(0)
    h.allocate(2, [7] * 9)  # takes every free block: block 0, holding [1, 2], is evicted
    h.free(1)
    h.free(2)
    h.allocate(3, [1, 2, 3, 4, 5])  # [1, 2] is a miss, so [1, 2, 3, 4] must not hit
