"""Wrong chapter 2 solutions, as learners write them, with the hint each must get."""

from __future__ import annotations

from course import block_tables as reference


def _floor_blocks(num_tokens, block_size):
    return num_tokens // block_size


def _plus_one_blocks(num_tokens, block_size):
    return num_tokens // block_size + 1


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


def _waste_b_on_exact_fit(num_tokens, block_size):
    return block_size - num_tokens % block_size


def _waste_is_used_slots(num_tokens, block_size):
    return num_tokens % block_size


def _contiguous_by_longest(lengths, max_model_len):
    return sum(lengths) / (len(lengths) * max(lengths))


def _contiguous_one_reservation(lengths, max_model_len):
    return sum(lengths) / max_model_len


def _paged_full_blocks_only(lengths, block_size):
    return sum(lengths) / max(1, sum(n // block_size for n in lengths) * block_size)


def _paged_shared_rounding(lengths, block_size):
    return sum(lengths) / (reference.blocks_needed(sum(lengths), block_size) * block_size)


MUTANTS = {
    "blocks_needed": [
        (_floor_blocks, "rounded down"),
        (_plus_one_blocks, "Off by one on a block boundary"),
    ],
    "locate": [
        (_table_indexed_by_offset, "index the table with the offset"),
        (_offset_from_physical_block, "not relative to the physical block"),
        (_off_by_one_boundary, "Off by one"),
        (_wraps_negative_positions, "negative indexing"),
        (_no_range_check, "raise IndexError"),
    ],
    "slot_id": [
        (_logical_slot, "logical position"),
        (_slot_without_stride, "Multiply the physical block by block_size"),
    ],
    "slot_mapping": [
        (_inclusive_end, "end is exclusive"),
        (_from_zero, "Begin at position start"),
    ],
    "last_block_waste": [
        (_waste_b_on_exact_fit, "An exact fit wastes nothing"),
        (_waste_is_used_slots, "used, not how many are empty"),
    ],
    "contiguous_utilisation": [
        (_contiguous_by_longest, "not the longest length"),
        (_contiguous_one_reservation, "multiply by the number of sequences"),
    ],
    "paged_utilisation": [
        (_paged_full_blocks_only, "full blocks only"),
        (_paged_shared_rounding, "sequences do not share blocks"),
    ],
}
