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


class RegistersBeforeChecking(BlockManager):
    """Records the new sequence first, then finds the pool too small and raises."""

    def allocate(self, seq_id, num_tokens):
        if seq_id in self.tables:
            raise ValueError("exists")
        self.tables[seq_id], self.lengths[seq_id] = [], num_tokens
        needed = -(-num_tokens // self.block_size)
        if needed > len(self.free_blocks):
            raise NoFreeBlocksError("full")
        self.tables[seq_id] = [self._take_block() for _ in range(needed)]
        return list(self.tables[seq_id])


class CapacityBeforeDuplicate(BlockManager):
    """Checks the pool before the id: a duplicate id that would not fit gets NoFreeBlocksError."""

    def allocate(self, seq_id, num_tokens):
        if -(-num_tokens // self.block_size) > len(self.free_blocks):
            raise NoFreeBlocksError("full")
        return super().allocate(seq_id, num_tokens)


class ReturnsOwnTable(BlockManager):
    """Returns the manager's own list: a caller that changes it changes the table."""

    def allocate(self, seq_id, num_tokens):
        super().allocate(seq_id, num_tokens)
        return self.tables[seq_id]


class _ListPool(list):
    def popleft(self):
        return self.pop(0)


class ListFreePool(BlockManager):
    """A plain list for a free pool, taken from the front: every take shifts the whole pool."""

    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.free_blocks = _ListPool(self.free_blocks)


class RunsOutWithIndexError(BlockManager):
    """Takes a block without looking: an empty pool raises IndexError from the deque."""

    def append_slot(self, seq_id):
        table, length = self.tables[seq_id], self.lengths[seq_id]
        offset = length % self.block_size
        if offset == 0:
            table.append(self._take_block())
        elif self.ref_counts[table[-1]] > 1:
            shared = table[-1]
            table[-1] = self._take_block()
            self._release_block(shared)
            self.lengths[seq_id] = length + 1
            return Slot(table[-1], offset, CopyOnWrite(shared, table[-1], offset))
        self.lengths[seq_id] = length + 1
        return Slot(table[-1], offset)


class ForkSharesList(BlockManager):
    """Gives the child the parent's list object: growing one grows the other."""

    def fork(self, parent_id, child_id):
        if child_id in self.tables:
            raise ValueError("exists")
        for block in self.tables[parent_id]:
            self.ref_counts[block] += 1
        self.tables[child_id] = self.tables[parent_id]
        self.lengths[child_id] = self.lengths[parent_id]


class ForkWithoutReferences(BlockManager):
    """Copies the table but forgets the reference counts."""

    def fork(self, parent_id, child_id):
        if child_id in self.tables:
            raise ValueError("exists")
        self.tables[child_id] = list(self.tables[parent_id])
        self.lengths[child_id] = self.lengths[parent_id]


class ForkOfUnknownParent(BlockManager):
    """Forks an unknown parent into an empty child instead of raising."""

    def fork(self, parent_id, child_id):
        if child_id in self.tables:
            raise ValueError("exists")
        table = self.tables.get(parent_id, [])
        for block in table:
            self.ref_counts[block] += 1
        self.tables[child_id] = list(table)
        self.lengths[child_id] = self.lengths.get(parent_id, 0)


class CopyKeepsReference(BlockManager):
    """Copies a shared block but keeps its reference on the original."""

    def append_slot(self, seq_id):
        table, length = self.tables[seq_id], self.lengths[seq_id]
        offset = length % self.block_size
        if offset and self.ref_counts[table[-1]] > 1:
            if not self.free_blocks:
                raise NoFreeBlocksError("full")
            shared = table[-1]
            table[-1] = self._take_block()
            self.lengths[seq_id] = length + 1
            return Slot(table[-1], offset, CopyOnWrite(shared, table[-1], offset))
        return super().append_slot(seq_id)


class DefensiveFree(BlockManager):
    """Guards against a double free by looking the block up in the free pool: O(pool) each."""

    def free(self, seq_id):
        if seq_id not in self.tables:
            raise KeyError(seq_id)
        for block in reversed(self.tables.pop(seq_id)):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0 and block not in self.free_blocks:
                self.free_blocks.append(block)
        del self.lengths[seq_id]


ONLY_SLOWER = {ListFreePool, DefensiveFree}
"""Mutants that behave as the contract says and break only its O(1) promise."""

MUTANTS = {
    "allocate": [(PartialAllocation, "leave everything as it was"),
                 (RegistersBeforeChecking, "not registering the sequence"),
                 (CapacityBeforeDuplicate, "checked before anything else"),
                 (ReturnsOwnTable, "a copy of the new table"),
                 (ListFreePool, "grows with the pool")],
    "append_slot": [(OffByOneAtBoundary, "one new block appended"),
                    (NewBlockWhenRemainderIsOne, "with block_size 1, for every token"),
                    (RunsOutWithIndexError, "must raise NoFreeBlocksError")],
    "fork": [(ForkCountsTwice, "adds one reference"),
             (ForkWithoutReferences, "adds one reference"),
             (ForkSharesList, "a list of its own"),
             (ForkOfUnknownParent, "does not exist")],
    "copy_on_write": [(NoCopyOnWrite, "without a copy"),
                      (CopyOnWriteFullBlocksToo, "full shared block stays shared"),
                      (CopyKeepsReference, "loses that sequence's reference")],
    "free": [(PrematureFree, "premature free"), (SharedBlocksNotReleased, "shared or not"),
             (DefensiveFree, "grows with the pool")],
}
