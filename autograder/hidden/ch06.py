"""Chapter 6's hidden checks: lengths from 1 to 523 tokens, block sizes 1 to 32, grouped
heads 32/8, 8/2, 5/1 and 4/4, fp16, pieces of one score and scores far apart, decode steps
across block boundaries; expected values from a float64 oracle that walks each sequence
position by position (not by gathering whole blocks, as a solution would), and the known
mistakes a hint names. The visible checks ask their expected values of the ``*_case``,
``*_expected`` and ``*_mistakes`` functions here, by a case's description.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from autograder.checks._lending import one_bug_one_todo_of_function
from autograder.checks.ch06 import (
    SEED,
    PagedCase,
    _attention,
    _blockwise,
    _check_merge,
    _check_write,
    _steps,
    step_inputs,
    write_inputs,
)
from autograder.private import thorough
from kernels import paged_attention_ref

# --- the oracle ------------------------------------------------------------------------------


def oracle(case: PagedCase, seq: int, *, scale: float | None = None,
           kv_head: Callable[[int], int] | None = None) -> torch.Tensor:
    """float64 attention of sequence ``seq``'s query over its tokens, position by position.
    ``scale`` and ``kv_head`` model mistakes."""
    scale = case.scale if scale is None else scale
    group = case.q_heads // case.kv_heads
    kv_head = kv_head or (lambda h: h // group)
    table = case.tables[seq].tolist()
    out = torch.empty(case.q_heads, case.query.shape[-1], dtype=torch.float64)
    for h in range(case.q_heads):
        scores, rows = [], []
        for p in range(case.lengths[seq]):
            block, offset = table[p // case.block_size], p % case.block_size
            k = case.k_cache[block, offset, kv_head(h)].double()
            scores.append(float(case.query[seq, h].double() @ k) * scale)
            rows.append(case.v_cache[block, offset, kv_head(h)].double())
        weights = torch.softmax(torch.tensor(scores, dtype=torch.float64), dim=0)
        out[h] = (weights[:, None] * torch.stack(rows)).sum(dim=0)
    return out


def expected_output(case: PagedCase, **mistake) -> torch.Tensor:
    """The oracle for every sequence of ``case``: [num_seqs, q_heads, head_dim], float64."""
    return torch.stack([oracle(case, seq, **mistake) for seq in range(len(case.lengths))])


def known_mistakes(case: PagedCase) -> dict:
    """What attention without the scale, and with query head h on KV head h % num_kv_heads,
    give on ``case`` (None where the group is 1 and the two heads agree)."""
    group = case.q_heads // case.kv_heads
    return dict(no_scale=expected_output(case, scale=1.0),
                kv_head_modulo=expected_output(case, kv_head=lambda h: h % case.kv_heads)
                if group > 1 else None)


def attention_expected(**spec) -> torch.Tensor:
    return expected_output(PagedCase(**spec))


def attention_mistakes(**spec) -> dict:
    return known_mistakes(PagedCase(**spec))


def _thorough_attention(check: Callable, fn: Callable, case: PagedCase) -> None:
    check(fn, case, expected_output(case), lambda: known_mistakes(case))


def _lending(*todos: str) -> dict[str, Callable]:
    """The course's answers of the earlier TODOs a check lends where the learner's fail."""
    return {todo: getattr(paged_attention_ref, todo) for todo in todos}


# --- write_kv --------------------------------------------------------------------------------


def write_case(**case) -> tuple[torch.Tensor, torch.Tensor]:
    """The pool after the case's tokens are written, one slot at a time."""
    k_cache, v_cache, key, value, mapping = write_inputs(**case)
    block_size = case["block_size"]
    for i, slot in enumerate(mapping.tolist()):
        if slot >= 0:
            k_cache[slot // block_size, slot % block_size] = key[i]
            v_cache[slot // block_size, slot % block_size] = value[i]
    return k_cache, v_cache


@thorough
def check_write_kv_thoroughly(fn: Callable) -> None:
    """Random slot mappings with padding (negative slots of every size: -1, small ones, one
    that wraps to slot 0, ones past the pool's size), block sizes 1 to 32, fp16."""
    gen = torch.Generator().manual_seed(SEED)
    for block_size in (1, 8, 16, 32):
        num_blocks = 9
        total = num_blocks * block_size
        chosen = torch.randperm(total, generator=gen)[:12].tolist()
        padding = [-1, -2, -total, -total - 5, -int(torch.randint(3, total, (1,),
                                                                   generator=gen))]
        for index, slot in zip(range(0, len(chosen), 2), padding, strict=False):
            chosen[index] = slot
        for dtype in ("float32", "float16"):
            _check_write(fn, write_case, num_blocks=num_blocks, block_size=block_size,
                         kv_heads=3, head_dim=8, slots=chosen, dtype=dtype)
    _check_write(fn, write_case, num_blocks=4, block_size=4, kv_heads=1, head_dim=2,
                 slots=[-3, -3, -16, 2], dtype="float32")  # padding only, and repeated


# --- paged_decode_attention ------------------------------------------------------------------


@thorough
def check_paged_decode_attention_thoroughly(fn: Callable) -> None:
    """Lengths 1, 37 and 523; block sizes 1, 8, 16, 32; heads 32/8, 8/2, 5/1, 4/4; fp16
    outputs in fp16 and within fp16 rounding of the exact answer (sharp softmaxes, where
    fp16 arithmetic falls short)."""
    for lengths, block_size, q, kv, dtype, sharp in [
        ([1, 37, 523], 16, 32, 8, torch.float32, 1.0), ([37, 1], 1, 8, 2, torch.float32, 1.0),
        ([523, 12], 8, 5, 1, torch.float32, 1.0), ([64, 33], 32, 4, 4, torch.float32, 1.0),
        ([1, 37, 200], 16, 8, 2, torch.float16, 1.0),
        ([1, 37, 200], 16, 8, 2, torch.float16, 4.0), ([300, 64], 16, 4, 1, torch.float16, 8.0),
    ]:
        _thorough_attention(_attention, fn, PagedCase(lengths, block_size, q, kv, dtype=dtype,
                                                      query_scale=sharp))


# --- merge_partials -------------------------------------------------------------------------


def _partials(scores: torch.Tensor, values: torch.Tensor):
    m = scores.max(dim=-1).values
    w = torch.exp(scores - m[:, None])
    return m, w.sum(dim=-1), w @ values


def merge_case(heads: int, len_a: int, len_b: int, spread: float):
    """Seeded scores and values split into two pieces: each piece's partials (m, l, acc), and
    the partials of the whole."""
    gen = torch.Generator().manual_seed(SEED + len_a * 31 + len_b)
    scores = torch.randn(heads, len_a + len_b, generator=gen, dtype=torch.float64) * spread
    values = torch.randn(len_a + len_b, 8, generator=gen, dtype=torch.float64)
    a = _partials(scores[:, :len_a], values[:len_a])
    b = _partials(scores[:, len_a:], values[len_a:])
    return a, b, _partials(scores, values)


@thorough
def check_merge_partials_thoroughly(fn: Callable) -> None:
    """Pieces of one score, unequal pieces, and scores far apart (exp overflows without the
    max: past 709, even in float64)."""
    for heads, len_a, len_b, spread in [(1, 1, 1, 1.0), (4, 1, 30, 3.0), (3, 17, 2, 50.0),
                                        (8, 64, 64, 200.0), (4, 8, 8, 1000.0)]:
        _check_merge(fn, merge_case, heads, len_a, len_b, spread)


# --- blockwise_decode_attention --------------------------------------------------------------


@thorough
def check_blockwise_decode_attention_thoroughly(fn: Callable) -> None:
    """Lengths 1, 37 and 523 over block sizes 1, 8 and 32, with GQA; fp16 in and out, with
    a sharp softmax. A wrong ``merge_partials`` costs its own points alone: where ``fn``
    fails, it runs again with the course's ``merge_partials`` lent."""

    def check(subject: Callable) -> None:
        _thorough_attention(_blockwise, subject, PagedCase([1, 37, 523], 32, 8, 2))
        _thorough_attention(_blockwise, subject, PagedCase([37, 12], 1, 4, 4))
        _thorough_attention(_blockwise, subject, PagedCase([523], 8, 5, 1))
        _thorough_attention(_blockwise, subject, PagedCase([70, 9], 16, 4, 2,
                                                           dtype=torch.float16, query_scale=4.0))

    one_bug_one_todo_of_function(check, fn, _lending("merge_partials"))


# --- decode_step -----------------------------------------------------------------------------


def decode_case(prompts, steps, block_size, q_heads, kv_heads, head_dim=16) -> dict:
    """Each step's expected outputs (``outputs``): scaled_dot_product_attention of its query
    over every sequence's K/V so far, laid out contiguously; and (``without_newest``) over all
    but the token being decoded, what attending before writing it gives."""
    case, inputs = step_inputs(prompts, steps, block_size, q_heads, kv_heads, head_dim)
    group = q_heads // kv_heads

    def attend(query, seq, length):
        k = case.keys[seq][:length].repeat_interleave(group, dim=1).transpose(0, 1)  # [h,t,d]
        v = case.values[seq][:length].repeat_interleave(group, dim=1).transpose(0, 1)
        return torch.nn.functional.scaled_dot_product_attention(
            query[seq][:, None, :], k, v, scale=case.scale)[:, 0, :]

    outputs, without = [], []
    for seq_lens, query, _key, _value in inputs:
        lengths = [int(n) for n in seq_lens]
        outputs.append(torch.stack([attend(query, s, n) for s, n in enumerate(lengths)]))
        without.append(torch.stack([attend(query, s, n - 1) for s, n in enumerate(lengths)]))
    return {"outputs": outputs, "without_newest": without}


@thorough
def check_decode_step_thoroughly(fn: Callable) -> None:
    """Prompts of 1 and 37 tokens, block sizes 1 and 16, GQA 8/2 and 5/1, across boundaries. A
    wrong ``write_kv`` or ``paged_decode_attention`` costs its own points alone: both are lent
    where ``fn`` fails."""

    def check(subject: Callable) -> None:
        _steps(subject, decode_case, [1, 37], 5, 16, 8, 2)
        _steps(subject, decode_case, [15, 2], 3, 1, 5, 1)

    one_bug_one_todo_of_function(check, fn, _lending("write_kv", "paged_decode_attention"))
