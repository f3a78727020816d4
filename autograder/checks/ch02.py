"""Checks for chapter 2, fragmentation and block tables.

``check_*`` runs a visible test cell's readable cases (the classic one: block size 4, block
table [5, 2, 9]); ``check_*_thoroughly`` runs property-based cases drawn by hypothesis over
random tables, positions and block sizes, block size 1, sizes that are not powers of two, and
positions on either side of a block boundary (t = kB - 1 and t = kB). Expected values come
from oracles that enumerate slots one by one instead of dividing.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

from hypothesis import strategies as st

from autograder.checks._helpers import expect_equal, expect_raises, for_all

CLASSIC_TABLE, CLASSIC_BLOCK = [5, 2, 9], 4

# --- strategies ----------------------------------------------------------------------------

block_sizes = st.one_of(st.sampled_from([1, 2, 3, 4, 5, 7, 16, 32, 100, 128]),
                        st.integers(1, 300))


@st.composite
def _table_and_position(draw, inside: bool = True):
    block_size = draw(block_sizes)
    table = draw(st.lists(st.integers(0, 100_000), min_size=1, max_size=40, unique=True))
    span = len(table) * block_size
    if inside:
        k = draw(st.integers(0, len(table)))
        near_boundary = [k * block_size - 1, k * block_size]  # t = kB - 1 and t = kB
        position = draw(st.one_of(st.sampled_from(near_boundary), st.integers(0, span - 1)))
        position = min(max(position, 0), span - 1)
    else:
        position = draw(st.one_of(st.integers(span, span + 3 * block_size), st.integers(-50, -1)))
    return table, block_size, position


def _slots_in_order(table: list[int], block_size: int) -> list[tuple[int, int]]:
    """(physical block, offset) of every logical position, enumerated one slot at a time."""
    return [(block, offset) for block in table for offset in range(block_size)]


# --- blocks_needed -------------------------------------------------------------------------

_BLOCKS_IDEA = ("n tokens need ceil(n / block_size) blocks: every block but the last is full, "
                "a partly filled last block still counts, and 0 tokens need 0 blocks.")
_BLOCKS_MISTAKES = [
    (lambda num_tokens, block_size: num_tokens // block_size,
     "You rounded down: the tokens past the last full block need a block too."),
    (lambda num_tokens, block_size: num_tokens // block_size + 1,
     "Off by one on a block boundary: n = k x block_size tokens fill exactly k blocks."),
    (lambda num_tokens, block_size: -(-num_tokens // block_size) * block_size,
     "That is a number of slots: divide by block_size to count blocks."),
]


def _check_blocks(fn: Callable, num_tokens: int, block_size: int) -> None:
    expected = len(range(0, num_tokens, block_size))  # one block starts every block_size tokens
    expect_equal(fn, dict(num_tokens=num_tokens, block_size=block_size), expected,
                 _BLOCKS_IDEA, _BLOCKS_MISTAKES, rel_tol=0)


def check_blocks_needed(fn: Callable) -> None:
    """0, 1, 16 and 17 tokens in blocks of 16; 10 tokens in blocks of 4."""
    for n, b in [(0, 16), (1, 16), (16, 16), (17, 16), (10, 4)]:
        _check_blocks(fn, n, b)


def check_blocks_needed_thoroughly(fn: Callable) -> None:
    """Random sizes, block size 1, and lengths on either side of block boundaries."""

    @st.composite
    def cases(draw):
        block_size = draw(block_sizes)
        k = draw(st.integers(0, 5000))
        n = draw(st.one_of(st.integers(0, 10**6),
                           st.sampled_from([k * block_size - 1, k * block_size,
                                            k * block_size + 1]).filter(lambda x: x >= 0)))
        return n, block_size

    for_all(cases(), lambda case: _check_blocks(fn, *case))


# --- locate --------------------------------------------------------------------------------

_LOCATE_IDEA = ("Position t is in logical block t // block_size at offset t % block_size "
                "(positions count from 0, so position block_size starts logical block 1), and "
                "the block table maps the logical block to its physical block.")
_LOCATE_MISTAKES = [
    (lambda position, block_table, block_size:
        (block_table[position % block_size], position // block_size)
        if position % block_size < len(block_table) else None,
     "Did you index the table with the offset instead of the logical block?"),
    (lambda position, block_table, block_size:
        (block_table[position // block_size],
         position - block_table[position // block_size] * block_size),
     "The offset is the position within its logical block (t % block_size), not relative to "
     "the physical block."),
    (lambda position, block_table, block_size:
        (position // block_size, position % block_size),
     "That is the logical block: translate it through the block table."),
    (lambda position, block_table, block_size:
        (block_table[(position + 1) // block_size], (position + 1) % block_size)
        if (position + 1) // block_size < len(block_table) else None,
     "Off by one: positions count from 0, so t = block_size starts logical block 1."),
]
_OUTSIDE_IDEA = ("A position that is negative, or at or past len(block_table) x block_size, "
                 "has no slot: raise IndexError (Python's negative indexing would silently "
                 "wrap around to the end of the table).")


def _check_locate(fn: Callable, table: list[int], block_size: int, position: int) -> None:
    args = dict(position=position, block_table=table, block_size=block_size)
    slots = _slots_in_order(table, block_size)
    if 0 <= position < len(slots):
        expect_equal(fn, args, slots[position], _LOCATE_IDEA, _LOCATE_MISTAKES)
    else:
        expect_raises(fn, args, (IndexError, ValueError), _OUTSIDE_IDEA)


def check_locate(fn: Callable) -> None:
    """Block size 4, table [5, 2, 9]: positions 0, 6 and 11 live at (5, 0), (2, 2), (9, 3);
    positions 12 and -1 are outside the table. Block size 16, table [7]: position 15."""
    for position in [0, 6, 11, 12, -1]:
        _check_locate(fn, CLASSIC_TABLE, CLASSIC_BLOCK, position)
    _check_locate(fn, [7], 16, 15)


def check_locate_thoroughly(fn: Callable) -> None:
    """Random tables and block sizes; positions at t = kB - 1 and kB; positions outside."""
    for_all(_table_and_position(), lambda case: _check_locate(fn, *case))
    for_all(_table_and_position(inside=False), lambda case: _check_locate(fn, *case),
            max_examples=60)


# --- slot_id -------------------------------------------------------------------------------

_SLOT_IDEA = ("The flat slot id is physical_block x block_size + offset, with the physical "
              "block from the block table. If locate fails its own test, fix that first.")
_SLOT_MISTAKES = [
    (lambda position, block_table, block_size: position,
     "That is the logical position: the slot id uses the physical block from the table."),
    (lambda position, block_table, block_size:
        block_table[position // block_size] + position % block_size
        if position // block_size < len(block_table) else None,
     "Multiply the physical block by block_size before adding the offset."),
]


def _check_slot(fn: Callable, table: list[int], block_size: int, position: int) -> None:
    args = dict(position=position, block_table=table, block_size=block_size)
    slots = _slots_in_order(table, block_size)
    if 0 <= position < len(slots):
        block, offset = slots[position]
        expect_equal(fn, args, block * block_size + offset, _SLOT_IDEA, _SLOT_MISTAKES)
    else:
        expect_raises(fn, args, (IndexError, ValueError), _OUTSIDE_IDEA)


def check_slot_id(fn: Callable) -> None:
    """Block size 4, table [5, 2, 9]: positions 0, 6 and 11 are slots 20, 10 and 39."""
    for position in [0, 6, 11]:
        _check_slot(fn, CLASSIC_TABLE, CLASSIC_BLOCK, position)


def check_slot_id_thoroughly(fn: Callable) -> None:
    """Random tables and block sizes; positions at block boundaries and outside the table."""
    for_all(_table_and_position(), lambda case: _check_slot(fn, *case))
    for_all(_table_and_position(inside=False), lambda case: _check_slot(fn, *case),
            max_examples=40)


# --- slot_mapping --------------------------------------------------------------------------

_MAPPING_IDEA = ("slot_mapping lists the slot id of each position from start up to, but not "
                 "including, end (like range(start, end)), in order: one entry per token.")
_MAPPING_MISTAKES = [
    (lambda block_table, block_size, start, end:
        _mapping_oracle(block_table, block_size, start, end + 1)
        if end < len(block_table) * block_size else None,
     "end is exclusive: the last position is end - 1."),
    (lambda block_table, block_size, start, end:
        _mapping_oracle(block_table, block_size, 0, end - start),
     "Begin at position start, not at 0."),
    (lambda block_table, block_size, start, end: list(range(start, end)),
     "Those are logical positions: map each through the block table."),
]


def _mapping_oracle(table: list[int], block_size: int, start: int, end: int) -> list[int]:
    slots = _slots_in_order(table, block_size)
    return [block * block_size + offset for block, offset in slots[start:end]]


def _check_mapping(fn: Callable, table: list[int], block_size: int, start: int, end: int
                   ) -> None:
    args = dict(block_table=table, block_size=block_size, start=start, end=end)
    expect_equal(fn, args, _mapping_oracle(table, block_size, start, end), _MAPPING_IDEA,
                 _MAPPING_MISTAKES)


def check_slot_mapping(fn: Callable) -> None:
    """Block size 4, table [5, 2, 9]: positions 0 to 9, 3 to 5 (across a boundary), none."""
    for start, end in [(0, 10), (3, 6), (4, 4)]:
        _check_mapping(fn, CLASSIC_TABLE, CLASSIC_BLOCK, start, end)


def check_slot_mapping_thoroughly(fn: Callable) -> None:
    """Random tables, block sizes and ranges, empty ranges, ranges ending on a boundary."""

    @st.composite
    def cases(draw):
        table, block_size, start = draw(_table_and_position())
        end = draw(st.integers(start, len(table) * block_size))
        return table, block_size, start, end

    for_all(cases(), lambda case: _check_mapping(fn, *case), max_examples=100)


# --- last_block_waste ----------------------------------------------------------------------

_WASTE_IDEA = ("The last block holds n - (blocks - 1) x block_size tokens; the rest of it is "
               "empty: blocks x block_size - n slots, between 0 (an exact fit) and "
               "block_size - 1.")
_WASTE_MISTAKES = [
    (lambda num_tokens, block_size: block_size - num_tokens % block_size,
     "An exact fit wastes nothing: block_size - n % block_size gives block_size when n is a "
     "multiple of block_size, and the waste is never more than block_size - 1."),
    (lambda num_tokens, block_size: num_tokens % block_size,
     "That is how many slots of the last block are used, not how many are empty."),
]


def _check_waste(fn: Callable, num_tokens: int, block_size: int) -> None:
    used_slots = len(range(0, num_tokens, block_size)) * block_size
    expect_equal(fn, dict(num_tokens=num_tokens, block_size=block_size),
                 used_slots - num_tokens, _WASTE_IDEA, _WASTE_MISTAKES, rel_tol=0)


def check_last_block_waste(fn: Callable) -> None:
    """Block size 4: 10 tokens waste 2 slots, 12 waste none, 0 waste none; 1 token of 16: 15."""
    for n, b in [(10, 4), (12, 4), (0, 4), (1, 16)]:
        _check_waste(fn, n, b)


def check_last_block_waste_thoroughly(fn: Callable) -> None:
    """Random lengths and block sizes, exact fits, block size 1 (never any waste)."""

    @st.composite
    def cases(draw):
        block_size = draw(block_sizes)
        k = draw(st.integers(0, 1000))
        n = draw(st.one_of(st.integers(0, 10**5), st.just(k * block_size),
                           st.just(k * block_size + 1)))
        return n, block_size

    for_all(cases(), lambda case: _check_waste(fn, *case))


# --- contiguous_utilisation and paged_utilisation ------------------------------------------

_CONTIGUOUS_IDEA = ("Utilisation is token states / allocated slots. A contiguous cache "
                    "allocates max_model_len slots to every sequence, whatever its length.")
_CONTIGUOUS_MISTAKES = [
    (lambda lengths, max_model_len: len(lengths) * max_model_len / sum(lengths)
        if sum(lengths) else None,
     "That is upside down: divide the tokens by the allocated slots."),
    (lambda lengths, max_model_len: sum(lengths) / (len(lengths) * max(lengths)),
     "Each sequence reserves max_model_len, not the longest length in the set."),
    (lambda lengths, max_model_len: sum(lengths) / max_model_len,
     "Every sequence reserves its own max_model_len slots: multiply by the number of "
     "sequences."),
]
_PAGED_IDEA = ("Utilisation is token states / allocated slots. Paged, a sequence of n tokens "
               "is allocated ceil(n / block_size) whole blocks.")
_PAGED_MISTAKES = [
    (lambda lengths, block_size:
        sum(lengths) / (sum(n // block_size for n in lengths) * block_size)
        if sum(n // block_size for n in lengths) else None,
     "You counted full blocks only: a partly filled last block is allocated too."),
    (lambda lengths, block_size:
        sum(lengths) / (-(-sum(lengths) // block_size) * block_size),
     "Each sequence rounds up to whole blocks on its own: sequences do not share blocks."),
]


def _check_contiguous(fn: Callable, lengths: list[int], max_model_len: int) -> None:
    expected = float(Fraction(sum(lengths), len(lengths) * max_model_len))
    expect_equal(fn, dict(lengths=lengths, max_model_len=max_model_len), expected,
                 _CONTIGUOUS_IDEA, _CONTIGUOUS_MISTAKES)


def _check_paged(fn: Callable, lengths: list[int], block_size: int) -> None:
    allocated = sum(len(range(0, n, block_size)) for n in lengths) * block_size
    expected = float(Fraction(sum(lengths), allocated))
    expect_equal(fn, dict(lengths=lengths, block_size=block_size), expected, _PAGED_IDEA,
                 _PAGED_MISTAKES)


def check_contiguous_utilisation(fn: Callable) -> None:
    """Four sequences of 100, 300, 2000 and 50 tokens, each reserving 2048 slots."""
    _check_contiguous(fn, [100, 300, 2000, 50], 2048)
    _check_contiguous(fn, [2048], 2048)


def check_contiguous_utilisation_thoroughly(fn: Callable) -> None:
    """Random sets of sequences, including empty sequences and full-length ones."""

    @st.composite
    def cases(draw):
        max_model_len = draw(st.sampled_from([128, 512, 2048, 4096, 1000]))
        lengths = draw(st.lists(st.integers(0, max_model_len), min_size=1, max_size=50))
        return lengths, max_model_len

    for_all(cases(), lambda case: _check_contiguous(fn, *case))


def check_paged_utilisation(fn: Callable) -> None:
    """Sequences of 10, 16 and 17 tokens in blocks of 16 hold 43 tokens in 4 blocks."""
    _check_paged(fn, [10, 16, 17], 16)
    _check_paged(fn, [100, 300, 2000, 50], 16)


def check_paged_utilisation_thoroughly(fn: Callable) -> None:
    """Random sets, block size 1 (always 1.0), empty sequences among them, exact fits."""

    @st.composite
    def cases(draw):
        block_size = draw(block_sizes)
        lengths = draw(st.lists(st.integers(0, 5000), min_size=1, max_size=50)
                       .filter(lambda ls: sum(ls) > 0))
        return lengths, block_size

    for_all(cases(), lambda case: _check_paged(fn, *case))
