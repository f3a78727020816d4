"""Chapter 3's hidden checks: a hypothesis stateful machine drives the learner's BlockManager
through random interleavings of its operations (random small pools, block size 1 included,
running out of blocks included), with the visible harness checking the books and the
sentinel KV pool after every step. A failure's hint is the smallest failing sequence of
operations.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from autograder.checks._helpers import run_stateful
from autograder.checks.ch03 import _Harness
from autograder.private import thorough


def _machine(cls: type, operations: set[str]) -> type:
    class BlockManagerMachine(RuleBasedStateMachine):
        h: _Harness
        next_id = 0

        @initialize(num_blocks=st.integers(1, 10), block_size=st.sampled_from([1, 2, 3, 4, 16]))
        def create(self, num_blocks: int, block_size: int) -> None:
            self.h = _Harness(cls, num_blocks, block_size)

        @rule(num_tokens=st.integers(0, 20))
        def allocate(self, num_tokens: int) -> None:
            self.h.allocate(self.next_id, num_tokens)
            self.next_id += 1

        @rule(data=st.data())
        def append(self, data: st.DataObject) -> None:
            if self.h.tokens and "append" in operations:
                self.h.append(data.draw(st.sampled_from(sorted(self.h.tokens))))

        @rule(data=st.data())
        def fork(self, data: st.DataObject) -> None:
            if self.h.tokens and "fork" in operations:
                self.h.fork(data.draw(st.sampled_from(sorted(self.h.tokens))), self.next_id)
                self.next_id += 1

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


@thorough
def check_allocate_thoroughly(cls: type) -> None:
    """Random prompts into random small pools (block size 1 included): all or nothing."""
    _stateful(cls, set())


@thorough
def check_append_slot_thoroughly(cls: type) -> None:
    """Random interleavings of allocate and append_slot, running out included."""
    _stateful(cls, {"append"})


@thorough
def check_fork_thoroughly(cls: type) -> None:
    """Random interleavings of allocate and fork (forks of forks included)."""
    _stateful(cls, {"fork"})


@thorough
def check_copy_on_write_thoroughly(cls: type) -> None:
    """Random interleavings of allocate, append_slot and fork, with the sentinel pool."""
    _stateful(cls, {"append", "fork"})


@thorough
def check_free_thoroughly(cls: type) -> None:
    """Random interleavings of every operation, running out of blocks included."""
    _stateful(cls, {"append", "fork", "free"}, max_examples=200)
