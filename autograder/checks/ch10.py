"""Visible checks for chapter 10, hybrid models in one cache: each TODO's readable cases (the
picture's window of 6 tokens in blocks of 4). Expected values, and what known mistakes give,
come from the chapter's hidden module (``autograder.private``), where the thorough checks are.

A function TODO is held to its whole contract case by case (``_contract.expect``); the
allocator, a method that changes a pool, is driven through a scenario step by step, and each
step's outcome is compared with what the hidden model of the pool says: what the call
returned (or raised), each group's table (where its null blocks stand, how many blocks it
holds), and the pool (no block lost, none handed out twice, the null block never).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from autograder.checks._contract import INT, LIST_OF_INTS, Promise, Raises, expect_cases
from autograder.checks._helpers import describe_call, learner_call, not_written
from autograder.checks._lending import one_bug_one_todo_of_function
from autograder.checks._memory_audit import MemoryAudit
from autograder.checks._tensors import expect_attention_output
from autograder.checks.ch07_audit import quiet
from autograder.checks.ch09 import kernel_audit
from autograder.private import private, visible
from course import hybrid_cache
from course.hybrid_cache import NULL_BLOCK
from course.hybrid_manager import HybridBlockManager
from course.hybrid_models import FULL, HYBRID_MODELS, SLIDING, STATE, HybridModel, LayerGroup
from course.paged_cases import WindowCase, on_gpu
from kernels.varlen_attention import launch_varlen, varlen_attention_kernel

BYTES_IDEA = ("A request holds, in each group: every token under full attention, at most the "
              "window's last tokens under a sliding window, and one state per layer from the "
              "first token on in a state group.")
FREE_IDEA = ("A block goes back only when every one of its tokens is before the window of the "
             "next token (position num_computed): the first num_computed - window + 1 tokens; "
             "its slot keeps its place with the null block, and a null slot gives nothing back. "
             "(Shown: the blocks returned, then the table after the call.)")
SLIDING_HIT_IDEA = ("A sliding window accepts a hit of L tokens when the "
                    "ceil((window - 1) / block_size) blocks just before L are cached (found "
                    "reading right to left from the last whole block within max_length), or "
                    "when every block before L is: a run that reaches block 0.")
HYBRID_HIT_IDEA = ("The hit is the longest length every group accepts at that length, and it "
                   "stops before the last token (which is always computed): shorten it group "
                   "by group until a whole pass changes nothing.")
ALLOCATE_IDEA = ("First each sliding-window group gives back the blocks its window left behind "
                 "once num_computed tokens are computed (they stay given back, even when the "
                 "step then returns False); then every group's new blocks are counted against "
                 "the free blocks and taken together, or none of them (False).")
WINDOW_KEY_IDEA = ("A query at position p has context = p + 1 keys up to its own, 0 .. p, and "
                   "its window sees the last window of them, its own included: the first is "
                   "max(context - window, 0). Chapter 9's kernel starts its block loop at that "
                   "key's block and masks the keys before it.")
WINDOW_NAN = ("NaN: the kernel read a slot no token was written to, or saw no key at all: the "
              "table entries before the first query's window hold the null block, and so do "
              "the entries before a row (what a first key below 0 reaches). The first key is "
              "never before the window, never below 0 and never past the query's own "
              "position. ")
NOT_JIT = ("window_first_key is called inside chapter 9's kernel, so it must be a Triton "
           "function: keep the @triton.jit the cell gives it.")
BAD_STEP_IDEA = ("A step computes at least one new token after those computed: "
                 "num_computed < 0 or num_new < 1 is a ValueError.")

SUBJECT = "HybridBlockManager"  # allocate_slots's checks take the learner's class
SUBJECT_CHECKS = {"allocate_slots"}

# the picture's model of three groups, small enough to read
SMALL = HybridModel("small: 2 sliding layers (window 8), 2 full, 1 state", (
    LayerGroup(SLIDING, 2, 2, 4, window=8), LayerGroup(FULL, 2, 2, 4),
    LayerGroup(STATE, 1, state_elements=100)), 64, "chapter 10's own")

FREED_AND_TABLE = Promise(
    "a list of int (the blocks freed)",
    lambda value: LIST_OF_INTS(value[0]))


def freeing(fn: Callable) -> Callable:
    """``fn`` on a copy of the table, seen as (what it returned, the table after the call)."""

    def called(table: list[int], num_computed: int, window: int, block_size: int) -> tuple:
        after = list(table)
        return fn(after, num_computed, window, block_size), after

    called.__name__ = getattr(fn, "__name__", "free_skipped_blocks")
    return called


def _bytes(model: HybridModel, tokens: int, bpe: float = 2) -> dict:
    return dict(model=model, num_tokens=tokens, bytes_per_element=bpe)


def _free(table: list[int], computed: int, window: int, block_size: int) -> dict:
    return dict(table=table, num_computed=computed, window=window, block_size=block_size)


def _sliding(cached: set[int], max_length: int, block_size: int, window: int) -> dict:
    return dict(cached=cached, max_length=max_length, block_size=block_size, window=window)


def _hybrid(groups: list[tuple[set[int], int | None]], tokens: int, block_size: int) -> dict:
    return dict(groups=groups, num_tokens=tokens, block_size=block_size)


# --- the pool, step by step -------------------------------------------------------------------


def observe(manager: HybridBlockManager, requests: list[int]) -> dict:
    """What any correct pool shows after a step, whichever free block it happened to take:
    each request's tables as where the null blocks stand and how long each table is, the free
    blocks' count, and what is wrong with the books (a block twice, the null block handed out,
    a block lost)."""
    tables = {r: [[i for i, b in enumerate(t) if b == NULL_BLOCK] + [len(t)]
                  for t in manager.tables[r]] for r in requests if r in manager.tables}
    held = [b for r in manager.tables for t in manager.tables[r] for b in t if b != NULL_BLOCK]
    free = list(manager.free_blocks)
    problems = []
    if NULL_BLOCK in free:
        problems.append("the null block is in the free queue")
    if len(set(held)) != len(held):
        problems.append("a block is in two tables")
    if set(held) & set(free):
        problems.append("a block is both held and free")
    return {"tables": tables, "free": len(free), "problems": problems}


def run_steps(name: str, subject: Callable, windows: tuple, block_size: int, num_blocks: int,
              steps: list[tuple], expected: list[Any]) -> None:
    """Play ``steps`` (("allocate", request, num_computed, num_new) or ("free", request)) on a
    pool of the learner's class ``subject`` (or of the course's class with ``subject`` as its
    ``allocate_slots``), against ``expected`` (one ``observe``-like dict per step, with
    ``returned``: a bool, or ``Raises``)."""
    pool = subject if isinstance(subject, type) else type(
        "HybridBlockManager", (HybridBlockManager,), {"allocate_slots": subject})
    fn = pool.allocate_slots
    manager = pool(num_blocks, block_size, windows)
    done = [f"HybridBlockManager(num_blocks={num_blocks}, block_size={block_size}, "
            f"windows={windows})"]
    requests = sorted({step[1] for step in steps})
    for step, want in zip(steps, expected, strict=True):
        if step[0] == "free":
            manager.free(step[1])
            done.append(f"free({step[1]})")
            continue
        call = describe_call(fn, dict(request=step[1], num_computed=step[2], num_new=step[3]))
        before = "After " + "; ".join(done) + ": "
        try:
            returned: Any = manager.allocate_slots(*step[1:])
        except NotImplementedError:
            raise AssertionError(not_written(name)) from None
        except Exception as exc:
            if isinstance(want["returned"], Raises) and isinstance(exc, ValueError):
                done.append(call + " (ValueError)")
                continue
            raise AssertionError(f"{before}{call} raised {type(exc).__name__}: {exc}. "
                                 f"{ALLOCATE_IDEA}") from None
        if isinstance(want["returned"], Raises):
            raise AssertionError(f"{before}{call} returned {returned!r}, expected it to raise "
                                 f"ValueError. {BAD_STEP_IDEA}")
        if returned is not want["returned"]:
            raise AssertionError(f"{before}{call} returned {returned!r}, expected "
                                 f"{want['returned']!r} (a bool). {ALLOCATE_IDEA}")
        seen = observe(manager, requests)
        if seen["problems"]:
            raise AssertionError(f"{before}{call}: {seen['problems'][0]}. Blocks come from "
                                 "the free queue (self._take()) and go back to it "
                                 "(self._give_back).")
        for request, tables in want["tables"].items():
            got = seen["tables"].get(request)
            if got is None:
                raise AssertionError(f"{before}{call}: request {request} has no tables; "
                                     f"expected tables for it. {ALLOCATE_IDEA}")
            for group, (mine, theirs) in enumerate(zip(got, tables, strict=True)):
                if mine != theirs:
                    raise AssertionError(
                        f"{before}{call}: request {request}'s table in group {group} (window "
                        f"{windows[group]}) has {mine[-1]} slots, null at {mine[:-1]}; "
                        f"expected {theirs[-1]} slots, null at {theirs[:-1]}. {ALLOCATE_IDEA}")
        unexpected = sorted(set(seen["tables"]) - set(want["tables"]))
        if unexpected:
            raise AssertionError(f"{before}{call}: request {unexpected[0]} has tables, "
                                 f"expected none: a step that does not fit takes nothing. "
                                 f"{ALLOCATE_IDEA}")
        if seen["free"] != want["free"]:
            raise AssertionError(f"{before}{call}: {seen['free']} blocks free, expected "
                                 f"{want['free']}. {ALLOCATE_IDEA}")
        done.append(call)


# --- the visible checks -----------------------------------------------------------------------


@visible
def check_request_bytes(fn: Callable) -> None:
    """The small model of three groups at 0, 5, 8 and 20 tokens; gpt-oss-120b and Qwen3-Next
    (36 state layers) at 8,192."""
    cases = [_bytes(SMALL, n) for n in (5, 8, 20, 0)]
    cases += [_bytes(HYBRID_MODELS[name], 8192) for name in ("gpt-oss-120b",
                                                            "Qwen3-Next-80B-A3B")]
    expect_cases(fn, cases, private("10").request_bytes_case, BYTES_IDEA)


@visible
def check_free_skipped_blocks(fn: Callable) -> None:
    """Window 6, blocks of 4, table [3, 5, 8, 9]: 13 tokens computed free 3 and 5; 11 free 3
    (the window still sees 2 of block 1's tokens); 9 free 3; 4 free none; [0, 5, 8, 9] at 13
    frees 5; [3, 0, 8, 9] at 13 frees 3; a window of 1 in blocks of 1."""
    cases = [_free([3, 5, 8, 9], 13, 6, 4), _free([3, 5, 8, 9], 11, 6, 4),
             _free([3, 5, 8, 9], 9, 6, 4), _free([3, 5, 8, 9], 4, 6, 4),
             _free([0, 5, 8, 9], 13, 6, 4), _free([3, 0, 8, 9], 13, 6, 4),
             _free([4, 1, 6], 2, 1, 1)]
    expect_cases(freeing(fn), cases, private("10").free_case, FREE_IDEA,
                 promise=FREED_AND_TABLE)


@visible
def check_sliding_window_hit(fn: Callable) -> None:
    """Block size 4, window 10 (three blocks before the hit): blocks 0 and 1 cached (8: a run
    from block 0); window 6: blocks 0, 2, 3 and 5 cached, max_length 24 (16); nothing
    cached; a window of 1; window 5 (one block before the hit)."""
    cases = [_sliding({0, 1}, 24, 4, 10), _sliding({0, 2, 3, 5}, 24, 4, 6),
             _sliding(set(), 24, 4, 6), _sliding({5}, 22, 4, 1), _sliding({1, 4}, 24, 4, 5)]
    expect_cases(fn, cases, private("10").sliding_case, SLIDING_HIT_IDEA, rel_tol=0,
                 promise=INT)


HYBRID_CASES = [
    _hybrid([({0, 1, 2, 3, 4, 5}, None), ({0, 2, 3, 5}, 6)], 25, 4),
    _hybrid([({0, 1, 2}, None), ({1, 2, 3}, 6)], 25, 4),
    _hybrid([({0, 1, 2, 3, 4, 5}, None), ({0, 2, 3, 5}, 6), ({0, 1, 4, 5}, 9)], 25, 4),
    _hybrid([({0, 1, 2, 3}, None), ({0, 1, 2, 3}, 6)], 16, 4),
    _hybrid([({2, 3, 6}, 6)], 30, 4),
]


@visible
def check_hybrid_hit(fn: Callable) -> None:
    """Block size 4, a 25-token request: the picture's groups (full: blocks 0 to 5 cached;
    window 6: 0, 2, 3, 5); full: 0 to 2, window 6: 1, 2, 3 (the full group stops it at 12,
    where the window needs blocks 1 and 2); full: 0 to 5, window 6: 0, 2, 3, 5, window 9:
    0, 1, 4, 5 (each group shortens it in turn, pass after pass). Then a 16-token request,
    every block cached (its last token computed), and one sliding group alone."""
    answers = [private("10").hybrid_case(**case) for case in HYBRID_CASES]  # asked once

    def check(subject: Callable) -> None:
        expect_cases(subject, HYBRID_CASES, lambda **case: answers[HYBRID_CASES.index(case)],
                     HYBRID_HIT_IDEA, rel_tol=0, promise=INT)

    one_bug_one_todo_of_function(check, fn, SLIDING_HIT_LENT)


ALLOCATION = ((6, None), 4, 10, [
    ("allocate", 0, 0, 9), ("allocate", 0, 9, 1), ("allocate", 0, 10, 3),
    ("allocate", 0, 13, 1), ("allocate", 1, 0, 12), ("allocate", 0, 14, 0),
    ("allocate", 0, -1, 2), ("allocate", 1, 0, 5), ("free", 0), ("allocate", 1, 0, 12),
])


# Where the window's blocks decide: a pool of 3 blocks (and the null block), blocks of 1, a
# window of 1 beside full attention: the second step fits only with the block it frees; with a
# second full group it does not fit, and the freed block stays freed.
FREED_DECIDES = [((None, 1), 1, 4, [("allocate", 0, 0, 1), ("allocate", 0, 1, 1)]),
                 ((None, None, 1), 1, 4, [("allocate", 0, 0, 1), ("allocate", 0, 1, 1)])]


SLIDING_HIT_LENT = {"sliding_window_hit": hybrid_cache.sliding_window_hit}


def with_course_helpers(check: Callable[[Any], None], subject: Any) -> None:
    """``check`` of ``allocate_slots`` on ``subject`` (the learner's class, or the function);
    where it fails, again with the course's ``free_skipped_blocks`` lent to it, so that a bug
    in that helper costs only the helper's own test."""
    lent = {"free_skipped_blocks": hybrid_cache.free_skipped_blocks}
    method = vars(subject).get("allocate_slots") if isinstance(subject, type) else None
    if isinstance(method, types.FunctionType):  # the class's own: lend through its globals
        one_bug_one_todo_of_function(
            lambda fn: check(type(subject.__name__, (subject,), {"allocate_slots": fn})),
            method, lent)
    else:
        one_bug_one_todo_of_function(check, subject, lent)


@visible
def check_allocate_slots(subject: Callable) -> None:
    """Windows (6, None), blocks of 4, a pool of 10: a 9-token prompt (3 blocks in each
    group), decodes until the window frees blocks, a second request that does not fit
    (False, nothing taken), bad arguments (ValueError), then free. Then two steps whose fit
    the window's freed block decides: one that fits only with it, one that does not fit
    even so (the block stays freed)."""
    runs = [(run, private("10").allocation_outcomes(*run))  # asked once, before any run
            for run in [ALLOCATION, *FREED_DECIDES]]

    def check(pool: Any) -> None:
        for run, expected in runs:
            run_steps("allocate_slots", pool, *run, expected)

    with_course_helpers(check, subject)


# --- window_first_key -------------------------------------------------------------------------

_TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> bool:
    tolerance = 2e-3 if dtype == torch.float32 and on_gpu() else _TOLERANCE[dtype]  # tf32 dots
    return torch.allclose(got.double().cpu(), want.double().cpu(), atol=tolerance,
                          rtol=tolerance)


def run_window_kernel(fn: Callable, case: WindowCase, answers: dict) -> None:
    """Chapter 9's kernel (the course's) given ``fn`` as its first key, watched by the
    interpreter's audit; its output against ``answers["want"]``, a wrong query token's row
    matched against the known mistakes' in ``answers``; then what each program read."""
    if type(fn).__name__ not in ("JITFunction", "InterpretedFunction"):
        raise AssertionError(NOT_JIT)
    with MemoryAudit() as audit, quiet():
        out = learner_call("window_first_key", launch_varlen, varlen_attention_kernel,
                           *case.arguments(), case.window, fn)
    seen = kernel_audit(audit, case, out)
    call = "chapter 9's kernel with window_first_key"
    expect_attention_output(out, call, case.describe(), case.query,
                            layout=" (one row per packed query token)", idea=WINDOW_KEY_IDEA)
    want, positions = answers["want"], case.positions()
    bad = [t for t in range(len(positions))
           if out[t].isnan().any() or not _close(out[t], want[t], case.dtype)]
    if bad:
        token = bad[0]
        request, position = positions[token]
        known = [text for key, text in answers["mistakes"].items()
                 if answers[key] is not None and not answers[key][token].isnan().any()
                 and _close(out[token], answers[key][token], case.dtype)]
        why = known[0] if known else WINDOW_NAN if out[token].isnan().any() else ""
        first = case.first_key(position)
        raise AssertionError(
            f"{call} on {case.describe()}: packed query token {token} (request {request}, "
            f"position {position}, context {position + 1}, so keys {first} to {position}) is "
            f"wrong ({len(bad)} of {len(positions)} tokens are). " + why + WINDOW_KEY_IDEA
            + (f" The interpreter also saw this: {seen}." if seen else ""))
    if seen:
        raise AssertionError(f"{call} on {case.describe()}: the output is right, but {seen}. "
                             + WINDOW_KEY_IDEA)


WINDOW_CASE = dict(q_lens=[1, 1, 3, 4, 2], seq_lens=[14, 6, 3, 17, 9], block_size=4,
                   q_heads=6, kv_heads=2, window=6, head_dim=12)


def window_case(**spec: Any) -> tuple[WindowCase, dict]:
    """The case ``spec`` describes, on the kernels' device, and its answers (asked first)."""
    case = WindowCase(**spec, device="cuda" if on_gpu() else "cpu")
    return case, private("10").window_answers(**case.spec())


@visible
def check_window_first_key(fn: Callable) -> None:
    """Window 6, blocks of 4, 6 query heads over 2 KV heads, head_dim 12, through chapter 9's
    kernel: decodes at 14 tokens (two null blocks before the window) and at 6 (exactly the
    window), a fresh prompt of 3 (shorter than the window), a chunk of 4 ending at 17 (the
    window starts inside a block) and one of 2 ending at 9."""
    case, answers = window_case(**WINDOW_CASE)
    run_window_kernel(fn, case, answers)
