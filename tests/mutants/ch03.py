"""Wrong BlockManagers, as learners write them, with the hint each must get.

Each mutant is the reference with one method changed, so it fails for one reason only.
"""

from __future__ import annotations

from course.block_manager import BlockManager, CopyOnWrite, NoFreeBlocksError, Slot


class PartialAllocation(BlockManager):
    """Takes blocks one by one and gives up half-way, leaving them taken."""

    def allocate(self, seq_id, num_tokens):
        if seq_id in self.tables:
            raise ValueError("exists")
        table = []
        self.tables[seq_id], self.lengths[seq_id] = table, 0
        for _ in range(-(-num_tokens // self.block_size)):
            if not self.free_blocks:
                del self.tables[seq_id], self.lengths[seq_id]
                raise NoFreeBlocksError("ran out")
            table.append(self._take_block())
        self.lengths[seq_id] = num_tokens
        return list(table)


class OffByOneAtBoundary(BlockManager):
    """Takes a new block only once the sequence is *past* a full block (> instead of >=)."""

    def append_slot(self, seq_id):
        table, length = self.tables[seq_id], self.lengths[seq_id]
        if length > len(table) * self.block_size:
            table.append(self._take_block())
        self.lengths[seq_id] = length + 1
        return Slot(table[-1], length % self.block_size)


class NewBlockWhenRemainderIsOne(BlockManager):
    """A new block when (seq_len + 1) % block_size == 1: right for B > 1, never for B = 1."""

    def append_slot(self, seq_id):
        table, length = self.tables[seq_id], self.lengths[seq_id]
        if (length + 1) % self.block_size == 1:
            if not self.free_blocks:
                raise NoFreeBlocksError("full")
            table.append(self._take_block())
        self.lengths[seq_id] = length + 1
        return Slot(table[-1], length % self.block_size)


class ForkCountsTwice(BlockManager):
    """A reference-count leak: each fork adds two references to every shared block."""

    def fork(self, parent_id, child_id):
        super().fork(parent_id, child_id)
        for block in self.tables[child_id]:
            self.ref_counts[block] += 1


class NoCopyOnWrite(BlockManager):
    """Writes into a shared, partly filled last block as if it were its own."""

    def append_slot(self, seq_id):
        table, length = self.tables[seq_id], self.lengths[seq_id]
        offset = length % self.block_size
        if offset == 0:
            if not self.free_blocks:
                raise NoFreeBlocksError("full")
            table.append(self._take_block())
        self.lengths[seq_id] = length + 1
        return Slot(table[-1], offset)


class CopyOnWriteFullBlocksToo(BlockManager):
    """Copies a shared last block even when it is full, before taking the new block."""

    def append_slot(self, seq_id):
        table, length = self.tables[seq_id], self.lengths[seq_id]
        if length % self.block_size == 0 and table and self.ref_counts[table[-1]] > 1:
            if len(self.free_blocks) < 2:
                raise NoFreeBlocksError("full")
            shared = table[-1]
            table[-1] = self._take_block()
            self._release_block(shared)
            table.append(self._take_block())
            self.lengths[seq_id] = length + 1
            return Slot(table[-1], 0, CopyOnWrite(shared, table[-2], self.block_size))
        return super().append_slot(seq_id)


class PrematureFree(BlockManager):
    """Returns every block of a freed sequence to the pool, whoever else still holds it."""

    def free(self, seq_id):
        if seq_id not in self.tables:
            raise KeyError(seq_id)
        for block in self.tables.pop(seq_id):
            if self.ref_counts[block] > 0:
                self.ref_counts[block] = 0
                self.free_blocks.append(block)
        del self.lengths[seq_id]


class SharedBlocksNotReleased(BlockManager):
    """Releases only the blocks the freed sequence held alone: shared ones keep its reference."""

    def free(self, seq_id):
        if seq_id not in self.tables:
            raise KeyError(seq_id)
        for block in self.tables.pop(seq_id):
            if self.ref_counts[block] == 1:
                self._release_block(block)
        del self.lengths[seq_id]


MUTANTS = {
    "allocate": [(PartialAllocation, "leave everything as it was")],
    "append_slot": [(OffByOneAtBoundary, "one new block appended"),
                    (NewBlockWhenRemainderIsOne, "with block_size 1, for every token")],
    "fork": [(ForkCountsTwice, "a leak")],
    "copy_on_write": [(NoCopyOnWrite, "without a copy"),
                      (CopyOnWriteFullBlocksToo, "full shared block stays shared")],
    "free": [(PrematureFree, "premature free"), (SharedBlocksNotReleased, "shared or not")],
}
