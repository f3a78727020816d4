"""Chapter 7's hidden checks: blocks of 1 to 32 tokens, groups of 1 to 16 query heads, lengths
to 523, fp16 (and bf16 through the wrapper), one split, a split per block and many empty
splits, merges of 17 splits with max scores 50 apart, every kind of bad input to the wrapper,
and on a GPU production shapes (``autograder.hidden.ch07_gpu``).

Expected outputs are chapter 6's attention (its fp32 version, bound when this module is
imported) on the case's CPU copy; what known mistakes give comes from chapter 6's float64
oracle (``autograder.hidden.ch06``); expected split partials and merges are computed here in
float64. The visible checks ask for them through ``autograder.private`` by a case's
description.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from autograder.checks.ch06 import PagedCase
from autograder.checks.ch07 import (
    KernelCase,
    _compare,
    _kernel,
    _merge,
    _raises,
    _split,
    _wrapper,
    merge_inputs,
    on_gpu,
)
from autograder.hidden.ch06 import known_mistakes
from autograder.hidden.ch07_gpu import check_production_shapes
from autograder.private import thorough
from kernels.paged_attention_ref import paged_decode_attention as chapter6_attention

# --- expected values -------------------------------------------------------------------------


def _on_cpu(case: KernelCase) -> PagedCase:
    """The case on the CPU, for chapter 6's float64 oracle."""
    copy = PagedCase.__new__(PagedCase)
    copy.__dict__.update({k: v.cpu() if isinstance(v, torch.Tensor) else v
                          for k, v in case.__dict__.items()})
    return copy


def reference(case: KernelCase) -> torch.Tensor:
    """Chapter 6's attention on the case, on the CPU, in the case's dtype."""
    return chapter6_attention(*(t.cpu() for t in (
        case.query, case.k_cache, case.v_cache, case.tables, case.seq_lens)), case.scale)


def _mistakes(case: KernelCase) -> Callable[[], dict]:
    return lambda: known_mistakes(_on_cpu(case))


def kernel_expected(**spec) -> torch.Tensor:
    return reference(KernelCase(**spec))


def kernel_mistakes(**spec) -> dict:
    return known_mistakes(_on_cpu(KernelCase(**spec)))


def _expected_partials(case: KernelCase, num_splits: int) -> dict:
    """float64 (m, l, acc) per (seq, query head, split), and which splits are empty (there
    m = -inf, l = 0, acc = 0)."""
    group = case.q_heads // case.kv_heads
    per_split = -(-case.tables.shape[1] // num_splits) * case.block_size  # tokens
    shape = (len(case.lengths), case.q_heads, num_splits)
    found = dict(m=torch.full(shape, float("-inf"), dtype=torch.float64),
                 l=torch.zeros(shape, dtype=torch.float64),
                 acc=torch.zeros(*shape, case.head_dim, dtype=torch.float64),
                 empty=torch.zeros(shape, dtype=torch.bool))
    for seq, length in enumerate(case.lengths):
        keys = case.keys[seq].double().repeat_interleave(group, dim=1)  # [t, q_heads, dim]
        values = case.values[seq].double().repeat_interleave(group, dim=1)
        query = case.query[seq].double().cpu()
        for split in range(num_splits):
            start, stop = split * per_split, min((split + 1) * per_split, length)
            for head in range(case.q_heads):
                if start >= stop:
                    found["empty"][seq, head, split] = True
                    continue
                scores = keys[start:stop, head] @ query[head] * case.scale
                m = scores.max()
                weights = torch.exp(scores - m)
                found["m"][seq, head, split] = m
                found["l"][seq, head, split] = weights.sum()
                found["acc"][seq, head, split] = weights @ values[start:stop, head]
    return found


def split_partials(num_splits: int, **spec) -> dict:
    return _expected_partials(KernelCase(**spec), num_splits)


def _merged(partials, dtype: torch.dtype) -> torch.Tensor:
    """Split partials merged in float64: out = sum e^(m - M) acc / sum e^(m - M) l."""
    m, total, acc = (t.double().cpu() for t in partials)
    weight = torch.exp(m - m.max(dim=-1, keepdim=True).values)
    return ((weight[..., None] * acc).sum(dim=2) / (weight * total).sum(dim=2)[..., None]
            ).to(dtype)


def merge_case(seqs: int, heads: int, splits: int, head_dim: int, spread: float):
    """The merged softmax of ``merge_inputs``, and the partials added without rescaling."""
    m, total, acc = merge_inputs(seqs, heads, splits, head_dim, spread)
    weight = torch.exp(m - m.max(dim=-1, keepdim=True).values)
    want = (weight[..., None] * acc).sum(dim=2) / (weight * total).sum(dim=2)[..., None]
    plain = acc.sum(dim=2) / total.sum(dim=2)[..., None]
    return want, plain


def _thorough_kernel(fn: Callable, name: str, case: KernelCase, per_query_head: bool) -> None:
    _kernel(fn, name, case, per_query_head, reference(case), _mistakes(case))


# --- step 1: one block -----------------------------------------------------------------------


@thorough
def check_one_block_kernel_thoroughly(fn: Callable) -> None:
    """Blocks of 1, 16 and 32; heads 8/2, 5/1, 4/4; head dim 32; fp16."""
    for lengths, q, kv, dim, dtype in [([1, 1, 1], 8, 2, 16, torch.float32),
                                       ([16, 16], 5, 1, 32, torch.float32),
                                       ([32], 4, 4, 16, torch.float16)]:
        _thorough_kernel(fn, "one_block_kernel",
                         KernelCase(lengths, lengths[0], q, kv, dim, dtype), per_query_head=True)


# --- step 2: the loop over the block table ---------------------------------------------------


@thorough
def check_block_loop_kernel_thoroughly(fn: Callable) -> None:
    """Up to 40 blocks, block sizes 1 to 16, heads 8/2 and 5/1, fp16."""
    for lengths, block_size, q, kv, dtype in [([40, 8, 1], 1, 8, 2, torch.float32),
                                              ([64, 16, 128], 16, 5, 1, torch.float32),
                                              ([8, 96], 8, 4, 2, torch.float16)]:
        _thorough_kernel(fn, "block_loop_kernel",
                         KernelCase(lengths, block_size, q, kv, dtype=dtype), per_query_head=True)


# --- step 3: GQA packing ---------------------------------------------------------------------


@thorough
def check_gqa_kernel_thoroughly(fn: Callable) -> None:
    """Groups of 1, 4, 5 and 16; up to 32 blocks; fp16."""
    for lengths, block_size, q, kv, dtype in [([16, 48], 16, 4, 4, torch.float32),
                                              ([32, 8], 8, 32, 8, torch.float32),
                                              ([64, 16], 16, 5, 1, torch.float32),
                                              ([32, 128], 4, 16, 1, torch.float16)]:
        _thorough_kernel(fn, "gqa_kernel", KernelCase(lengths, block_size, q, kv, dtype=dtype),
                         per_query_head=False)


# --- step 4: the masked tail -----------------------------------------------------------------


@thorough
def check_paged_attention_kernel_thoroughly(fn: Callable) -> None:
    """Lengths 1, 37 and 523; block sizes 1 to 32; heads 32/8, 8/2, 5/1, 4/4; fp16."""
    for lengths, block_size, q, kv, dtype in [([1, 37, 523], 16, 32, 8, torch.float32),
                                              ([37, 1], 1, 8, 2, torch.float32),
                                              ([15, 523, 12], 8, 5, 1, torch.float32),
                                              ([64, 33], 32, 4, 4, torch.float32),
                                              ([1, 37, 200], 16, 8, 2, torch.float16)]:
        _thorough_kernel(fn, "paged_attention_kernel",
                         KernelCase(lengths, block_size, q, kv, dtype=dtype),
                         per_query_head=False)


# --- split-KV --------------------------------------------------------------------------------


def _thorough_split(fn: Callable, case: KernelCase, num_splits: int) -> None:
    """The partials, then the output they merge to against chapter 6's attention."""
    partials = _split(fn, case, num_splits, _expected_partials(case, num_splits))
    _compare(_merged(partials, case.query.dtype), case, "merged split_kv_kernel",
             reference(case), _mistakes(case))


@thorough
def check_split_kv_kernel_thoroughly(fn: Callable) -> None:
    """One split, a split per block, many empty splits, GQA 5/1, fp16."""
    _thorough_split(fn, KernelCase([37, 1, 200], 16, 8, 2), 1)
    _thorough_split(fn, KernelCase([37, 1, 200], 16, 8, 2), 14)
    _thorough_split(fn, KernelCase([523, 12], 8, 5, 1), 5)
    _thorough_split(fn, KernelCase([64, 100], 16, 4, 4, dtype=torch.float16), 4)


@thorough
def check_merge_splits_kernel_thoroughly(fn: Callable) -> None:
    """One split, 17 splits (padded to 32), scores 50 apart, fp16 output."""
    _merge(fn, merge_case, 3, 2, 1, 16, 1.0)
    _merge(fn, merge_case, 2, 5, 17, 32, 50.0)
    _merge(fn, merge_case, 4, 8, 6, 64, 3.0, torch.float16)


# --- the host wrapper ------------------------------------------------------------------------


@thorough
def check_paged_attention_thoroughly(fn: Callable) -> None:
    """Every kind of bad input; fp16 and bf16 results; on a GPU, production shapes (where
    the wrapper may choose split-KV) and a pool past 2^31 elements."""
    case = KernelCase([5, 9, 4], 4, 4, 2)
    for what in ("a query without its batch dimension", "caches of different shapes",
                 "6 query heads over 4 KV heads", "a block table with one row too few",
                 "seq_lens with one entry too many", "head_dim 12 (not a power of two)",
                 "a float block table", "seq_lens on another device (meta)",
                 "a v_cache with other strides"):
        _raises(fn, case, what)
    block = 16 if on_gpu() else 4
    for case in (KernelCase([1, 37, 100], block, 8, 2, dtype=torch.float16),
                 KernelCase([37, 5], block, 4, 1, dtype=torch.bfloat16)):
        _wrapper(fn, case, reference(case), _mistakes(case))
    if on_gpu():
        check_production_shapes(fn)
