"""Visible checks for chapter 3, the BlockManager: each TODO's readable scenarios.

Every check drives the learner's class through its public methods only (``allocate``,
``append_slot``, ``fork``, ``free``, ``block_table``, ``seq_len``, ``ref_count``,
``num_free_blocks``) and checks, after every operation, contracts any correct manager keeps:
the books balance (a block's count is the number of tables holding it, free + in use = all),
and a sentinel KV pool reads back right. It never asks *which* free block comes next, so a
FIFO, LIFO or random free pool all pass.

The sentinel: every slot the manager hands out is written, in a fake KV pool, with a
(sequence, position) marker, and every copy-on-write it asks for is performed. After each
operation, reading each live sequence's positions through its block table must return
exactly its own tokens (or, before a fork, its parent's).

The stateful hidden checks (random interleavings of every operation, run through the same
harness) are in the chapter's hidden module.
"""

from __future__ import annotations

from collections.abc import Callable

from autograder.checks._harness import Harness, blame_where_due, unwritten
from autograder.private import visible
from course.v0.block_manager import CopyOnWrite, NoFreeBlocksError

SUBJECT = "BlockManager"  # these checks take the learner's class, not a function

_RUN_OUT = ("An operation that runs out of blocks raises NoFreeBlocksError (from "
            "course.v0.block_manager) and changes nothing.")
_COW = ("Copy-on-write: a sequence about to write into a partly filled last block that other "
        "sequences also hold must first take a fresh block and copy the shared block's "
        "filled slots into it (Slot.copy says which); full shared blocks stay shared.")


class _Harness(Harness):
    """The learner's manager, the tokens each sequence should read back, and a fake KV pool."""

    def __init__(self, cls: type, num_blocks: int, block_size: int,
                 blame: str | None = None) -> None:
        super().__init__(blame)
        self.num_blocks, self.block_size = num_blocks, block_size
        # the skeleton's constructor: its own errors pass as they are
        self.bm = self.call(f"bm = BlockManager(num_blocks={num_blocks}, block_size={block_size})",
                            lambda: cls(num_blocks, block_size), allowed=(Exception,))
        self.tokens: dict[int, list[tuple[int, int]]] = {}  # the markers each sequence owns
        self.pool: dict[int, tuple[int, int]] = {}  # fake KV pool: slot -> marker written there

    # -- observing ------------------------------------------------------------------------

    def tables(self) -> dict[int, list[int]]:
        return {seq: list(self.bm.block_table(seq)) for seq in self.tokens}

    def snapshot(self) -> tuple:
        counts = [self.bm.ref_count(b) for b in range(self.num_blocks)]
        lengths = {seq: self.bm.seq_len(seq) for seq in self.tokens}
        return self.tables(), counts, self.bm.num_free_blocks(), lengths

    def verify(self) -> None:
        """The books balance, and every sequence reads back exactly its own tokens."""
        tables = self.tables()
        holders = [0] * self.num_blocks
        for seq, table in tables.items():
            length = len(self.tokens[seq])
            if self.bm.seq_len(seq) != length:
                self.fail(f"seq_len({seq}) is {self.bm.seq_len(seq)}, expected {length}.")
            if len(table) != -(-length // self.block_size):
                self.fail(f"sequence {seq} has {length} tokens but {len(table)} blocks; "
                          f"expected ceil({length} / {self.block_size}).")
            if len(set(table)) != len(table):
                self.fail(f"sequence {seq}'s table {table} names a block twice.")
            for block in table:
                if not 0 <= block < self.num_blocks:
                    self.fail(f"sequence {seq}'s table {table} names block {block}, outside "
                              f"the pool of {self.num_blocks}.")
                holders[block] += 1
        freeing = self.log[-1].startswith("bm.free(")
        for block, held in enumerate(holders):
            count = self.bm.ref_count(block)
            if count > held:
                self.fail(f"block {block}'s reference count is {count} but {held} table(s) hold "
                          "it: a reference was never given back (a leak).",
                          "Freeing a sequence drops one reference from every block in its "
                          "table, shared or not." if freeing else
                          "A block's count is the number of tables that hold it.")
            if count < held:
                self.fail(f"block {block} is held by {held} table(s) but its reference count is "
                          f"{count}: it was released while still in use (a premature free).",
                          "A block returns to the pool only when its count reaches zero."
                          if freeing else "A block's count is the number of tables that "
                          "hold it.")
        in_use = sum(1 for held in holders if held)
        if self.bm.num_free_blocks() != self.num_blocks - in_use:
            self.fail(f"num_free_blocks() is {self.bm.num_free_blocks()}, but {in_use} of "
                      f"{self.num_blocks} blocks are in use.",
                      "free + in use = total: a block must be free exactly when no table "
                      "holds it.")
        for seq, table in tables.items():
            for position, owner in enumerate(self.tokens[seq]):
                slot = table[position // self.block_size] * self.block_size \
                    + position % self.block_size
                found = self.pool.get(slot)
                if found != owner:
                    self.fail(f"sequence {seq}'s position {position} (slot {slot}) holds "
                              f"{_marker(found)}, not {_marker(owner)}: a write landed in a "
                              "block another sequence reads.", _COW)

    # -- operations -----------------------------------------------------------------------

    def allocate(self, seq: int, num_tokens: int) -> bool:
        """Allocate; True when it did, False when it rightly ran out of blocks."""
        before = self.snapshot()
        text = f"bm.allocate({seq}, {num_tokens})"
        needed = -(-num_tokens // self.block_size)
        fits = needed <= before[2]
        self.log.append(text)
        try:
            table = self.bm.allocate(seq, num_tokens)
        except NotImplementedError:
            raise unwritten(text) from None
        except NoFreeBlocksError:
            if fits:
                self.fail(f"it raised NoFreeBlocksError with {before[2]} free blocks for a "
                          f"prompt that needs {needed}.")
            self._unchanged(before, "allocate")
            self._unknown(seq, "allocate raised NoFreeBlocksError")
            return False
        except Exception as exc:
            if not fits:
                self.fail(f"it raised {type(exc).__name__}: {exc}; a prompt that needs {needed} "
                          f"blocks, with {before[2]} free, must raise NoFreeBlocksError.",
                          _RUN_OUT)
            self.fail(f"it raised {type(exc).__name__}: {exc}")
        if not fits:
            self.fail(f"a {num_tokens}-token prompt needs {needed} blocks and only {before[2]} "
                      "are free, yet it was allocated.", _RUN_OUT)
        new = self.bm.block_table(seq)
        if not isinstance(table, list) or table != new:
            self.fail(f"allocate returned {table!r}, expected the new block table {new}.")
        table.append(-1)  # the caller's own list: changing it must not change the manager
        if self.bm.block_table(seq) != new:
            self.fail(f"changing the list allocate returned changed block_table({seq}) too.",
                      "allocate returns a copy of the new table, a list of the caller's own.")
        held_before = {b for t in before[0].values() for b in t}
        if held_before & set(new):
            self.fail(f"the new sequence got block(s) {sorted(held_before & set(new))} that "
                      "other sequences hold.", "allocate takes only free blocks.")
        if len(new) != needed:
            self.fail(f"sequence {seq} got {len(new)} blocks for {num_tokens} tokens; "
                      f"expected ceil({num_tokens} / {self.block_size}) = {needed}.")
        self.tokens[seq] = [(seq, p) for p in range(num_tokens)]
        for position in range(num_tokens):  # prefill writes the prompt's K and V
            block = new[position // self.block_size]
            self.pool[block * self.block_size + position % self.block_size] = (seq, position)
        self.verify()
        return True

    def append(self, seq: int) -> None:
        before = self.snapshot()
        length = len(self.tokens[seq])
        old_table, counts = before[0][seq], before[1]
        needs_block = length % self.block_size == 0 or counts[old_table[-1]] > 1
        text = f"bm.append_slot({seq})"
        self.log.append(text)
        try:
            slot = self.bm.append_slot(seq)
        except NotImplementedError:
            raise unwritten(text) from None
        except NoFreeBlocksError:
            if before[2] > 0:
                self.fail(f"append_slot raised NoFreeBlocksError with {before[2]} free blocks.")
            self._unchanged(before, "append_slot")
            return
        except Exception as exc:
            if needs_block and before[2] == 0:
                self.fail(f"it raised {type(exc).__name__}: {exc}; this token needs a block "
                          "and none is free, so it must raise NoFreeBlocksError.", _RUN_OUT)
            self.fail(f"it raised {type(exc).__name__}: {exc}")
        for other, table in before[0].items():
            if other != seq and self.bm.block_table(other) != table:
                self.fail(f"appending to sequence {seq} changed sequence {other}'s table from "
                          f"{table} to {self.bm.block_table(other)}.",
                          "Each sequence's table is a list of its own: a fork gives the child "
                          "a new list holding the parent's blocks, not the parent's list.")
        offset = length % self.block_size
        if slot.offset != offset:
            self.fail(f"it returned offset {slot.offset} for sequence {seq}'s token {length}, "
                      f"expected {length} % {self.block_size} = {offset}.",
                      "A new token goes at offset seq_len % block_size of the last block; a "
                      "new block is needed exactly when that offset is 0.")
        table = self.bm.block_table(seq)
        if offset == 0:
            if slot.copy is not None:
                self.fail(f"it asked to copy {slot.copy} for a token that starts a new block.",
                          "A full shared block stays shared: the next token goes into a fresh "
                          "block and nothing is copied.")
            if len(table) != len(old_table) + 1 or table[:-1] != old_table:
                self.fail(f"sequence {seq}'s table went from {old_table} to {table}; a full "
                          "last block needs one new block appended.",
                          "Take a new block exactly when seq_len % block_size == 0 (with "
                          "block_size 1, for every token).")
        else:
            shared = counts[old_table[-1]] > 1
            if shared and slot.copy is None:
                self.fail(f"sequence {seq} wrote into block {old_table[-1]}, which "
                          f"{counts[old_table[-1]]} sequences hold, without a copy.", _COW)
            if not shared and slot.copy is not None:
                self.fail(f"it asked for {slot.copy} although block {old_table[-1]} is "
                          "held by this sequence alone.", _COW)
            if len(table) != len(old_table):
                self.fail(f"sequence {seq}'s table went from {old_table} to {table}, but its "
                          "last block still had room.",
                          "A new block is needed only when the last one is full.")
        if slot.block != table[-1]:
            self.fail(f"it returned block {slot.block}, but the sequence's last block is "
                      f"{table[-1]}.")
        if slot.copy is not None:
            expected = CopyOnWrite(old_table[-1], table[-1], offset)
            if (slot.copy.src, slot.copy.dst, slot.copy.num_slots) != (
                    expected.src, expected.dst, expected.num_slots):
                self.fail(f"it asked for {slot.copy}, expected {expected}.", _COW)
            src = slot.copy.src
            if self.bm.ref_count(src) != counts[src] - 1:
                self.fail(f"after sequence {seq} moved to its copy of block {src}, block "
                          f"{src}'s reference count is {self.bm.ref_count(src)}, expected "
                          f"{counts[src] - 1}.", "Copy-on-write moves the sequence to its copy: "
                          "the shared block loses that sequence's reference.")
            for i in range(slot.copy.num_slots):  # the engine performs the copy
                self.pool[slot.copy.dst * self.block_size + i] = \
                    self.pool.get(slot.copy.src * self.block_size + i)
        self.pool[slot.block * self.block_size + slot.offset] = (seq, length)
        self.tokens[seq].append((seq, length))
        self.verify()

    def fork(self, parent: int, child: int) -> None:
        before = self.snapshot()
        self.call(f"bm.fork({parent}, {child})", lambda: self.bm.fork(parent, child))
        # blocks taken first: a fork that copies a block also leaves that block's count as it
        # was, and what it missed is the sharing, not the count
        if self.bm.num_free_blocks() != before[2]:
            self.fail(f"fork changed the free blocks from {before[2]} to "
                      f"{self.bm.num_free_blocks()}.", "A fork shares blocks: nothing is "
                      "allocated or copied, reference counts go up by one.")
        for block in before[0][parent]:
            if self.bm.ref_count(block) != before[1][block] + 1:
                self.fail(f"block {block}'s reference count went from {before[1][block]} to "
                          f"{self.bm.ref_count(block)}; the child holds it now too, so "
                          f"expected {before[1][block] + 1}.",
                          "A fork adds one reference to every block of the parent's table.")
        self.tokens[child] = list(self.tokens[parent])
        if self.bm.block_table(child) != before[0][parent]:
            self.fail(f"the child's table is {self.bm.block_table(child)}, the parent's "
                      f"{before[0][parent]}.", "A fork shares all of the parent's blocks.")
        self.verify()

    def free(self, seq: int) -> None:
        self.call(f"bm.free({seq})", lambda: self.bm.free(seq))
        del self.tokens[seq]
        self.verify()

    def expect_error(self, text: str, action: Callable, errors: tuple, idea: str,
                     unknown: int | None = None) -> None:
        """``action`` must raise one of ``errors`` and change nothing (``unknown``: an id that
        must still be unknown afterwards)."""
        before = self.snapshot()
        self.log.append(text)
        operation = text.split("(")[0].split(".")[-1]
        try:
            action()
        except NotImplementedError:
            raise unwritten(text) from None
        except errors as exc:
            self._unchanged(before, operation)
            if unknown is not None:
                self._unknown(unknown, f"{operation} raised {type(exc).__name__}")
            return
        except Exception as exc:
            self.fail(f"it raised {type(exc).__name__}: {exc}; expected "
                      f"{' or '.join(e.__name__ for e in errors)}.", idea)
        self.fail(f"it raised nothing; expected {' or '.join(e.__name__ for e in errors)}.", idea)

    def _unchanged(self, before: tuple, operation: str) -> None:
        after = self.snapshot()
        if after != before:
            what = ["block tables", "reference counts", "free blocks", "sequence lengths"]
            changed = [w for w, b, a in zip(what, before, after, strict=True) if b != a]
            self.fail(f"{operation} failed but changed the {', '.join(changed)}.",
                      "An operation that cannot complete must leave everything as it was: "
                      "check there are enough free blocks before taking any.")


    def _unknown(self, seq: int, what: str) -> None:
        """``seq`` must not exist: block_table and seq_len of it raise."""
        for query in ("block_table", "seq_len"):
            try:
                value = getattr(self.bm, query)(seq)
            except Exception:
                continue
            self.fail(f"{what}, yet sequence {seq} now exists: {query}({seq}) returned "
                      f"{value!r}.", "Changing nothing includes not registering the sequence.")


def _marker(marker: tuple[int, int] | None) -> str:
    return "nothing" if marker is None else f"sequence {marker[0]}'s token {marker[1]}"


# --- visible checks ------------------------------------------------------------------------
# Each TODO's cases are a plain function of the class; a visible check runs them after
# finding out whether an earlier TODO's cases fail, so that a failure it causes says so.


def _allocate_cases(cls: type, blame: str | None = None) -> None:
    h = _Harness(cls, 8, 4, blame)
    h.allocate(0, 10)
    h.allocate(1, 0)
    h.allocate(2, 21)
    h.expect_error("bm.allocate(0, 1)", lambda: h.bm.allocate(0, 1), (ValueError, KeyError),
                   "A sequence id that already has blocks cannot be allocated again.")
    h.expect_error("bm.allocate(0, 100)", lambda: h.bm.allocate(0, 100),
                   (ValueError, KeyError), "A sequence id that already has blocks raises "
                   "ValueError, checked before anything else: also when the prompt would not "
                   "fit either.")


def _append_slot_cases(cls: type, blame: str | None = None) -> None:
    h = _Harness(cls, 6, 4, blame)
    h.allocate(0, 3)
    h.allocate(1, 4)
    for _ in range(3):
        h.append(0)
        h.append(1)
    one = _Harness(cls, 3, 1, blame)
    one.allocate(0, 1)
    one.append(0)
    one.append(0)
    one.append(0)  # the pool is exhausted: NoFreeBlocksError, nothing changes


def _fork_cases(cls: type, blame: str | None = None, grow: bool = True) -> None:
    h = _Harness(cls, 8, 4, blame)
    h.allocate(0, 6)
    h.fork(0, 1)
    h.fork(1, 2)
    h.expect_error("bm.fork(0, 1)", lambda: h.bm.fork(0, 1), (ValueError, KeyError),
                   "The child id must be new.")
    h.expect_error("bm.fork(7, 3)", lambda: h.bm.fork(7, 3), (KeyError, ValueError),
                   "Forking a sequence that does not exist raises KeyError and registers "
                   "nothing.", unknown=3)
    if grow:  # full blocks: growing takes a fresh one, nothing is copied
        own = _Harness(cls, 8, 4, blame)
        own.allocate(0, 8)
        own.fork(0, 1)
        own.append(1)  # the child's table grows; the parent's must not
        own.append(0)


def _sharing_cases(cls: type) -> None:
    """Fork's cases that run no append_slot (a later TODO rewrites it)."""
    _fork_cases(cls, grow=False)


def _copy_on_write_cases(cls: type, blame: str | None = None) -> None:
    h = _Harness(cls, 8, 4, blame)
    h.allocate(0, 3)
    h.fork(0, 1)
    h.append(1)  # copy-on-write
    h.append(0)  # block 0's last block is its own again: no copy
    full = _Harness(cls, 8, 4, blame)
    full.allocate(0, 4)
    full.fork(0, 1)
    full.append(0)
    full.append(1)
    tight = _Harness(cls, 1, 4, blame)
    tight.allocate(0, 2)
    tight.fork(0, 1)
    tight.append(1)  # must copy, no block free: NoFreeBlocksError, nothing changes


def _free_cases(cls: type, blame: str | None = None) -> None:
    h = _Harness(cls, 8, 4, blame)
    h.allocate(0, 6)
    h.fork(0, 1)
    h.append(1)
    h.append(1)
    h.free(0)
    h.free(1)
    if h.bm.num_free_blocks() != 8:
        h.fail(f"{h.bm.num_free_blocks()} of 8 blocks are free after every sequence left.")
    h.expect_error("bm.free(1)", lambda: h.bm.free(1), (KeyError, ValueError),
                   "Freeing a sequence twice must raise, not release its blocks again.")
    h.expect_error("bm.free(7)", lambda: h.bm.free(7), (KeyError, ValueError),
                   "Freeing a sequence that never existed must raise.")


# What each earlier TODO's own test runs; fork's without growing a sequence, which runs
# append_slot, rewritten by a later TODO.
_PROBES: dict[str, Callable] = {"allocate": _allocate_cases, "append_slot": _append_slot_cases,
                                "fork": _sharing_cases, "copy_on_write": _copy_on_write_cases}


def _with_blame(cases: Callable, cls: type, *earlier: str) -> None:
    """The check's cases, blaming an earlier TODO only where lending the course's version of
    it makes them pass (``_harness.blame_where_due``)."""
    from course.v0.block_manager import BlockManager

    blame_where_due(cases, cls, _PROBES, BlockManager, *earlier,
                    methods={"copy_on_write": "append_slot"})


@visible
def check_allocate(cls: type) -> None:
    """8 blocks of 4: a 10-token prompt takes 3 blocks (a list of the caller's own), an empty
    one none, a 21-token one does not fit (NoFreeBlocksError, nothing changes, the sequence
    does not exist), and an id allocated twice raises ValueError before anything else."""
    _allocate_cases(cls)


@visible
def check_append_slot(cls: type) -> None:
    """Block size 4: a 3-token sequence fills its block, then takes a new one; two sequences
    grow interleaved; block size 1 takes a block per token; running out changes nothing."""
    _with_blame(_append_slot_cases, cls, "allocate")


@visible
def check_fork(cls: type) -> None:
    """A forked child shares every block of its parent; counts go up, nothing is copied; the
    child's table is its own list; a child id in use, or an unknown parent, raises."""
    _with_blame(_fork_cases, cls, "allocate", "append_slot")


@visible
def check_copy_on_write(cls: type) -> None:
    """Block size 4: forked after 3 tokens, the first sequence to write copies the shared
    block; forked after 4, both take fresh blocks and the full block stays shared; a copy
    that finds no free block raises and changes nothing."""
    _with_blame(_copy_on_write_cases, cls, "allocate", "fork")


@visible
def check_free(cls: type) -> None:
    """Freeing a parent keeps the blocks its child shares; freeing the child returns them;
    freeing an unknown or already-freed sequence raises."""
    _with_blame(_free_cases, cls, "allocate", "fork", "copy_on_write")
