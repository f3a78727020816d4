"""Chapter 2's hidden checks: property-based cases drawn by hypothesis over random tables,
positions and block sizes (block size 1, sizes that are not powers of two, positions on
either side of a block boundary: t = kB - 1 and t = kB), checked against oracles that
enumerate slots one by one instead of dividing; and the known mistakes a hint names.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache

from hypothesis import strategies as st

from autograder.checks._contract import INT, LIST_OF_INTS, TUPLE_OF_INTS, Raises
from autograder.checks._helpers import for_all, mistakes
from autograder.checks._lending import one_bug_one_todo_of_function
from autograder.checks.ch02 import (
    BLOCKS_IDEA,
    CONTIGUOUS_IDEA,
    LOCATE_IDEA,
    PAGED_IDEA,
    SLOT_IDEA,
    WASTE_IDEA,
    _at,
    _span,
    blocks_todo,
    expect_case,
    locate_todo,
    mapping_idea,
    outside_idea,
    slot_id_todos,
)
from autograder.private import thorough
from course.v0 import block_tables

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
        position = draw(st.one_of(st.sampled_from([span, -1]),
                                  st.integers(span, span + 3 * block_size),
                                  st.integers(-50, -1)))
    return table, block_size, position


def _slots_in_order(table: list[int], block_size: int) -> list[tuple[int, int]]:
    """(physical block, offset) of every logical position, enumerated one slot at a time."""
    return list(_enumerated(tuple(table), block_size))


@lru_cache(maxsize=256)
def _enumerated(table: tuple[int, ...], block_size: int) -> tuple[tuple[int, int], ...]:
    return tuple((block, offset) for block in table for offset in range(block_size))


def _inside(case: dict) -> bool:
    return 0 <= case["position"] < len(case["block_table"]) * case["block_size"]


def _lending(*todos: str) -> dict[str, Callable]:
    """The course's answers of the earlier TODOs a check lends where the learner's fail."""
    return {todo: getattr(block_tables, todo) for todo in todos}


def _position_idea(inside_idea: str) -> Callable[[dict], str]:
    return lambda case: inside_idea if _inside(case) else outside_idea(case["position"])


# --- blocks_needed -------------------------------------------------------------------------

_BLOCKS_MISTAKES = [
    (lambda num_tokens, block_size: num_tokens // block_size,
     "You rounded down: the tokens past the last full block need a block too."),
    (lambda num_tokens, block_size: num_tokens // block_size + 1,
     "Off by one on a block boundary: n = k x block_size tokens fill exactly k blocks "
     "(0 tokens: 0 blocks)."),
    (lambda num_tokens, block_size: -(-num_tokens // block_size) * block_size,
     "That is a number of slots, not of blocks."),
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
        fn, dict(num_tokens=case[0], block_size=case[1]), blocks_case, BLOCKS_IDEA, rel_tol=0,
        promise=INT))


# --- locate --------------------------------------------------------------------------------

_LOCATE_MISTAKES = [
    (lambda position, block_table, block_size:
        (block_table[position % block_size], position // block_size)
        if position % block_size < len(block_table) else None,
     "Did you index the table with the offset instead of the logical block?"),
    (lambda position, block_table, block_size:
        (block_table[position // block_size],
         position - block_table[position // block_size] * block_size),
     "The offset is the position's place within its logical block, not relative to the "
     "physical block's number."),
    (lambda position, block_table, block_size:
        (position // block_size, position % block_size),
     "That is the logical block: the block table says which physical block holds it."),
    (lambda position, block_table, block_size:
        (block_table[(position + 1) // block_size], (position + 1) % block_size)
        if (position + 1) // block_size < len(block_table) else None,
     "Off by one: positions count from 0, so t = block_size starts logical block 1."),
]


def _slot_at(case: dict) -> tuple[int, int] | None:
    slots = _enumerated(tuple(case["block_table"]), case["block_size"])
    return slots[case["position"]] if 0 <= case["position"] < len(slots) else None


def locate_case(**case) -> tuple:
    found = _slot_at(case)
    if found is None:
        return Raises(IndexError), []
    return found, mistakes(_LOCATE_MISTAKES, case)


@thorough
def check_locate_thoroughly(fn: Callable) -> None:
    """Random tables and block sizes; positions at t = kB - 1 and kB; positions outside, at
    -1 and at exactly len(table) x block_size among them; always a tuple of two int."""
    for inside, examples in [(True, 150), (False, 60)]:
        for_all(_table_and_position(inside=inside),
                lambda case: expect_case(fn, _at(case[2], case[0], case[1]), locate_case,
                                         _position_idea(LOCATE_IDEA), promise=TUPLE_OF_INTS),
                max_examples=examples)


# --- slot_id -------------------------------------------------------------------------------

_SLOT_MISTAKES = [
    (lambda position, block_table, block_size: position,
     "That is the logical position: the slot id uses the physical block from the table."),
    (lambda position, block_table, block_size:
        block_table[position // block_size] + position % block_size
        if position // block_size < len(block_table) else None,
     "That adds the offset to the physical block's number, not to where that block starts "
     "in the pool: each block is block_size slots long."),
]


def slot_case(**case) -> tuple:
    found = _slot_at(case)
    if found is None:
        return Raises(IndexError), []
    return found[0] * case["block_size"] + found[1], mistakes(_SLOT_MISTAKES, case)


@thorough
def check_slot_id_thoroughly(fn: Callable) -> None:
    """Random tables and block sizes; positions at block boundaries and outside the table;
    always an int. A wrong ``locate`` costs its own points alone: where ``fn`` fails, it runs
    again with the course's ``locate`` lent, and fails only where that fails too."""
    hidden = sys.modules[__name__]

    def check(subject: Callable) -> None:
        for inside, examples in [(True, 150), (False, 40)]:
            for_all(_table_and_position(inside=inside),
                    lambda case: expect_case(
                        subject, _at(case[2], case[0], case[1]), slot_case,
                        _position_idea(SLOT_IDEA), promise=INT,
                        earlier=lambda at: locate_todo(hidden, at["position"],
                                                       at["block_table"], at["block_size"])),
                    max_examples=examples)

    one_bug_one_todo_of_function(check, fn, _lending("locate"))


# --- slot_mapping --------------------------------------------------------------------------


def _mapping_oracle(table: list[int], block_size: int, start: int, end: int) -> list[int]:
    slots = _slots_in_order(table, block_size)
    return [block * block_size + offset for block, offset in slots[start:end]]


_MAPPING_MISTAKES = [
    (lambda block_table, block_size, start, end:
        _mapping_oracle(block_table, block_size, start, end + 1)
        if start <= end < len(block_table) * block_size else None,
     "end is exclusive: the last position is end - 1."),
    (lambda block_table, block_size, start, end:
        _mapping_oracle(block_table, block_size, 0, end - start) if start < end else None,
     "Begin at position start, not at 0."),
    (lambda block_table, block_size, start, end: list(range(start, end)) if start < end
        else None,
     "Those are logical positions: each goes through the block table to its slot."),
    (lambda block_table, block_size, start, end:
        _mapping_oracle(block_table, block_size, end, start) if end < start else None,
     "A range with end < start is empty: it is not read backwards."),
]


def mapping_case(**case) -> tuple:
    start, end = case["start"], case["end"]
    if end <= start:
        return [], mistakes(_MAPPING_MISTAKES, case)
    if start < 0 or end > len(case["block_table"]) * case["block_size"]:
        return Raises(IndexError), []
    expected = _mapping_oracle(case["block_table"], case["block_size"], start, end)
    return expected, mistakes(_MAPPING_MISTAKES, case)


@thorough
def check_slot_mapping_thoroughly(fn: Callable) -> None:
    """Random tables, block sizes and ranges: inside the table, ending exactly at its end,
    empty (anywhere, even outside), reversed, running past its end, starting before 0;
    always a list of int. A wrong ``slot_id`` or ``locate`` costs its own points alone: both
    are lent where ``fn`` fails."""
    hidden = sys.modules[__name__]

    @st.composite
    def cases(draw):
        table, block_size, start = draw(_table_and_position())
        span = len(table) * block_size
        kind = draw(st.sampled_from(["inside", "to the end", "empty", "reversed", "past the end",
                                     "before 0"]))
        if kind == "inside":
            end = draw(st.integers(start, span))
        elif kind == "to the end":
            end = span
        elif kind == "empty":
            start = end = draw(st.integers(-3 * block_size, span + 3 * block_size))
        elif kind == "reversed":
            end = draw(st.integers(-3 * block_size, span + 3 * block_size))
            start = draw(st.integers(end + 1, end + 2 * span + 1))
        elif kind == "past the end":
            end = draw(st.integers(span + 1, span + 2 * block_size))
        else:
            start = draw(st.integers(-2 * block_size, -1))
            end = draw(st.integers(start + 1, span))
        return _span(table, block_size, start, end)

    one_bug_one_todo_of_function(
        lambda subject: for_all(cases(), lambda case: expect_case(
            subject, case, mapping_case, mapping_idea, promise=LIST_OF_INTS,
            earlier=lambda c: slot_id_todos(hidden, c)), max_examples=150),
        fn, _lending("slot_id", "locate"))


# --- last_block_waste ----------------------------------------------------------------------

_WASTE_MISTAKES = [
    (lambda num_tokens, block_size: block_size - num_tokens % block_size,
     "An exact fit wastes nothing: that counts a whole empty block when the tokens fill their "
     "blocks exactly."),
    (lambda num_tokens, block_size: num_tokens % block_size,
     "That is how many slots of the last block are used, not how many are empty."),
]


def waste_case(**case) -> tuple:
    used_slots = len(range(0, case["num_tokens"], case["block_size"])) * case["block_size"]
    return used_slots - case["num_tokens"], mistakes(_WASTE_MISTAKES, case)


@thorough
def check_last_block_waste_thoroughly(fn: Callable) -> None:
    """Random lengths and block sizes, exact fits, block size 1 (never any waste). A wrong
    ``blocks_needed`` costs its own points alone: it is lent where ``fn`` fails."""

    @st.composite
    def cases(draw):
        block_size = draw(block_sizes)
        k = draw(st.integers(0, 1000))
        n = draw(st.one_of(st.integers(0, 10**5), st.just(k * block_size),
                           st.just(k * block_size + 1)))
        return dict(num_tokens=n, block_size=block_size)

    hidden = sys.modules[__name__]
    one_bug_one_todo_of_function(
        lambda subject: for_all(cases(), lambda case: expect_case(
            subject, case, waste_case, WASTE_IDEA, rel_tol=0, promise=INT,
            earlier=lambda c: blocks_todo(hidden, [c["num_tokens"]], c["block_size"]))),
        fn, _lending("blocks_needed"))


# --- contiguous_utilisation and paged_utilisation ------------------------------------------

PERCENTAGE = "That is a percentage: utilisation is a share, a float between 0 and 1."
_CONTIGUOUS_MISTAKES = [
    (lambda lengths, max_model_len: len(lengths) * max_model_len / sum(lengths)
        if sum(lengths) else None,
     "That is upside down: allocated slots per token, not tokens per allocated slot."),
    (lambda lengths, max_model_len: sum(lengths) / (len(lengths) * max(lengths)),
     "Each sequence reserves max_model_len, not the longest length in the set."),
    (lambda lengths, max_model_len: sum(lengths) / max_model_len,
     "That counts one reservation: every sequence reserves its own max_model_len slots."),
    (lambda lengths, max_model_len: 100 * sum(lengths) / (len(lengths) * max_model_len),
     PERCENTAGE),
]
_PAGED_MISTAKES = [
    (lambda lengths, block_size:
        sum(lengths) / (sum(n // block_size for n in lengths) * block_size)
        if sum(n // block_size for n in lengths) else None,
     "You counted full blocks only: a partly filled last block is allocated too."),
    (lambda lengths, block_size:
        sum(lengths) / (-(-sum(lengths) // block_size) * block_size),
     "Each sequence rounds up to whole blocks on its own: sequences do not share blocks."),
    (lambda lengths, block_size:
        sum(lengths) / ((sum(-(-n // block_size) for n in lengths) + lengths.count(0))
                        * block_size) if 0 in lengths else None,
     "A sequence of 0 tokens holds no block: it has no token to put in one."),
    (lambda lengths, block_size:
        100 * sum(lengths) / (sum(-(-n // block_size) for n in lengths) * block_size),
     PERCENTAGE),
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
    """Random sets, block size 1 (always 1.0), empty sequences among them, exact fits. A
    wrong ``blocks_needed`` costs its own points alone: it is lent where ``fn`` fails."""

    @st.composite
    def cases(draw):
        block_size = draw(block_sizes)
        lengths = draw(st.lists(st.integers(0, 5000), min_size=1, max_size=50)
                       .filter(lambda ls: sum(ls) > 0))
        return dict(lengths=lengths, block_size=block_size)

    hidden = sys.modules[__name__]
    one_bug_one_todo_of_function(
        lambda subject: for_all(cases(), lambda case: expect_case(
            subject, case, paged_case, PAGED_IDEA,
            earlier=lambda c: blocks_todo(hidden, c["lengths"], c["block_size"]))),
        fn, _lending("blocks_needed"))
