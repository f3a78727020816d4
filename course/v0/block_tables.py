"""Chapter 2's reference solutions: blocks, block tables and slot mappings.

Answers are the bodies between ``### BEGIN SOLUTION`` and ``### END SOLUTION``: chapter 2's
notebook renders its cells from them, and a learner edition replaces them with stubs.

A sequence's tokens are numbered 0, 1, 2, ... (logical positions). With block size B, position
t lives in logical block t // B at offset t % B; the block table maps each logical block to a
physical block of the pool, and the flat slot id is physical_block x B + offset::

    block size 4, block table [5, 2, 9]

    logical positions   0  1  2  3 | 4  5  6  7 | 8  9 10 11
    logical block       0          | 1          | 2
    physical block      5          | 2          | 9
    slot ids           20 21 22 23 | 8  9 10 11 |36 37 38 39
"""

from __future__ import annotations


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """How many blocks hold ``num_tokens`` tokens: ceil(num_tokens / block_size), an ``int``
    (0 tokens need 0 blocks)."""
    ### BEGIN SOLUTION
    return -(-num_tokens // block_size)
    ### END SOLUTION


def locate(position: int, block_table: list[int], block_size: int) -> tuple[int, int]:
    """(physical block, offset) of logical ``position``: a tuple of two ``int``.

    Raises ``IndexError`` when the position is negative or at or past
    ``len(block_table) * block_size``.
    """
    ### BEGIN SOLUTION
    if not 0 <= position < len(block_table) * block_size:
        raise IndexError(
            f"position {position} is outside the sequence's {len(block_table)} block(s) of "
            f"{block_size} (positions 0 to {len(block_table) * block_size - 1})"
        )
    logical_block, offset = divmod(position, block_size)
    return block_table[logical_block], offset
    ### END SOLUTION


def slot_id(position: int, block_table: list[int], block_size: int) -> int:
    """Flat slot of logical ``position`` in the pool: physical_block x block_size + offset, an
    ``int``. Raises ``IndexError`` for a position outside the table, as ``locate`` does."""
    ### BEGIN SOLUTION
    physical_block, offset = locate(position, block_table, block_size)
    return physical_block * block_size + offset
    ### END SOLUTION


def slot_mapping(block_table: list[int], block_size: int, start: int, end: int) -> list[int]:
    """Slot ids of positions ``start`` to ``end - 1``: where a kernel writes their K and V.

    A ``list`` of ``int``, one per position of ``range(start, end)``, in order: ``[]`` when
    ``end <= start``, wherever start and end lie. If any position of the range is outside the
    table, raise ``IndexError`` (no partial list).
    """
    ### BEGIN SOLUTION
    return [slot_id(position, block_table, block_size) for position in range(start, end)]
    ### END SOLUTION


def last_block_waste(num_tokens: int, block_size: int) -> int:
    """Empty slots in the last block of a ``num_tokens``-token sequence: an ``int`` from 0 (an
    exact fit, or no tokens) to ``block_size - 1``."""
    ### BEGIN SOLUTION
    return blocks_needed(num_tokens, block_size) * block_size - num_tokens
    ### END SOLUTION


def contiguous_utilisation(lengths: list[int], max_model_len: int) -> float:
    """Share of reserved slots that hold a token when each sequence reserves max_model_len.

    A ``float``. ``lengths`` holds at least one sequence, each of 0 to ``max_model_len``
    tokens.
    """
    ### BEGIN SOLUTION
    return sum(lengths) / (len(lengths) * max_model_len)
    ### END SOLUTION


def paged_utilisation(lengths: list[int], block_size: int) -> float:
    """Share of allocated slots that hold a token when each sequence holds whole blocks.

    A ``float``. At least one of ``lengths`` is positive; a sequence of 0 tokens holds no
    block.
    """
    ### BEGIN SOLUTION
    allocated = sum(blocks_needed(n, block_size) for n in lengths) * block_size
    return sum(lengths) / allocated
    ### END SOLUTION
