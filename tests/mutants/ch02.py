"""Wrong chapter 2 solutions, as learners write them, with the hint each must get; and
``RULES``: each rule the notebook states about a TODO, with the mutants that break it alone."""

from __future__ import annotations

import numpy as np

from course.v0 import block_tables as reference
from mutants import Rule


def _floor_blocks(num_tokens, block_size):
    return num_tokens // block_size


def _plus_one_blocks(num_tokens, block_size):
    return num_tokens // block_size + 1


def _at_least_one_block(num_tokens, block_size):
    return max(1, -(-num_tokens // block_size))  # every sequence gets a first block


def _numpy_ceil_blocks(num_tokens, block_size):
    return np.ceil(num_tokens / block_size)  # a float64


def _table_indexed_by_offset(position, block_table, block_size):
    return block_table[position % block_size], position // block_size


def _offset_from_physical_block(position, block_table, block_size):
    physical = block_table[position // block_size]
    return physical, position - physical * block_size


def _off_by_one_boundary(position, block_table, block_size):
    logical = (position + 1) // block_size
    if logical >= len(block_table):
        raise IndexError(position)
    return block_table[logical], (position + 1) % block_size


def _wraps_negative_positions(position, block_table, block_size):
    if position >= len(block_table) * block_size:
        raise IndexError(position)
    return block_table[position // block_size], position % block_size


def _no_range_check(position, block_table, block_size):
    return block_table[position // block_size], position % block_size


def _walk_without_end_check(position, block_table, block_size):
    if position < 0:
        raise IndexError(position)
    remaining = position
    for physical in block_table:
        if remaining < block_size:
            return physical, remaining
        remaining -= block_size
    return None  # walked off the table's end


def _locate_as_list(position, block_table, block_size):
    if not 0 <= position < len(block_table) * block_size:
        raise IndexError(position)
    return [block_table[position // block_size], position % block_size]


def _logical_slot(position, block_table, block_size):
    reference.locate(position, block_table, block_size)  # range check as the reference does
    return position


def _slot_without_stride(position, block_table, block_size):
    block, offset = reference.locate(position, block_table, block_size)
    return block + offset


def _slot_without_locate(position, block_table, block_size):
    return block_table[position // block_size] * block_size + position % block_size


def _inclusive_end(block_table, block_size, start, end):
    return [reference.slot_id(p, block_table, block_size) for p in range(start, end + 1)
            if p < len(block_table) * block_size]


def _from_zero(block_table, block_size, start, end):
    return [reference.slot_id(p, block_table, block_size) for p in range(end - start)]


def _clipped_at_table_end(block_table, block_size, start, end):
    end = min(end, len(block_table) * block_size)
    return [reference.slot_id(p, block_table, block_size) for p in range(start, end)]


def _reversed_range_raises(block_table, block_size, start, end):
    if end < start:
        raise ValueError(f"end {end} is before start {start}")
    return [reference.slot_id(p, block_table, block_size) for p in range(start, end)]


def _reversed_range_backwards(block_table, block_size, start, end):
    low, high = min(start, end), max(start, end)
    return [reference.slot_id(p, block_table, block_size) for p in range(low, high)]


def _bounds_before_emptiness(block_table, block_size, start, end):
    if start < 0 or end > len(block_table) * block_size:
        raise IndexError(f"positions {start} to {end} are outside the table")
    return [reference.slot_id(p, block_table, block_size) for p in range(start, end)]


def _vectorised_without_checks(block_table, block_size, start, end):
    positions = np.arange(start, end)
    if positions.size and positions.max() >= len(block_table) * block_size:
        raise IndexError(end)
    blocks = np.asarray(block_table)[positions // block_size]  # -1 // 4 is -1: the last block
    return (blocks * block_size + positions % block_size).tolist()


def _numpy_array(block_table, block_size, start, end):
    return np.array([reference.slot_id(p, block_table, block_size) for p in range(start, end)],
                    dtype=np.int64)


def _waste_b_on_exact_fit(num_tokens, block_size):
    return block_size - num_tokens % block_size


def _waste_is_used_slots(num_tokens, block_size):
    return num_tokens % block_size


def _numpy_waste(num_tokens, block_size):
    return np.ceil(num_tokens / block_size) * block_size - num_tokens  # a float64


def _contiguous_by_longest(lengths, max_model_len):
    return sum(lengths) / (len(lengths) * max(lengths))


def _contiguous_one_reservation(lengths, max_model_len):
    return sum(lengths) / max_model_len


def _contiguous_upside_down(lengths, max_model_len):
    return len(lengths) * max_model_len / sum(lengths)


def _contiguous_percent(lengths, max_model_len):
    return 100 * sum(lengths) / (len(lengths) * max_model_len)


def _paged_full_blocks_only(lengths, block_size):
    return sum(lengths) / max(1, sum(n // block_size for n in lengths) * block_size)


def _paged_shared_rounding(lengths, block_size):
    return sum(lengths) / (reference.blocks_needed(sum(lengths), block_size) * block_size)


def _paged_empty_holds_a_block(lengths, block_size):
    return sum(lengths) / (sum(max(1, reference.blocks_needed(n, block_size)) for n in lengths)
                           * block_size)


def _paged_percent(lengths, block_size):
    return 100 * reference.paged_utilisation(lengths, block_size)


MUTANTS = {
    "blocks_needed": [
        (_floor_blocks, "rounded down"),
        (_plus_one_blocks, "Off by one on a block boundary"),
        (_at_least_one_block, "(0 tokens: 0 blocks)"),
        (_numpy_ceil_blocks, "a float64; it promises an int"),
    ],
    "locate": [
        (_table_indexed_by_offset, "index the table with the offset"),
        (_offset_from_physical_block, "not relative to the physical block"),
        (_off_by_one_boundary, "Off by one"),
        (_wraps_negative_positions, "negative indexing"),
        (_no_range_check, "negative indexing"),
        (_walk_without_end_check, "has no slot yet"),
        (_locate_as_list, "a list; it promises a tuple of two int"),
    ],
    "slot_id": [
        (_logical_slot, "logical position"),
        (_slot_without_stride, "each block is block_size slots long"),
        (_slot_without_locate, "negative indexing"),
    ],
    "slot_mapping": [
        (_inclusive_end, "end is exclusive"),
        (_from_zero, "Begin at position start"),
        (_clipped_at_table_end, "has no slot yet"),
        (_reversed_range_raises, "not to an error"),
        (_reversed_range_backwards, "not read backwards"),
        (_bounds_before_emptiness, "wherever it lies"),
        (_vectorised_without_checks, "negative indexing"),
        (_numpy_array, "a ndarray; it promises a list of int"),
    ],
    "last_block_waste": [
        (_waste_b_on_exact_fit, "An exact fit wastes nothing"),
        (_waste_is_used_slots, "used, not how many are empty"),
        (_numpy_waste, "a float64; it promises an int"),
    ],
    "contiguous_utilisation": [
        (_contiguous_by_longest, "not the longest length"),
        (_contiguous_one_reservation, "counts one reservation"),
        (_contiguous_upside_down, "upside down"),
        (_contiguous_percent, "That is a percentage"),
    ],
    "paged_utilisation": [
        (_paged_full_blocks_only, "full blocks only"),
        (_paged_shared_rounding, "sequences do not share blocks"),
        (_paged_empty_holds_a_block, "A sequence of 0 tokens holds no block"),
        (_paged_percent, "That is a percentage"),
    ],
}

RULES = [
    Rule("A sequence holds whole blocks: every block but its last is full, and the last may be "
         "partly empty.", "blocks_needed", ("_floor_blocks", "_plus_one_blocks")),
    Rule("A sequence with no tokens needs no blocks.", "blocks_needed", ("_at_least_one_block",)),
    Rule("ceil(num_tokens / block_size), an ``int``", "blocks_needed", ("_numpy_ceil_blocks",)),
    Rule("The sequence's **block table** lists, for each logical block, the **physical block** "
         "of the pool that holds it.", "locate", ("_table_indexed_by_offset",)),
    Rule("position t lives in logical block `t // B` at offset `t % B`", "locate",
         ("_offset_from_physical_block",)),
    Rule("Token positions in a sequence are **logical**: 0, 1, 2, ...", "locate",
         ("_off_by_one_boundary",)),
    Rule("A position outside the sequence's blocks (negative, or at or past "
         "`len(block_table) * block_size`) has no slot: raise `IndexError`.", "locate",
         ("_walk_without_end_check",)),
    Rule("Careful: Python's negative indexing would quietly answer for position -1.", "locate",
         ("_wraps_negative_positions", "_no_range_check")),
    Rule("position to `(physical block, offset)`, a tuple of two `int`", "locate",
         ("_locate_as_list",)),
    Rule("the flat slot of a position, `physical_block * block_size + offset`", "slot_id",
         ("_logical_slot", "_slot_without_stride")),
    Rule("a position outside the table raises `IndexError` here too", "slot_id",
         ("_slot_without_locate",)),
    Rule("Write `slot_mapping` for positions `start` up to, but not including, `end`",
         "slot_mapping", ("_inclusive_end", "_from_zero")),
    Rule("A range with `end <= start` holds no position: return `[]`, wherever `start` and `end` "
         "lie.", "slot_mapping",
         ("_reversed_range_raises", "_reversed_range_backwards", "_bounds_before_emptiness")),
    Rule("raise `IndexError` rather than return part of the list", "slot_mapping",
         ("_clipped_at_table_end", "_vectorised_without_checks")),
    Rule("a `list` of `int`, one slot id per position of `range(start, end)`", "slot_mapping",
         ("_numpy_array",)),
    Rule("An exact fit wastes nothing, and so do 0 tokens.", "last_block_waste",
         ("_waste_b_on_exact_fit",)),
    Rule("Paging's only waste inside a sequence is the empty tail of its last block",
         "last_block_waste", ("_waste_is_used_slots",)),
    Rule("Empty slots in the last block of a ``num_tokens``-token sequence: an ``int``",
         "last_block_waste", ("_numpy_waste",)),
    Rule("**KV utilisation** is the share of allocated slots that hold a token's state.",
         "contiguous_utilisation", ("_contiguous_upside_down",)),
    Rule("A contiguous cache allocates `max_model_len` slots per sequence",
         "contiguous_utilisation", ("_contiguous_by_longest", "_contiguous_one_reservation")),
    Rule("Both return a `float` between 0 and 1.", "contiguous_utilisation",
         ("_contiguous_percent",)),
    Rule("Share of allocated slots that hold a token when each sequence holds whole blocks.",
         "paged_utilisation", ("_paged_full_blocks_only", "_paged_shared_rounding")),
    Rule("one of 0 tokens holds no block", "paged_utilisation", ("_paged_empty_holds_a_block",)),
    Rule("Both return a `float` between 0 and 1.", "paged_utilisation", ("_paged_percent",)),
]
