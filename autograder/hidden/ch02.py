"""Chapter 2's hidden checks: property-based cases drawn by hypothesis over random tables,
positions and block sizes (block size 1, sizes that are not powers of two, positions on
either side of a block boundary: t = kB - 1 and t = kB), checked against oracles that
enumerate slots one by one instead of dividing; and the known mistakes a hint names.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

from hypothesis import strategies as st

from autograder.checks._helpers import for_all, mistakes
from autograder.checks.ch02 import (
    BLOCKS_IDEA,
    CONTIGUOUS_IDEA,
    LOCATE_IDEA,
    MAPPING_IDEA,
    PAGED_IDEA,
    SLOT_IDEA,
    WASTE_IDEA,
    _at,
    expect_case,
)
from autograder.private import thorough

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

_BLOCKS_MISTAKES = [
    (lambda num_tokens, block_size: num_tokens // block_size,
     "You rounded down: the tokens past the last full block need a block too."),
    (lambda num_tokens, block_size: num_tokens // block_size + 1,
     "Off by one on a block boundary: n = k x block_size tokens fill exactly k blocks."),
    (lambda num_tokens, block_size: -(-num_tokens // block_size) * block_size,
     "That is a number of slots: divide by block_size to count blocks."),
]


def blocks_case(**case) -> tuple:
    # one block starts every block_size tokens
    expected = len(range(0, case["num_tokens"], case["block_size"]))
    return expected, mistakes(_BLOCKS_MISTAKES, case)


@thorough
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

    for_all(cases(), lambda case: expect_case(
        fn, dict(num_tokens=case[0], block_size=case[1]), blocks_case, BLOCKS_IDEA, rel_tol=0))


# --- locate --------------------------------------------------------------------------------

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


def _slot_at(case: dict) -> tuple[int, int] | None:
    slots = _slots_in_order(case["block_table"], case["block_size"])
    return slots[case["position"]] if 0 <= case["position"] < len(slots) else None


def locate_case(**case) -> tuple:
    found = _slot_at(case)
    return found, mistakes(_LOCATE_MISTAKES, case) if found else []


@thorough
def check_locate_thoroughly(fn: Callable) -> None:
    """Random tables and block sizes; positions at t = kB - 1 and kB; positions outside."""
    for inside, examples in [(True, 150), (False, 60)]:
        for_all(_table_and_position(inside=inside),
                lambda case: expect_case(fn, _at(case[2], case[0], case[1]), locate_case,
                                        LOCATE_IDEA), max_examples=examples)


# --- slot_id -------------------------------------------------------------------------------

_SLOT_MISTAKES = [
    (lambda position, block_table, block_size: position,
     "That is the logical position: the slot id uses the physical block from the table."),
    (lambda position, block_table, block_size:
        block_table[position // block_size] + position % block_size
        if position // block_size < len(block_table) else None,
     "Multiply the physical block by block_size before adding the offset."),
]


def slot_case(**case) -> tuple:
    found = _slot_at(case)
    if found is None:
        return None, []
    return found[0] * case["block_size"] + found[1], mistakes(_SLOT_MISTAKES, case)


@thorough
def check_slot_id_thoroughly(fn: Callable) -> None:
    """Random tables and block sizes; positions at block boundaries and outside the table."""
    for inside, examples in [(True, 150), (False, 40)]:
        for_all(_table_and_position(inside=inside),
                lambda case: expect_case(fn, _at(case[2], case[0], case[1]), slot_case,
                                        SLOT_IDEA), max_examples=examples)


# --- slot_mapping --------------------------------------------------------------------------


def _mapping_oracle(table: list[int], block_size: int, start: int, end: int) -> list[int]:
    slots = _slots_in_order(table, block_size)
    return [block * block_size + offset for block, offset in slots[start:end]]


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


def mapping_case(**case) -> tuple:
    expected = _mapping_oracle(case["block_table"], case["block_size"], case["start"],
                               case["end"])
    return expected, mistakes(_MAPPING_MISTAKES, case)


@thorough
def check_slot_mapping_thoroughly(fn: Callable) -> None:
    """Random tables, block sizes and ranges, empty ranges, ranges ending on a boundary."""

    @st.composite
    def cases(draw):
        table, block_size, start = draw(_table_and_position())
        end = draw(st.integers(start, len(table) * block_size))
        return dict(block_table=table, block_size=block_size, start=start, end=end)

    for_all(cases(), lambda case: expect_case(fn, case, mapping_case, MAPPING_IDEA),
            max_examples=100)


# --- last_block_waste ----------------------------------------------------------------------

_WASTE_MISTAKES = [
    (lambda num_tokens, block_size: block_size - num_tokens % block_size,
     "An exact fit wastes nothing: block_size - n % block_size gives block_size when n is a "
     "multiple of block_size, and the waste is never more than block_size - 1."),
    (lambda num_tokens, block_size: num_tokens % block_size,
     "That is how many slots of the last block are used, not how many are empty."),
]


def waste_case(**case) -> tuple:
    used_slots = len(range(0, case["num_tokens"], case["block_size"])) * case["block_size"]
    return used_slots - case["num_tokens"], mistakes(_WASTE_MISTAKES, case)


@thorough
def check_last_block_waste_thoroughly(fn: Callable) -> None:
    """Random lengths and block sizes, exact fits, block size 1 (never any waste)."""

    @st.composite
    def cases(draw):
        block_size = draw(block_sizes)
        k = draw(st.integers(0, 1000))
        n = draw(st.one_of(st.integers(0, 10**5), st.just(k * block_size),
                           st.just(k * block_size + 1)))
        return dict(num_tokens=n, block_size=block_size)

    for_all(cases(), lambda case: expect_case(fn, case, waste_case, WASTE_IDEA, rel_tol=0))


# --- contiguous_utilisation and paged_utilisation ------------------------------------------

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
_PAGED_MISTAKES = [
    (lambda lengths, block_size:
        sum(lengths) / (sum(n // block_size for n in lengths) * block_size)
        if sum(n // block_size for n in lengths) else None,
     "You counted full blocks only: a partly filled last block is allocated too."),
    (lambda lengths, block_size:
        sum(lengths) / (-(-sum(lengths) // block_size) * block_size),
     "Each sequence rounds up to whole blocks on its own: sequences do not share blocks."),
]


def contiguous_case(**case) -> tuple:
    lengths = case["lengths"]
    expected = float(Fraction(sum(lengths), len(lengths) * case["max_model_len"]))
    return expected, mistakes(_CONTIGUOUS_MISTAKES, case)


def paged_case(**case) -> tuple:
    allocated = sum(len(range(0, n, case["block_size"])) for n in case["lengths"]) \
        * case["block_size"]
    return float(Fraction(sum(case["lengths"]), allocated)), mistakes(_PAGED_MISTAKES, case)


@thorough
def check_contiguous_utilisation_thoroughly(fn: Callable) -> None:
    """Random sets of sequences, including empty sequences and full-length ones."""

    @st.composite
    def cases(draw):
        max_model_len = draw(st.sampled_from([128, 512, 2048, 4096, 1000]))
        lengths = draw(st.lists(st.integers(0, max_model_len), min_size=1, max_size=50))
        return dict(lengths=lengths, max_model_len=max_model_len)

    for_all(cases(), lambda case: expect_case(fn, case, contiguous_case, CONTIGUOUS_IDEA))


@thorough
def check_paged_utilisation_thoroughly(fn: Callable) -> None:
    """Random sets, block size 1 (always 1.0), empty sequences among them, exact fits."""

    @st.composite
    def cases(draw):
        block_size = draw(block_sizes)
        lengths = draw(st.lists(st.integers(0, 5000), min_size=1, max_size=50)
                       .filter(lambda ls: sum(ls) > 0))
        return dict(lengths=lengths, block_size=block_size)

    for_all(cases(), lambda case: expect_case(fn, case, paged_case, PAGED_IDEA))
