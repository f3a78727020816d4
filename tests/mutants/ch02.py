"""Wrong chapter 2 solutions, as learners write them, with the hint each must get."""

from __future__ import annotations

import types

import numpy as np

from course import block_tables as reference


def _in_notebook(function, name, **beside):
    """``function`` as a notebook holds it, with earlier TODOs' versions ``beside`` it."""
    return types.FunctionType(function.__code__, {**function.__globals__, **beside}, name,
                              function.__defaults__)


def _unwritten(*args, **kwargs):
    raise NotImplementedError()


def _floor_blocks(num_tokens, block_size):
    return num_tokens // block_size


def _plus_one_blocks(num_tokens, block_size):
    return num_tokens // block_size + 1


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


def _paged_full_blocks_only(lengths, block_size):
    return sum(lengths) / max(1, sum(n // block_size for n in lengths) * block_size)


def _paged_shared_rounding(lengths, block_size):
    return sum(lengths) / (reference.blocks_needed(sum(lengths), block_size) * block_size)


# right answers next to a wrong or unwritten earlier TODO in the same notebook
_slot_id_on_a_wrong_locate = _in_notebook(reference.slot_id, "_slot_id_on_a_wrong_locate",
                                          locate=_table_indexed_by_offset)
_slot_id_on_an_unwritten_locate = _in_notebook(
    reference.slot_id, "_slot_id_on_an_unwritten_locate", locate=_unwritten)
_mapping_on_a_wrong_slot_id = _in_notebook(reference.slot_mapping, "_mapping_on_a_wrong_slot_id",
                                           slot_id=_slot_without_stride)
_waste_on_a_wrong_blocks_needed = _in_notebook(
    reference.last_block_waste, "_waste_on_a_wrong_blocks_needed", blocks_needed=_floor_blocks)
_paged_on_a_wrong_blocks_needed = _in_notebook(
    reference.paged_utilisation, "_paged_on_a_wrong_blocks_needed",
    blocks_needed=_plus_one_blocks)

MUTANTS = {
    "blocks_needed": [
        (_floor_blocks, "rounded down"),
        (_plus_one_blocks, "Off by one on a block boundary"),
        (_numpy_ceil_blocks, "a float64; it promises an int"),
    ],
    "locate": [
        (_table_indexed_by_offset, "index the table with the offset"),
        (_offset_from_physical_block, "not relative to the physical block"),
        (_off_by_one_boundary, "Off by one"),
        (_wraps_negative_positions, "negative indexing"),
        (_no_range_check, "negative indexing"),
        (_locate_as_list, "a list; it promises a tuple of two int"),
    ],
    "slot_id": [
        (_logical_slot, "logical position"),
        (_slot_without_stride, "each block is block_size slots long"),
        (_slot_id_on_a_wrong_locate, "Fix locate first"),
        (_slot_id_on_an_unwritten_locate, "Write locate first"),
    ],
    "slot_mapping": [
        (_inclusive_end, "end is exclusive"),
        (_from_zero, "Begin at position start"),
        (_clipped_at_table_end, "has no slot yet"),
        (_reversed_range_raises, "not to an error"),
        (_reversed_range_backwards, "not read backwards"),
        (_vectorised_without_checks, "negative indexing"),
        (_numpy_array, "a ndarray; it promises a list of int"),
        (_mapping_on_a_wrong_slot_id, "Fix slot_id first"),
    ],
    "last_block_waste": [
        (_waste_b_on_exact_fit, "An exact fit wastes nothing"),
        (_waste_is_used_slots, "used, not how many are empty"),
        (_numpy_waste, "a float64; it promises an int"),
        (_waste_on_a_wrong_blocks_needed, "Fix blocks_needed first"),
    ],
    "contiguous_utilisation": [
        (_contiguous_by_longest, "not the longest length"),
        (_contiguous_one_reservation, "counts one reservation"),
    ],
    "paged_utilisation": [
        (_paged_full_blocks_only, "full blocks only"),
        (_paged_shared_rounding, "sequences do not share blocks"),
        (_paged_on_a_wrong_blocks_needed, "Fix blocks_needed first"),
    ],
}
