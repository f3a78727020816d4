"""Visible checks for chapter 2, fragmentation and block tables: each TODO's readable cases
(the classic one: block size 4, block table [5, 2, 9]). Expected values, and what known
mistakes give, come from the chapter's hidden module (``autograder.private``), where the
property-based thorough checks are too.

A hint says which input broke, what was expected, what came back and which idea was missed
(the known mistake that gives this value, else the TODO's idea); it never recites the fix.
A TODO that builds on an earlier one (``slot_id`` on ``locate``) is told to fix that one
first when it is the earlier one that is wrong on the input.
"""

from __future__ import annotations

from collections.abc import Callable

from autograder.checks._contract import (
    INT,
    LIST_OF_INTS,
    TUPLE_OF_INTS,
    Earlier,
    Promise,
    expect,
    expect_cases,
)
from autograder.private import private, visible

CLASSIC_TABLE, CLASSIC_BLOCK = [5, 2, 9], 4

BLOCKS_IDEA = ("A sequence holds whole blocks: every block but the last is full, a partly "
               "filled last block is still a block, and no tokens need no block.")
LOCATE_IDEA = ("Positions count from 0 within the sequence; each logical block holds "
               "block_size consecutive positions, and the block table says which physical "
               "block holds each logical block.")
NEGATIVE_IDEA = ("A negative position is before the sequence's first token: it has no slot, "
                 "so IndexError (Python's negative indexing would quietly answer from the "
                 "end of the table).")
PAST_END_IDEA = ("The table's blocks hold positions up to len(block_table) x block_size - 1: "
                 "a position at or past that has no slot yet, so IndexError.")
SLOT_IDEA = ("A slot id is a place in the pool's flat array of slots, where each physical "
             "block is block_size slots long.")
MAPPING_IDEA = ("slot_mapping has one slot id per position from start up to, but not "
                "including, end (like range(start, end)), in order.")
EMPTY_RANGE_IDEA = ("A range with end <= start holds no position, wherever it lies: it maps "
                    "to no slot ids at all, not to an error.")
WASTE_IDEA = ("The waste is the empty slots of the last block alone: none when the tokens fill "
              "their blocks exactly (or there are none), never a whole block.")
CONTIGUOUS_IDEA = ("Utilisation is the share of allocated slots that hold a token; a "
                   "contiguous cache allocates max_model_len slots to every sequence, whatever "
                   "its length.")
PAGED_IDEA = ("Utilisation is the share of allocated slots that hold a token; paged, each "
              "sequence is allocated whole blocks of its own.")


def _at(position: int, table: list[int], block_size: int) -> dict:
    return dict(position=position, block_table=table, block_size=block_size)


def _span(table: list[int], block_size: int, start: int, end: int) -> dict:
    return dict(block_table=table, block_size=block_size, start=start, end=end)


def outside_idea(position: int) -> str:
    """The idea a position outside the table tests: before its start, or past its end."""
    return NEGATIVE_IDEA if position < 0 else PAST_END_IDEA


def mapping_idea(case: dict) -> str:
    """The idea a slot_mapping case tests: an empty range, a position outside, or the
    range itself."""
    if case["end"] <= case["start"]:
        return EMPTY_RANGE_IDEA
    if case["start"] < 0:
        return NEGATIVE_IDEA
    if case["end"] > len(case["block_table"]) * case["block_size"]:
        return PAST_END_IDEA
    return MAPPING_IDEA


def expect_case(fn: Callable, case: dict, ask: Callable, idea: str | Callable,
                rel_tol: float = 1e-9, promise: Promise | None = None,
                earlier: Callable[[dict], list[Earlier]] | None = None) -> None:
    """``fn(**case)`` against ``ask(**case)``: the expected value (or ``Raises``) and the
    values known mistakes give; ``idea`` may depend on the case; ``earlier(case)``: the
    earlier TODOs ``fn`` may build on. Every question is asked before the learner's code
    runs."""
    expected, known = ask(**case)
    why = idea(case) if callable(idea) else idea
    before = earlier(case) if earlier else []
    expect(fn, case, expected, why, known, rel_tol=rel_tol, promise=promise, earlier=before)


# --- what an earlier TODO must give on the input a later one broke ---------------------------


def locate_todo(hidden, position: int, table: list[int], block_size: int) -> list[Earlier]:
    """``locate`` on the position a ``slot_id`` case asks about."""
    case = _at(position, table, block_size)
    return [Earlier("locate", case, hidden.locate_case(**case)[0], TUPLE_OF_INTS)]


def slot_id_todos(hidden, case: dict) -> list[Earlier]:
    """``slot_id`` (then ``locate``) on each position of a ``slot_mapping`` case's range."""
    positions = range(case["start"], case["end"])
    if not positions or len(positions) > 64:
        return []
    found = []
    for name, ask, promise in [("slot_id", hidden.slot_case, INT),
                               ("locate", hidden.locate_case, TUPLE_OF_INTS)]:
        for position in positions:
            at = _at(position, case["block_table"], case["block_size"])
            found.append(Earlier(name, at, ask(**at)[0], promise))
    return found


def blocks_todo(hidden, lengths: list[int], block_size: int) -> list[Earlier]:
    """``blocks_needed`` on each length of a case."""
    found = []
    for n in lengths:
        case = dict(num_tokens=n, block_size=block_size)
        found.append(Earlier("blocks_needed", case, hidden.blocks_case(**case)[0], INT))
    return found


# --- the visible checks ---------------------------------------------------------------------


@visible
def check_blocks_needed(fn: Callable) -> None:
    """0, 1, 16 and 17 tokens in blocks of 16; 10 tokens in blocks of 4. An int."""
    expect_cases(fn, [dict(num_tokens=n, block_size=b)
                      for n, b in [(0, 16), (1, 16), (16, 16), (17, 16), (10, 4)]],
                 private("02").blocks_case, BLOCKS_IDEA, rel_tol=0, promise=INT)


@visible
def check_locate(fn: Callable) -> None:
    """Block size 4, table [5, 2, 9]: positions 0, 6 and 11 live at (5, 0), (2, 2), (9, 3);
    positions 12 and -1 are outside the table. Block size 16, table [7]: position 15. A
    tuple of two int."""
    cases = [_at(p, CLASSIC_TABLE, CLASSIC_BLOCK) for p in [0, 6, 11, 12, -1]]
    cases.append(_at(15, [7], 16))
    expect_cases(fn, cases, private("02").locate_case,
                 lambda case: outside_idea(case["position"]) if not
                 0 <= case["position"] < len(case["block_table"]) * case["block_size"]
                 else LOCATE_IDEA, promise=TUPLE_OF_INTS)


@visible
def check_slot_id(fn: Callable) -> None:
    """Block size 4, table [5, 2, 9]: positions 0, 6 and 11 are slots 20, 10 and 39;
    position 12 is outside. An int."""
    hidden = private("02")
    cases = [_at(p, CLASSIC_TABLE, CLASSIC_BLOCK) for p in [0, 6, 11, 12]]
    expect_cases(fn, cases, hidden.slot_case,
                 lambda case: PAST_END_IDEA if case["position"] >= 12 else SLOT_IDEA,
                 promise=INT,
                 earlier=lambda case: locate_todo(hidden, case["position"],
                                                  case["block_table"], case["block_size"]))


@visible
def check_slot_mapping(fn: Callable) -> None:
    """Block size 4, table [5, 2, 9]: positions 0 to 9, 3 to 5 (across a boundary); start 4,
    end 4 (empty) and start 6, end 3 (reversed): both []; positions 10 to 12 (past the
    table's 12 positions) and -1 to 0 (before them): IndexError. A list of int."""
    hidden = private("02")
    cases = [_span(CLASSIC_TABLE, CLASSIC_BLOCK, start, end)
             for start, end in [(0, 10), (3, 6), (4, 4), (6, 3), (10, 13), (-1, 1)]]
    expect_cases(fn, cases, hidden.mapping_case, mapping_idea, promise=LIST_OF_INTS,
                 earlier=lambda case: slot_id_todos(hidden, case))


@visible
def check_last_block_waste(fn: Callable) -> None:
    """Block size 4: 10 tokens waste 2 slots, 12 waste none, 0 waste none; 1 token of 16:
    15. An int."""
    hidden = private("02")
    expect_cases(fn, [dict(num_tokens=n, block_size=b)
                      for n, b in [(10, 4), (12, 4), (0, 4), (1, 16)]],
                 hidden.waste_case, WASTE_IDEA, rel_tol=0, promise=INT,
                 earlier=lambda case: blocks_todo(hidden, [case["num_tokens"]],
                                                  case["block_size"]))


@visible
def check_contiguous_utilisation(fn: Callable) -> None:
    """Four sequences of 100, 300, 2000 and 50 tokens, each reserving 2048 slots; one full
    one."""
    expect_cases(fn, [dict(lengths=lengths, max_model_len=2048)
                      for lengths in ([100, 300, 2000, 50], [2048])],
                 private("02").contiguous_case, CONTIGUOUS_IDEA)


@visible
def check_paged_utilisation(fn: Callable) -> None:
    """Sequences of 10, 16 and 17 tokens in blocks of 16 hold 43 tokens in 4 blocks; a longer
    mix."""
    hidden = private("02")
    expect_cases(fn, [dict(lengths=lengths, block_size=16)
                      for lengths in ([10, 16, 17], [100, 300, 2000, 50])],
                 hidden.paged_case, PAGED_IDEA,
                 earlier=lambda case: blocks_todo(hidden, case["lengths"], case["block_size"]))
