"""Chapter 7's hidden checks: blocks of 1 to 32 tokens, groups of 1 to 71 query heads, head
sizes 16 to 256 (the real configurations of Phi-2, Phi-3-mini, Qwen2.5-7B, Falcon-7B and
Gemma-2-9B, at short lengths), lengths 0 to 523, fp16 (and bf16 through the wrapper), one
split, a split per block and many empty splits, merges of 17 splits with max scores 50 apart,
every kind of bad input to the wrapper and the layouts it must accept, every kernel compiled
for an A100, and on a GPU production shapes (``autograder.hidden.ch07_gpu``). Cases built to
show one rule each: scores far below zero in fp16 (subtract the max, start the running max at
-inf, compute in fp32) and caches that are views of one head-major tensor (the strides).

Expected outputs are chapter 6's attention (its fp32 version, bound when this module is
imported) on the case's CPU copy; what known mistakes give is computed here in float64 (an
online softmax over the blocks a mistaken kernel would read); expected split partials and
merges too. The visible checks ask for them through ``autograder.private`` by a case's
description.

The wrapper launches the kernels of TODOs 4 to 6 by name: where the learner's wrapper fails
its hidden check, the check runs again with the course's kernels lent
(``autograder.checks._lending``), so a wrong kernel costs the kernel's points, not the
wrapper's hidden ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from autograder.checks._helpers import learner_call
from autograder.checks._lending import one_bug_one_todo_of_function
from autograder.checks._memory_audit import MemoryAudit
from autograder.checks.ch07 import _addresses_in_int64, _kernel, _merge, _split, merge_inputs
from autograder.checks.ch07_audit import quiet
from autograder.checks.ch07_cases import close, compare, gpu_twin
from autograder.checks.ch07_wrapper import (
    ACCEPTED,
    BAD_INPUTS,
    ON_GPU_ONLY,
    _accepts,
    _raises,
    _wrapper,
)
from autograder.hidden.ch07_gpu import check_production_shapes
from autograder.private import thorough
from course.notebook.paged_cases import KernelCase, PagedCase, dtype_name, on_gpu
from kernels import paged_attention as course_kernels
from kernels.paged_attention import launch
from kernels.paged_attention_ref import paged_decode_attention as chapter6_attention

# --- expected values -------------------------------------------------------------------------


def _on_cpu(case: KernelCase) -> PagedCase:
    """The case's tensors on the CPU."""
    copy = PagedCase.__new__(PagedCase)
    copy.__dict__.update({k: v.cpu() if isinstance(v, torch.Tensor) else v
                          for k, v in case.__dict__.items()})
    return copy


def reference(case: KernelCase) -> torch.Tensor:
    """Chapter 6's attention on the case, on the CPU, in the case's dtype (zeros for a
    sequence of length 0)."""
    return chapter6_attention(*(t.cpu() for t in (
        case.query, case.k_cache, case.v_cache, case.tables, case.seq_lens)), case.scale)


def _online(case: PagedCase, seq: int, blocks: list[tuple[int, int]], scale: float,
            kv_of: torch.Tensor, mode: str) -> torch.Tensor | None:
    """float64 output of sequence ``seq`` from an online softmax over ``blocks`` ((block id,
    tokens read)), rescaling by ``mode``: "both", "sum" (the running sum only), "acc" (the
    accumulator only) or "none". None where a block id is outside the pool."""
    query = case.query[seq].double()
    m = torch.full((case.q_heads,), float("-inf"), dtype=torch.float64)
    total = torch.zeros(case.q_heads, dtype=torch.float64)
    acc = torch.zeros(case.q_heads, case.head_dim, dtype=torch.float64)
    for block, count in blocks:
        if not 0 <= block < case.k_cache.shape[0]:
            return None
        keys = case.k_cache[block, :count].double()[:, kv_of]  # [count, q_heads, dim]
        values = case.v_cache[block, :count].double()[:, kv_of]
        scores = torch.einsum("hd,thd->ht", query, keys) * scale
        m_new = torch.maximum(m, scores.max(dim=1).values)
        rescale = torch.exp(m - m_new)
        weights = torch.exp(scores - m_new[:, None])
        total = (total * rescale if mode in ("both", "sum") else total) + weights.sum(dim=1)
        acc = (acc * rescale[:, None] if mode in ("both", "acc") else acc) + torch.einsum(
            "ht,thd->hd", weights, values)
        m = m_new
    return acc / total[:, None]


def known_mistakes(case: KernelCase) -> dict[str, torch.Tensor | None]:
    """What known mistakes give on ``case`` (float64, [num_seqs, q_heads, head_dim]; NaN
    where a mistaken kernel divides 0 by 0; None where a mistake reads outside the pool):
    attention without the scale, query head h on KV head h % num_kv_heads, every sequence
    on row 0's blocks, physical block j as the j-th block, whole blocks only, one block
    short, one block too many (the table entry after a sequence's blocks, all its tokens),
    and online softmaxes that skip rescaling the sum, the accumulator or both."""
    cpu = _on_cpu(case)
    wide = cpu.wide.contiguous().view(-1)
    stride = case.tables.stride(0)
    group = case.q_heads // case.kv_heads
    heads = torch.arange(case.q_heads)
    block_size = case.block_size

    def entry(seq: int, index: int) -> int:
        at = seq * stride + index
        return int(wide[at]) if at < len(wide) else -1

    def normal(seq: int, row: int | None = None, count: int | None = None,
               physical: bool = False) -> list[tuple[int, int]]:
        length = case.lengths[seq]
        count = -(-length // block_size) if count is None else count
        return [(index if physical else entry(seq if row is None else row, index),
                 min(block_size, length - index * block_size)) for index in range(count)]

    plans: dict[str, Callable[[int], tuple]] = {
        "no_scale": lambda s: (normal(s), 1.0, heads // group, "both"),
        "kv_head_modulo": lambda s: (normal(s), case.scale, heads % case.kv_heads, "both"),
        "table_row0": lambda s: (normal(s, row=0), case.scale, heads // group, "both"),
        "table_ignored": lambda s: (normal(s, physical=True), case.scale, heads // group,
                                    "both"),
        "tail_dropped": lambda s: (normal(s, count=case.lengths[s] // block_size), case.scale,
                                   heads // group, "both"),
        "last_block_dropped": lambda s: (normal(s)[:-1], case.scale, heads // group, "both"),
        "extra_block": lambda s: (normal(s) + [(entry(s, case.blocks(s)), block_size)],
                                  case.scale, heads // group, "both"),
        "rescale_missing": lambda s: (normal(s), case.scale, heads // group, "none"),
        "rescale_sum_missing": lambda s: (normal(s), case.scale, heads // group, "acc"),
        "rescale_acc_missing": lambda s: (normal(s), case.scale, heads // group, "sum"),
    }
    found: dict[str, torch.Tensor | None] = {}
    for name, plan in plans.items():
        if name == "kv_head_modulo" and group == 1:
            found[name] = None
            continue
        out = torch.empty(len(case.lengths), case.q_heads, case.head_dim, dtype=torch.float64)
        for seq in range(len(case.lengths)):
            blocks, scale, kv_of, mode = plan(seq)
            row = _online(cpu, seq, blocks, scale, kv_of, mode)
            if row is None:
                out = None
                break
            out[seq] = row
        found[name] = out
    return found


def kernel_expected(**spec) -> torch.Tensor:
    return reference(KernelCase(**spec))


def kernel_mistakes(**spec) -> dict:
    return known_mistakes(KernelCase(**spec))


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


def _merge_float64(m: torch.Tensor, total: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    """out = sum e^(m - M) acc / sum e^(m - M) l over the splits, M = max m; zeros where
    every split is empty."""
    top = m.max(dim=-1, keepdim=True).values
    top = torch.where(top == float("-inf"), torch.zeros_like(top), top)
    weight = torch.exp(m - top)
    denominator = (weight * total).sum(dim=-1)[..., None]
    numerator = (weight[..., None] * acc).sum(dim=-2)
    return torch.where(denominator > 0, numerator / denominator.clamp_min(1e-300),
                       torch.zeros_like(numerator))


def _merged(partials, dtype: torch.dtype) -> torch.Tensor:
    """Split partials merged in float64, in ``dtype``."""
    return _merge_float64(*(t.double().cpu() for t in partials)).to(dtype)


def merge_case(seqs: int, heads: int, splits: int, head_dim: int, spread: float):
    """The merged softmax of ``merge_inputs``, and the partials added without rescaling."""
    m, total, acc = merge_inputs(seqs, heads, splits, head_dim, spread)
    want = _merge_float64(m, total, acc)
    plain = acc.sum(dim=2) / total.sum(dim=2)[..., None]
    return want, plain


def _case(lengths, block_size, q_heads, kv_heads, head_dim=16, dtype=torch.float32,
          seed=None) -> KernelCase:
    """A case as given on the interpreter, its GPU twin (blocks of 16) on a GPU."""
    spec = dict(lengths=list(lengths), block_size=block_size, q_heads=q_heads,
                kv_heads=kv_heads, head_dim=head_dim, dtype=dtype_name(dtype))
    if seed is not None:
        spec["seed"] = seed
    return KernelCase(**(gpu_twin(spec) if on_gpu() else spec))


def _thorough_kernel(fn: Callable, name: str, case: KernelCase, per_query_head: bool,
                     int64: bool = False) -> None:
    _kernel(fn, name, case, per_query_head, reference(case), known_mistakes(case),
            int64=int64)


# --- cases built to show one rule --------------------------------------------------------------

_FAR_BELOW_ZERO = (
    "Every score here is near -150 (each key's first element is 40, each query's -15): "
    "exp(score) underflows to 0 in float32 unless the largest score is subtracted first (the "
    "running max starts at -inf, not 0), and float16 arithmetic keeps about three significant "
    "digits, too few for the differences between scores: compute in float32.")
_POOL_OF_VIEWS = (
    "Here k_cache and v_cache are views of one [num_blocks, 2, num_kv_heads, block_size, "
    "head_dim] tensor: a block is stride_kv_block elements from the next (twice a block's "
    "size), a token stride_kv_token from the next and a KV head stride_kv_head; address the "
    "caches with the strides the kernel is given.")


def _scores_far_below_zero(case: KernelCase) -> KernelCase:
    """``case`` (head size 16: scale 1/4) with every score about -150: each key's first
    element 40, each query's -15."""
    case.k_cache[..., 0] = 40  # the unused slots' other elements stay NaN
    case.query[..., 0] = -15
    return case


def _pool_of_views(case: KernelCase) -> KernelCase:
    """``case`` with its caches ``kv[:, 0]`` and ``kv[:, 1]`` of one head-major tensor
    [num_blocks, 2, num_kv_heads, block_size, head_dim]: no stride is a contiguous pool's."""
    kv = torch.stack([case.k_cache, case.v_cache], dim=1)
    kv = kv.transpose(2, 3).contiguous().transpose(2, 3)
    case.k_cache, case.v_cache = kv[:, 0], kv[:, 1]
    return case


def _built_to_show(fn: Callable, name: str, case: KernelCase, per_query_head: bool,
                   rule: str) -> None:
    """``fn`` on ``case``, built to show ``rule``: a wrong output fails with that rule, not
    with the diagnoses of ordinary cases (which would take NaN here for a slot read past a
    sequence's end)."""
    want = reference(case)
    with MemoryAudit(), quiet():  # fenced: a store outside the arguments is dropped
        out = learner_call(name, launch, fn, *case.arguments(), per_query_head=per_query_head)
    if not isinstance(out, torch.Tensor) or out.shape != want.shape or \
            not close(out, want, case.dtype):
        raise AssertionError(f"{name}(...) on {case.describe()} is wrong. {rule}")


# --- step 1: one block -----------------------------------------------------------------------


@thorough
def check_one_block_kernel_thoroughly(fn: Callable) -> None:
    """Blocks of 1, 8, 16 and 32; heads 8/2, 4/4, Phi-2's 32 of 80 and Qwen2.5-7B's 28/4 of
    128; fp16, and scores far below zero in fp16; compiled for an A100."""
    for lengths, q, kv, dim, dtype in [([1, 1, 1], 8, 2, 16, torch.float32),
                                       ([16, 16], 32, 32, 80, torch.float32),
                                       ([32], 4, 4, 16, torch.float16),
                                       ([8], 28, 4, 128, torch.float16)]:
        _thorough_kernel(fn, "one_block_kernel", _case(lengths, lengths[0], q, kv, dim, dtype),
                         per_query_head=True)
    _built_to_show(fn, "one_block_kernel", _scores_far_below_zero(
        _case([8, 8], 8, 4, 2, 16, torch.float16)), True, _FAR_BELOW_ZERO)
    _addresses_in_int64(fn, "one_block_kernel")


# --- step 2: the loop over the block table ---------------------------------------------------


@thorough
def check_block_loop_kernel_thoroughly(fn: Callable) -> None:
    """Up to 40 blocks, block sizes 1 to 16, heads 8/2, 5/1 and Phi-3-mini's 32 of 96, head
    size 72, fp16, scores far below zero; compiled for an A100."""
    for lengths, block_size, q, kv, dim, dtype in [
            ([40, 8, 1], 1, 8, 2, 16, torch.float32),
            ([64, 16, 128], 16, 5, 1, 16, torch.float32),
            ([8, 96], 8, 4, 2, 72, torch.float16),
            ([32, 16], 16, 32, 32, 96, torch.float32)]:
        _thorough_kernel(fn, "block_loop_kernel",
                         _case(lengths, block_size, q, kv, dim, dtype), per_query_head=True)
    _built_to_show(fn, "block_loop_kernel", _scores_far_below_zero(
        _case([16, 8], 4, 4, 2, 16, torch.float16)), True, _FAR_BELOW_ZERO)
    _addresses_in_int64(fn, "block_loop_kernel")


# --- step 3: GQA packing ---------------------------------------------------------------------


@thorough
def check_gqa_kernel_thoroughly(fn: Callable) -> None:
    """Groups of 1, 3, 4, 5, 7 and 16; up to 32 blocks; head sizes 16 to 128 (Qwen2.5-7B's
    28/4 of 128); fp16; compiled for an A100."""
    for lengths, block_size, q, kv, dim, dtype in [
            ([16, 48], 16, 4, 4, 16, torch.float32),
            ([32, 8], 8, 32, 8, 16, torch.float32),
            ([64, 16], 16, 5, 1, 40, torch.float32),
            ([32, 128], 4, 16, 1, 16, torch.float16),
            ([16, 48], 16, 6, 2, 72, torch.float32),
            ([32, 16], 16, 28, 4, 128, torch.float16)]:
        _thorough_kernel(fn, "gqa_kernel", _case(lengths, block_size, q, kv, dim, dtype),
                         per_query_head=False)
    _addresses_in_int64(fn, "gqa_kernel")


# --- step 4: the masked tail -----------------------------------------------------------------


@thorough
def check_paged_attention_kernel_thoroughly(fn: Callable) -> None:
    """Lengths 0, 1, 37 and 523; block sizes 1 to 32; heads 32/8, 8/2, 5/1, 4/4 and the real
    configurations of Phi-2 (32 of 80), Phi-3-mini (32 of 96), Falcon-7B (71/1 of 64) and
    Gemma-2-9B (16/8 of 256), head size 40 in groups of 3 (padded to 4), head size 112;
    fp16; caches that are views of one head-major tensor; compiled for an A100."""
    for lengths, block_size, q, kv, dim, dtype in [
            ([1, 37, 523, 0], 16, 32, 8, 16, torch.float32),
            ([37, 1], 1, 8, 2, 16, torch.float32),
            ([15, 523, 12], 8, 5, 1, 16, torch.float32),
            ([64, 33], 32, 4, 4, 16, torch.float32),
            ([1, 37, 200], 16, 8, 2, 16, torch.float16),
            ([17, 1, 32], 16, 32, 32, 80, torch.float16),
            ([33, 5], 16, 32, 32, 96, torch.float32),
            ([20, 3, 0], 16, 71, 1, 64, torch.float16),
            ([33, 0], 16, 16, 8, 256, torch.float16),
            ([9, 3, 8], 4, 12, 4, 40, torch.float32),
            ([20, 16], 16, 16, 2, 112, torch.float16)]:
        _thorough_kernel(fn, "paged_attention_kernel",
                         _case(lengths, block_size, q, kv, dim, dtype), per_query_head=False)
    _built_to_show(fn, "paged_attention_kernel", _pool_of_views(_case([9, 16, 3], 4, 6, 2, 24)),
                   False, _POOL_OF_VIEWS)
    _addresses_in_int64(fn, "paged_attention_kernel")


# --- split-KV --------------------------------------------------------------------------------


def _thorough_split(fn: Callable, case: KernelCase, num_splits: int) -> None:
    """The partials, then the output they merge to against chapter 6's attention."""
    partials = _split(fn, case, num_splits, _expected_partials(case, num_splits))
    compare(_merged(partials, case.query.dtype), case, "merged split_kv_kernel",
             reference(case), known_mistakes(case))


@thorough
def check_split_kv_kernel_thoroughly(fn: Callable) -> None:
    """One split, a split per block, many empty splits, a sequence of length 0, GQA 5/1,
    head size 80, fp16; compiled for an A100."""
    _thorough_split(fn, _case([37, 1, 200], 16, 8, 2), 1)
    _thorough_split(fn, _case([37, 1, 200], 16, 8, 2), 14)
    _thorough_split(fn, _case([523, 12], 8, 5, 1), 5)
    _thorough_split(fn, _case([64, 100], 16, 4, 4, dtype=torch.float16), 4)
    _thorough_split(fn, _case([37, 0, 32], 16, 8, 2, 80), 3)
    _addresses_in_int64(fn, "split_kv_kernel")


@thorough
def check_merge_splits_kernel_thoroughly(fn: Callable) -> None:
    """One split, 17 splits (padded to 32), scores 50 apart, head size 80, fp16 output."""
    _merge(fn, merge_case, 3, 2, 1, 16, 1.0)
    _merge(fn, merge_case, 2, 5, 17, 32, 50.0)
    _merge(fn, merge_case, 4, 8, 6, 64, 3.0, torch.float16)
    _merge(fn, merge_case, 2, 3, 4, 80, 2.0)


# --- the host wrapper ------------------------------------------------------------------------


# the TODOs the wrapper launches, by the names the notebook gives them
_KERNELS = ("paged_attention_kernel", "split_kv_kernel", "merge_splits_kernel")


def _course_kernels() -> dict[str, Any]:
    return {name: getattr(course_kernels, name) for name in _KERNELS}


@thorough
def check_paged_attention_thoroughly(fn: Callable) -> None:
    """Every kind of bad input, and every layout it must accept; fp16 and bf16 results;
    Qwen2.5-7B's heads (28/4 of 128); the split path with head size 96; validate=False; on a
    GPU, production shapes (where the wrapper may choose split-KV) and a pool past 2^31
    elements. Where ``fn`` fails, again with the course's kernels lent (a wrong kernel costs
    the kernel's points)."""
    one_bug_one_todo_of_function(_wrapper_thoroughly, fn, _course_kernels())


def _wrapper_thoroughly(fn: Callable) -> None:
    case = _case([5, 9, 8, 0], 4, 6, 2, 24)
    want = reference(case)
    for what in BAD_INPUTS:
        _raises(fn, case, what)
    if on_gpu():
        for what in ON_GPU_ONLY:
            _raises(fn, case, what, ON_GPU_ONLY)
    for what in ACCEPTED:
        _accepts(fn, case, what, want)
    with MemoryAudit(), quiet():  # fenced: a wild store fails the check, not the process
        out = learner_call("paged_attention", fn, *case.arguments(), validate=False)
    compare(out, case, "paged_attention", want, {}, call="paged_attention(..., "
             "validate=False)")
    for case, splits in ((_case([1, 37, 100, 0], 4, 8, 2, dtype=torch.float16), None),
                         (_case([37, 5], 4, 4, 1, dtype=torch.bfloat16), None),
                         (_case([37, 5, 16], 16, 28, 4, 128, torch.bfloat16), None),
                         (_case([37, 0, 64], 8, 8, 2, 96), 4)):
        _wrapper(fn, case, reference(case), known_mistakes(case), num_splits=splits)
    if on_gpu():
        check_production_shapes(fn)
