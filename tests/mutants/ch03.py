"""Wrong BlockManagers, as learners write them, with the hint each must get.

Each mutant is the reference with one method changed, so it fails for one reason only.
"""

from __future__ import annotations

from course.v0.block_manager import BlockManager, CopyOnWrite, NoFreeBlocksError, Slot

from . import Rule


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


class FloorOfTheBlocks(BlockManager):
    """Counts a prompt's blocks as num_tokens // block_size: a partly filled last block has
    none."""

    def allocate(self, seq_id, num_tokens):
        if seq_id in self.tables:
            raise ValueError("exists")
        needed = num_tokens // self.block_size
        if needed > len(self.free_blocks):
            raise NoFreeBlocksError("full")
        self.tables[seq_id] = [self._take_block() for _ in range(needed)]
        self.lengths[seq_id] = num_tokens
        return list(self.tables[seq_id])


class AllocatesOverAnExistingId(BlockManager):
    """Never looks the id up: allocating it again replaces its table, leaking its blocks."""

    def allocate(self, seq_id, num_tokens):
        needed = -(-num_tokens // self.block_size)
        if needed > len(self.free_blocks):
            raise NoFreeBlocksError("full")
        self.tables[seq_id] = [self._take_block() for _ in range(needed)]
        self.lengths[seq_id] = num_tokens
        return list(self.tables[seq_id])


class OffsetAfterTheCount(BlockManager):
    """Counts the token first, then takes seq_len % block_size as its offset: one slot too
    far."""

    def append_slot(self, seq_id):
        slot = super().append_slot(seq_id)
        return Slot(slot.block, self.lengths[seq_id] % self.block_size, slot.copy)


class CountsTheTokenFirst(BlockManager):
    """Counts the token before finding its block: a token that finds none stays counted."""

    def append_slot(self, seq_id):
        try:
            return super().append_slot(seq_id)
        except NoFreeBlocksError:
            self.lengths[seq_id] += 1
            raise


class ForkOverAnExistingChild(BlockManager):
    """Never looks the child id up: forking into a live sequence replaces its table."""

    def fork(self, parent_id, child_id):
        table = self.tables[parent_id]
        for block in table:
            self.ref_counts[block] += 1
        self.tables[child_id] = list(table)
        self.lengths[child_id] = self.lengths[parent_id]


class ForkCopiesTheLastBlock(BlockManager):
    """Copies a partly filled last block for the child at the fork, instead of sharing it."""

    def fork(self, parent_id, child_id):
        super().fork(parent_id, child_id)
        table = self.tables[child_id]
        if self.lengths[child_id] % self.block_size and self.free_blocks:
            shared = table[-1]
            table[-1] = self._take_block()
            self._release_block(shared)


class ReleasesBeforeCopying(BlockManager):
    """Drops the shared block's reference, then looks for a block to copy it into."""

    def append_slot(self, seq_id):
        table, length = self.tables[seq_id], self.lengths[seq_id]
        offset = length % self.block_size
        if offset and self.ref_counts[table[-1]] > 1:
            shared = table[-1]
            self._release_block(shared)
            if not self.free_blocks:
                raise NoFreeBlocksError("full")
            table[-1] = self._take_block()
            self.lengths[seq_id] = length + 1
            return Slot(table[-1], offset, CopyOnWrite(shared, table[-1], offset))
        return super().append_slot(seq_id)


class FreeOfAnUnknownIdIsQuiet(BlockManager):
    """Returns quietly for an unknown or already-freed sequence."""

    def free(self, seq_id):
        if seq_id in self.tables:
            super().free(seq_id)


ONLY_SLOWER = {ListFreePool, DefensiveFree}
"""Mutants that behave as the contract says and break only its O(1) promise."""

UNSEEN_BY_THE_PROBE = {OffsetAfterTheCount, CountsTheTokenFirst, ForkOverAnExistingChild,
                       ReleasesBeforeCopying, FreeOfAnUnknownIdIsQuiet}
"""Mutants that the notebook's probe (``course.notebook.block_scenarios.probe``) takes for correct:
they differ from a correct manager only in an offset, which the probe does not compare, or on a path
it does not take (a failed append or copy, a child id in use, a second free)."""

MUTANTS = {
    "allocate": [(PartialAllocation, "leave everything as it was"),
                 (RegistersBeforeChecking, "not registering the sequence"),
                 (CapacityBeforeDuplicate, "checked before anything else"),
                 (ReturnsOwnTable, "a copy of the new table"),
                 (ListFreePool, "grows with the pool"),
                 (FloorOfTheBlocks, "expected ceil(10 / 4) = 3"),
                 (AllocatesOverAnExistingId, "cannot be allocated again")],
    "append_slot": [(OffByOneAtBoundary, "one new block appended"),
                    (NewBlockWhenRemainderIsOne, "with block_size 1, for every token"),
                    (RunsOutWithIndexError, "must raise NoFreeBlocksError"),
                    (OffsetAfterTheCount, "offset seq_len % block_size"),
                    (CountsTheTokenFirst, "must leave everything as it was")],
    "fork": [(ForkCountsTwice, "adds one reference"),
             (ForkWithoutReferences, "adds one reference"),
             (ForkSharesList, "a list of its own"),
             (ForkOfUnknownParent, "does not exist"),
             (ForkOverAnExistingChild, "The child id must be new"),
             (ForkCopiesTheLastBlock, "nothing is allocated or copied")],
    "copy_on_write": [(NoCopyOnWrite, "without a copy"),
                      (CopyOnWriteFullBlocksToo, "full shared block stays shared"),
                      (CopyKeepsReference, "loses that sequence's reference"),
                      (ReleasesBeforeCopying, "must leave everything as it was")],
    "free": [(PrematureFree, "premature free"), (SharedBlocksNotReleased, "shared or not"),
             (DefensiveFree, "grows with the pool"),
             (FreeOfAnUnknownIdIsQuiet, "Freeing a sequence twice must raise")],
}

RULES = [
    Rule("it needs ceil(num_tokens / block_size) blocks at once", "allocate",
         ("FloorOfTheBlocks",)),
    Rule("All or nothing: if the pool does not have that many free blocks, raise "
         "NoFreeBlocksError before taking any, so that nothing changes: no block is taken",
         "allocate", ("PartialAllocation",)),
    Rule("and the sequence is not registered (block_table of it still raises KeyError)",
         "allocate", ("RegistersBeforeChecking",)),
    Rule("A sequence id that already has blocks is an error (ValueError)", "allocate",
         ("AllocatesOverAnExistingId",)),
    Rule("checked first: a duplicate id raises ValueError even when its prompt would not fit "
         "either", "allocate", ("CapacityBeforeDuplicate",)),
    Rule("It returns the new block table as a list of the caller's own (a copy: changing it "
         "must not change the manager).", "allocate", ("ReturnsOwnTable",)),
    Rule("free_blocks is a deque: taking from the front and returning to the back are O(1).",
         "allocate", ("ListFreePool",)),
    Rule("Its K and V go at offset seq_len % block_size of the last block", "append_slot",
         ("OffsetAfterTheCount",)),
    Rule("a new block is needed exactly when that offset is 0 (the last block is full, or the "
         "sequence has none)", "append_slot", ("OffByOneAtBoundary",)),
    Rule("With block size 1, that is every token.", "append_slot",
         ("NewBlockWhenRemainderIsOne",)),
    Rule("If no block is free, raise NoFreeBlocksError (not the IndexError an empty deque "
         "raises)", "append_slot", ("RunsOutWithIndexError",)),
    Rule("A token that needs a new block when none is free raises NoFreeBlocksError and "
         "changes nothing.", "append_slot", ("CountsTheTokenFirst",)),
    Rule("nothing is allocated or copied", "fork", ("ForkCopiesTheLastBlock",)),
    Rule("every shared block's reference count goes up by one", "fork",
         ("ForkCountsTwice", "ForkWithoutReferences")),
    Rule("The child's table is a list of its own holding the same blocks: when one of them "
         "grows past a full block, only its own table gets the new block.", "fork",
         ("ForkSharesList",)),
    Rule("A child id that already exists is an error (ValueError)", "fork",
         ("ForkOverAnExistingChild",)),
    Rule("and so is a parent that does not exist (KeyError); either way nothing changes and no "
         "sequence is registered.", "fork", ("ForkOfUnknownParent",)),
    Rule("before that write the sequence takes a fresh block, the engine copies the shared "
         "block's filled slots into it, and the sequence's table points at the copy",
         "copy_on_write", ("NoCopyOnWrite",)),
    Rule("A full shared block never changes again, so it can stay shared: the next token goes "
         "into a fresh block.", "copy_on_write", ("CopyOnWriteFullBlocksToo",)),
    Rule("The sequence moves to its copy, so the shared block loses this sequence's "
         "reference.", "copy_on_write", ("CopyKeepsReference",)),
    Rule("If no block is free for the copy, raise NoFreeBlocksError and change nothing.",
         "copy_on_write", ("ReleasesBeforeCopying",)),
    Rule("every block in its table loses one reference", "free", ("SharedBlocksNotReleased",)),
    Rule("a block returns to the pool exactly when its count reaches zero, not before (another "
         "sequence still reads it)", "free", ("PrematureFree",)),
    Rule("Freeing an unknown or already-freed sequence is an error (KeyError).", "free",
         ("FreeOfAnUnknownIdIsQuiet",)),
    Rule("Every free-pool operation is O(1)", "free", ("DefensiveFree",)),
]
