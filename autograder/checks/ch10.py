"""Visible checks for chapter 10, hybrid models in one cache: each TODO's readable cases (the
picture's window of 6 tokens in blocks of 4). Expected values, and what known mistakes give,
come from the chapter's hidden module (``autograder.private``), where the thorough checks are.

Each function TODO is held to its whole contract case by case (``_contract.expect``); the
window's first key runs inside chapter 9's kernel, its output compared query token by query
token. (How the KV cache uses the functions, the coordinator's ``allocate_slots`` among it,
is the library's: ``course.v1.hybrid_coordinator``.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from autograder.checks._contract import INT, LIST_OF_INTS, Promise, expect_cases
from autograder.checks._helpers import learner_call
from autograder.checks._lending import one_bug_one_todo_of_function
from autograder.checks._memory_audit import MemoryAudit
from autograder.checks._tensors import expect_attention_output
from autograder.checks.ch07_audit import quiet
from autograder.checks.ch09 import kernel_audit
from autograder.private import private, visible
from course.experiments.hybrid_models import (
    FULL,
    HYBRID_MODELS,
    SLIDING,
    STATE,
    HybridModel,
    LayerGroup,
)
from course.notebook.paged_cases import WindowCase, on_gpu
from course.v1 import hybrid_cache
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


# hybrid_hit calls the learner's sliding_window_hit by name: where it fails, it is checked again
# with the course's lent (one bug costs one TODO)
SLIDING_HIT_LENT = {"sliding_window_hit": hybrid_cache.sliding_window_hit}

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
