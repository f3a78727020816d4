"""Chapter 3's hidden checks: a hypothesis stateful machine drives the learner's BlockManager
through random interleavings of its operations (random small pools, block size 1 included,
running out of blocks included, a failed allocation's id tried again, ids allocated twice,
forks of unknown parents), with the visible harness checking the books and the sentinel KV
pool after every step. A failure's hint is the smallest failing sequence of operations.

Then each free-pool operation is timed on a pool of 1,000 blocks and one of 256,000: the
contract makes every free-pool operation O(1), so the cost per call must not grow with the
pool. What is compared is the best of several runs of a few hundred calls at each size (the
least disturbed by the rest of the machine), and only a cost that grows many times over, by
microseconds a call, fails: an O(pool) take (``list.pop(0)``, ``in`` or ``remove`` on the
free pool) costs tens to thousands of microseconds a call at 256,000 blocks, an O(1) one well
under ten at either size.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from autograder.checks._helpers import run_stateful
from autograder.checks._lending import one_bug_one_todo
from autograder.checks.ch03 import _fork_cases, _free_cases, _Harness
from autograder.private import thorough

_TODOS = ("allocate", "append_slot", "fork", "free")


def _one_bug_one_todo(check: Callable[[type], None], cls: type, others: tuple[str, ...]
                      ) -> None:
    """``lending.one_bug_one_todo`` with the course's BlockManager: a test of one method
    runs its scenarios with the course's versions of the methods they also call where the
    learner's class fails them, so that a wrong ``allocate`` costs ``allocate`` alone."""
    from course.v0.block_manager import BlockManager as Course

    one_bug_one_todo(check, cls, Course, _TODOS, others)


def _machine(cls: type, operations: set[str]) -> type:
    class BlockManagerMachine(RuleBasedStateMachine):
        h: _Harness
        next_id = 0

        @initialize(num_blocks=st.integers(1, 10), block_size=st.sampled_from([1, 2, 3, 4, 16]))
        def create(self, num_blocks: int, block_size: int) -> None:
            self.h = _Harness(cls, num_blocks, block_size)

        @rule(num_tokens=st.integers(0, 20))
        def allocate(self, num_tokens: int) -> None:
            if self.h.allocate(self.next_id, num_tokens):  # a failed id is tried again
                self.next_id += 1

        @rule(data=st.data(), num_tokens=st.integers(0, 60))
        def allocate_again(self, data: st.DataObject, num_tokens: int) -> None:
            if self.h.tokens:
                seq = data.draw(st.sampled_from(sorted(self.h.tokens)))
                self.h.expect_error(f"bm.allocate({seq}, {num_tokens})",
                                    lambda: self.h.bm.allocate(seq, num_tokens),
                                    (ValueError, KeyError), "A sequence id that already has "
                                    "blocks raises ValueError, checked before anything else: "
                                    "also when the prompt would not fit either.")

        @rule(data=st.data())
        def append(self, data: st.DataObject) -> None:
            if "append" in operations:
                live = sorted(self.h.tokens)
            else:  # only at a block boundary: a fresh block, never a copy
                size = self.h.block_size
                live = sorted(s for s, t in self.h.tokens.items() if len(t) % size == 0)
            if live and operations & {"append", "fork"}:
                self.h.append(data.draw(st.sampled_from(live)))

        @rule(data=st.data())
        def fork(self, data: st.DataObject) -> None:
            if self.h.tokens and "fork" in operations:
                parent, child = data.draw(st.sampled_from(sorted(self.h.tokens))), self.next_id
                self.h.fork(parent, child)
                self.next_id += 1
                grow = data.draw(st.sampled_from([None, parent, child]))
                if grow is not None and len(self.h.tokens[grow]) % self.h.block_size == 0:
                    self.h.append(grow)  # a fresh block for one: the other's table stays

        @rule()
        def fork_unknown(self) -> None:
            if "fork" in operations:
                parent, child = self.next_id + 1, self.next_id
                self.h.expect_error(f"bm.fork({parent}, {child})",
                                    lambda: self.h.bm.fork(parent, child), (KeyError, ValueError),
                                    "Forking a sequence that does not exist raises KeyError "
                                    "and registers nothing.", unknown=child)

        @rule(data=st.data())
        def free(self, data: st.DataObject) -> None:
            if self.h.tokens and "free" in operations:
                self.h.free(data.draw(st.sampled_from(sorted(self.h.tokens))))

        @invariant()
        def books_balance(self) -> None:
            if hasattr(self, "h"):
                self.h.verify()

    return BlockManagerMachine


def _stateful(cls: type, operations: set[str], max_examples: int = 120) -> None:
    run_stateful(_machine(cls, operations), max_examples, steps=40)


# --- O(1) free-pool operations ---------------------------------------------------------------

SMALL, LARGE = 1_000, 256_000
CALLS, RUNS = 300, 5


def _seconds_per_call(cls: type, num_blocks: int, block_size: int, prepare: Callable,
                      operation: Callable, bound: float = math.inf) -> float:
    """The best of ``RUNS`` runs' seconds per call of ``operation(bm, i)``, ``CALLS`` calls on
    a fresh manager that ``prepare(bm)`` set up (not timed). A run stops as soon as it has
    taken more than ``bound`` seconds for each of its ``CALLS`` calls: it is over the bound
    whatever the rest would take, and an operation that walks a large pool would otherwise
    take minutes to be told so."""
    best = math.inf
    for _ in range(RUNS):
        bm = cls(num_blocks, block_size)
        prepare(bm)
        enabled = gc.isenabled()
        gc.disable()
        try:
            start = time.perf_counter()
            for done in range(1, CALLS + 1):
                operation(bm, done - 1)
                elapsed = time.perf_counter() - start
                if elapsed > bound * CALLS:
                    break
            best = min(best, elapsed / done)
        finally:
            if enabled:
                gc.enable()
    return best


def _constant_time(cls: type, block_size: int, prepare: tuple[str, Callable],
                   operation: tuple[str, Callable]) -> None:
    """The cost per call of ``operation`` (its text, and the call on a manager and a number
    0, 1, ...) must not grow with the pool; ``prepare`` sets the manager up first."""
    (setup, before), (call, action) = prepare, operation
    steps = f"bm = BlockManager({LARGE}, {block_size}){setup} and {CALLS} calls of {call}"
    try:
        small = _seconds_per_call(cls, SMALL, block_size, before, action)
        bound = max(5 * small, small + 5e-6)  # five times as long, and by 5 us a call at least
        large = _seconds_per_call(cls, LARGE, block_size, before, action, bound)
    except AssertionError:
        raise
    except Exception as exc:
        raise AssertionError(f"After {steps}: it raised {type(exc).__name__}: {exc}") from None
    if large > bound:
        raise AssertionError(
            f"After {steps}: they took {large * 1e6:,.1f} us per call, against "
            f"{small * 1e6:,.1f} us on a pool of {SMALL:,} blocks ({large / small:,.0f} times "
            "as long): the cost grows with the pool. The contract makes every free-pool "
            "operation O(1); one that walks the free pool (list.pop(0), `in` or remove() on "
            "it, copying it) is O(pool size).")


_NOTHING = ("", lambda bm: None)


def _pairs(bm) -> None:
    for i in range(CALLS):  # one-token sequences, each forked: every append must copy
        bm.allocate(2 * i, 1)
        bm.fork(2 * i, 2 * i + 1)


def _held(bm) -> None:
    for i in range(CALLS):
        bm.allocate(i, 4)


@thorough
def check_allocate_thoroughly(cls: type) -> None:
    """Random prompts into random small pools (block size 1 included): all or nothing, a failed
    id unknown and free for a later try; then allocate's cost on a large pool."""
    _stateful(cls, set())
    _constant_time(cls, 4, _NOTHING, ("bm.allocate(i, 4)", lambda bm, i: bm.allocate(i, 4)))


@thorough
def check_append_slot_thoroughly(cls: type) -> None:
    """Random interleavings of allocate and append_slot, running out included; then
    append_slot's cost on a large pool."""

    def check(subject: type) -> None:
        _stateful(subject, {"append"})
        _constant_time(subject, 1, ("; bm.allocate(0, 1)", lambda bm: bm.allocate(0, 1)),
                       ("bm.append_slot(0)", lambda bm, i: bm.append_slot(0)))

    _one_bug_one_todo(check, cls, ("allocate",))


@thorough
def check_fork_thoroughly(cls: type) -> None:
    """The visible cases (a child id in use among them), then random interleavings of allocate
    and fork (forks of forks, forks of unknown parents), with sequences grown past full blocks:
    each table is its own list."""

    def check(subject: type) -> None:
        _fork_cases(subject)
        _stateful(subject, {"fork"})

    _one_bug_one_todo(check, cls, ("allocate", "append_slot"))


@thorough
def check_copy_on_write_thoroughly(cls: type) -> None:
    """Random interleavings of allocate, append_slot and fork, with the sentinel pool; then
    the cost of a copy on a large pool."""

    def check(subject: type) -> None:
        _stateful(subject, {"append", "fork"})
        _constant_time(subject, 2, (f"; {CALLS} one-token sequences each forked", _pairs),
                       ("bm.append_slot(child), each a copy-on-write",
                        lambda bm, i: bm.append_slot(2 * i + 1)))

    _one_bug_one_todo(check, cls, ("allocate", "fork"))


@thorough
def check_free_thoroughly(cls: type) -> None:
    """The visible cases (a sequence freed twice, one never allocated), then random
    interleavings of every operation, running out of blocks included; then free's cost on a
    large pool."""

    def check(subject: type) -> None:
        _free_cases(subject)
        _stateful(subject, {"append", "fork", "free"}, max_examples=200)
        _constant_time(subject, 4, (f"; {CALLS} one-block sequences allocated", _held),
                       ("bm.free(i)", lambda bm, i: bm.free(i)))

    _one_bug_one_todo(check, cls, ("allocate", "append_slot", "fork"))
