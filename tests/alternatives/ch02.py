"""Chapter 2 solved another way: walking the table block by block instead of dividing."""

from __future__ import annotations

import math


def blocks_needed(num_tokens, block_size):
    return math.ceil(num_tokens / block_size)


def locate(position, block_table, block_size):
    if position < 0:
        raise IndexError("negative position")
    remaining = position
    for physical in block_table:
        if remaining < block_size:
            return physical, remaining
        remaining -= block_size
    raise IndexError("past the end of the block table")


def slot_id(position, block_table, block_size):
    block, offset = locate(position, block_table, block_size)
    return block * block_size + offset


def slot_mapping(block_table, block_size, start, end):
    slots = []
    for position in range(start, end):
        slots.append(slot_id(position, block_table, block_size))
    return slots


def last_block_waste(num_tokens, block_size):
    remainder = num_tokens % block_size
    return 0 if remainder == 0 else block_size - remainder


def contiguous_utilisation(lengths, max_model_len):
    return sum(n / max_model_len for n in lengths) / len(lengths)


def paged_utilisation(lengths, block_size):
    used = allocated = 0
    for n in lengths:
        used += n
        allocated += blocks_needed(n, block_size) * block_size
    return used / allocated
