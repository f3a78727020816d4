"""Visible checks for chapter 2, fragmentation and block tables: each TODO's readable cases
(the classic one: block size 4, block table [5, 2, 9]). Expected values, and what known
mistakes give, come from the chapter's hidden module (``autograder.private``), where the
property-based thorough checks are too.
"""

from __future__ import annotations

from collections.abc import Callable

from autograder.checks._helpers import expect_equal, expect_raises
from autograder.private import private, visible

CLASSIC_TABLE, CLASSIC_BLOCK = [5, 2, 9], 4

BLOCKS_IDEA = ("n tokens need ceil(n / block_size) blocks: every block but the last is full, "
               "a partly filled last block still counts, and 0 tokens need 0 blocks.")
LOCATE_IDEA = ("Position t is in logical block t // block_size at offset t % block_size "
               "(positions count from 0, so position block_size starts logical block 1), and "
               "the block table maps the logical block to its physical block.")
OUTSIDE_IDEA = ("A position that is negative, or at or past len(block_table) x block_size, "
                "has no slot: raise IndexError (Python's negative indexing would silently "
                "wrap around to the end of the table).")
SLOT_IDEA = ("The flat slot id is physical_block x block_size + offset, with the physical "
             "block from the block table. If locate fails its own test, fix that first.")
MAPPING_IDEA = ("slot_mapping lists the slot id of each position from start up to, but not "
                "including, end (like range(start, end)), in order: one entry per token.")
WASTE_IDEA = ("The last block holds n - (blocks - 1) x block_size tokens; the rest of it is "
              "empty: blocks x block_size - n slots, between 0 (an exact fit) and "
              "block_size - 1.")
CONTIGUOUS_IDEA = ("Utilisation is token states / allocated slots. A contiguous cache "
                   "allocates max_model_len slots to every sequence, whatever its length.")
PAGED_IDEA = ("Utilisation is token states / allocated slots. Paged, a sequence of n tokens "
              "is allocated ceil(n / block_size) whole blocks.")


def expect_case(fn: Callable, case: dict, ask: Callable, idea: str, rel_tol: float = 1e-9
               ) -> None:
    """``fn(**case)`` against ``ask(**case)``: the expected value (None: the call must raise
    IndexError or ValueError) and the values known mistakes give."""
    expected, known = ask(**case)
    if expected is None:
        expect_raises(fn, case, (IndexError, ValueError), OUTSIDE_IDEA)
    else:
        expect_equal(fn, case, expected, idea, known, rel_tol=rel_tol)


def _at(position: int, table: list[int], block_size: int) -> dict:
    return dict(position=position, block_table=table, block_size=block_size)


@visible
def check_blocks_needed(fn: Callable) -> None:
    """0, 1, 16 and 17 tokens in blocks of 16; 10 tokens in blocks of 4."""
    for n, b in [(0, 16), (1, 16), (16, 16), (17, 16), (10, 4)]:
        expect_case(fn, dict(num_tokens=n, block_size=b), private("02").blocks_case,
                   BLOCKS_IDEA, rel_tol=0)


@visible
def check_locate(fn: Callable) -> None:
    """Block size 4, table [5, 2, 9]: positions 0, 6 and 11 live at (5, 0), (2, 2), (9, 3);
    positions 12 and -1 are outside the table. Block size 16, table [7]: position 15."""
    for position in [0, 6, 11, 12, -1]:
        expect_case(fn, _at(position, CLASSIC_TABLE, CLASSIC_BLOCK), private("02").locate_case,
                   LOCATE_IDEA)
    expect_case(fn, _at(15, [7], 16), private("02").locate_case, LOCATE_IDEA)


@visible
def check_slot_id(fn: Callable) -> None:
    """Block size 4, table [5, 2, 9]: positions 0, 6 and 11 are slots 20, 10 and 39."""
    for position in [0, 6, 11]:
        expect_case(fn, _at(position, CLASSIC_TABLE, CLASSIC_BLOCK), private("02").slot_case,
                   SLOT_IDEA)


@visible
def check_slot_mapping(fn: Callable) -> None:
    """Block size 4, table [5, 2, 9]: positions 0 to 9, 3 to 5 (across a boundary), none."""
    for start, end in [(0, 10), (3, 6), (4, 4)]:
        expect_case(fn, dict(block_table=CLASSIC_TABLE, block_size=CLASSIC_BLOCK, start=start,
                            end=end), private("02").mapping_case, MAPPING_IDEA)


@visible
def check_last_block_waste(fn: Callable) -> None:
    """Block size 4: 10 tokens waste 2 slots, 12 waste none, 0 waste none; 1 token of 16: 15."""
    for n, b in [(10, 4), (12, 4), (0, 4), (1, 16)]:
        expect_case(fn, dict(num_tokens=n, block_size=b), private("02").waste_case, WASTE_IDEA,
                   rel_tol=0)


@visible
def check_contiguous_utilisation(fn: Callable) -> None:
    """Four sequences of 100, 300, 2000 and 50 tokens, each reserving 2048 slots."""
    for lengths in ([100, 300, 2000, 50], [2048]):
        expect_case(fn, dict(lengths=lengths, max_model_len=2048),
                   private("02").contiguous_case, CONTIGUOUS_IDEA)


@visible
def check_paged_utilisation(fn: Callable) -> None:
    """Sequences of 10, 16 and 17 tokens in blocks of 16 hold 43 tokens in 4 blocks."""
    for lengths in ([10, 16, 17], [100, 300, 2000, 50]):
        expect_case(fn, dict(lengths=lengths, block_size=16), private("02").paged_case,
                   PAGED_IDEA)
