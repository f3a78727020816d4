"""Chapter 3's reference BlockManager: blocks on demand, shared with reference counts,
copied before a write into a shared block.

Answers are the bodies between ``### BEGIN SOLUTION`` and ``### END SOLUTION``: chapter 3's
notebook renders its cells from them, and a learner edition replaces them with stubs.
The rest of the class is the skeleton the notebook gives.

    pool (num_blocks = 8, block_size = 4)          block tables       ref counts
    +----+----+----+----+----+----+----+----+
    | 0  | 1  | 2  | 3  | 4  | 5  | 6  | 7  |      seq 0: [3, 1]      block 3: 2 (shared)
    +----+----+----+----+----+----+----+----+      seq 1: [3, 6]      block 1: 1, block 6: 1
      free: 0 2 4 5 7 (a FIFO queue)

Sequence 1 was forked from 0 after four tokens: it shares full block 3. When each went on
growing into its own fifth token, each took a fresh block (1 and 6): full shared blocks stay
shared. Had the fork come after three tokens, the first of them to write a fourth would have
copied the three shared slots into a fresh block first (copy-on-write).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from course.language import tr


class NoFreeBlocksError(RuntimeError):
    """The pool has too few free blocks for the operation. The manager is left unchanged."""


@dataclass(frozen=True)
class CopyOnWrite:
    """Copy the first ``num_slots`` slots of block ``src`` into block ``dst``."""

    src: int
    dst: int
    num_slots: int


@dataclass(frozen=True)
class Slot:
    """Where a new token's K and V go; perform ``copy`` first when it is not None."""

    block: int
    offset: int
    copy: CopyOnWrite | None = None


class BlockManager:
    """Hands out physical blocks to sequences; shares them by reference count.

    Contracts: ``allocate`` takes all of a prompt's blocks or none; ``append_slot`` takes a new
    block only when the last one is full, and copies a partly filled last block that other
    sequences also hold before the write; ``free`` returns a block to the pool exactly when its
    count reaches zero. An operation that runs out of blocks raises ``NoFreeBlocksError`` and
    changes nothing. Every free-pool operation is O(1); which free block comes next is the
    pool's own business (a stack would do as well as this queue).
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.ref_counts = [0] * num_blocks
        self.tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}

    def block_table(self, seq_id: int) -> list[int]:
        """A copy of the sequence's block table (KeyError for an unknown sequence)."""
        return list(self.tables[seq_id])

    def seq_len(self, seq_id: int) -> int:
        return self.lengths[seq_id]

    def ref_count(self, block: int) -> int:
        return self.ref_counts[block]

    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def _take_block(self) -> int:
        block = self.free_blocks.popleft()
        self.ref_counts[block] = 1
        return block

    def _release_block(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free_blocks.append(block)

    def check_invariants(self) -> None:
        """Raise AssertionError when the pool's books do not balance."""
        holders = [0] * self.num_blocks
        for table in self.tables.values():
            for block in table:
                holders[block] += 1
        assert holders == self.ref_counts, tr("a reference count differs from the tables "
                                              "holding it")
        in_use = {b for b, count in enumerate(self.ref_counts) if count > 0}
        assert len(set(self.free_blocks)) == len(self.free_blocks), tr("a block is free twice")
        assert in_use.isdisjoint(self.free_blocks), tr("a block in use is also free")
        assert len(in_use) + len(self.free_blocks) == self.num_blocks, tr("a block was lost")
        for seq_id, table in self.tables.items():
            assert len(table) == -(-self.lengths[seq_id] // self.block_size), tr(
                f"sequence {seq_id} holds {len(table)} blocks for {self.lengths[seq_id]} tokens")

    def allocate(self, seq_id: int, num_tokens: int) -> list[int]:
        """Give a new sequence the blocks for its ``num_tokens``-token prompt: all or none.

        Checked in this order: an id that already has blocks raises ``ValueError`` (even when
        the prompt would not fit either); then, with fewer than ceil(num_tokens / block_size)
        blocks free, ``NoFreeBlocksError``, and nothing changes: no block is taken and the
        sequence is not registered. Returns the new block table as a list of its own: the
        caller may change it without changing the manager.
        """
        ### BEGIN SOLUTION
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id} already has blocks")
        needed = -(-num_tokens // self.block_size)
        if needed > len(self.free_blocks):
            raise NoFreeBlocksError(
                f"sequence {seq_id} needs {needed} blocks, {len(self.free_blocks)} are free")
        self.tables[seq_id] = [self._take_block() for _ in range(needed)]
        self.lengths[seq_id] = num_tokens
        return list(self.tables[seq_id])
        ### END SOLUTION

    def fork(self, parent_id: int, child_id: int) -> None:
        """Make ``child_id`` share all of ``parent_id``'s blocks (nothing is copied).

        The child gets a table of its own (a new list of the same blocks), the parent's length,
        and one more reference on each block. A ``child_id`` that already has blocks raises
        ``ValueError``; an unknown ``parent_id`` raises ``KeyError``; either way nothing
        changes and no sequence is registered.
        """
        ### BEGIN SOLUTION
        if child_id in self.tables:
            raise ValueError(f"sequence {child_id} already has blocks")
        table = self.tables[parent_id]
        for block in table:
            self.ref_counts[block] += 1
        self.tables[child_id] = list(table)
        self.lengths[child_id] = self.lengths[parent_id]
        ### END SOLUTION

    def append_slot(self, seq_id: int) -> Slot:
        """Make room for one more token of ``seq_id``; say where its K and V go.

        A token that needs a block (a new one, or a copy of a shared one) when none is free
        raises ``NoFreeBlocksError`` and changes nothing.
        """
        ### BEGIN SOLUTION
        table, length = self.tables[seq_id], self.lengths[seq_id]
        offset = length % self.block_size
        if offset == 0:  # the last block is full (or there is none): take a fresh one
            if not self.free_blocks:
                raise NoFreeBlocksError(f"sequence {seq_id} needs a new block, none is free")
            table.append(self._take_block())
            slot = Slot(table[-1], 0)
        elif self.ref_counts[table[-1]] > 1:  # shared and partly filled: copy, then write
            if not self.free_blocks:
                raise NoFreeBlocksError(f"sequence {seq_id} must copy a shared block, none is free")
            shared = table[-1]
            table[-1] = self._take_block()
            self._release_block(shared)
            slot = Slot(table[-1], offset, CopyOnWrite(shared, table[-1], offset))
        else:
            slot = Slot(table[-1], offset)
        self.lengths[seq_id] = length + 1
        return slot
        ### END SOLUTION

    def free(self, seq_id: int) -> None:
        """Drop the sequence; each of its blocks returns to the pool when no one else holds it.

        An unknown or already-freed ``seq_id`` raises ``KeyError``. The order the blocks go
        back in is free: this pool's contract fixes no order of free blocks.
        """
        ### BEGIN SOLUTION
        if seq_id not in self.tables:
            raise KeyError(f"sequence {seq_id} is unknown or already freed")
        for block in reversed(self.tables.pop(seq_id)):
            self._release_block(block)
        del self.lengths[seq_id]
        ### END SOLUTION
