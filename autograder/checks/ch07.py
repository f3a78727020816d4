"""Checks for chapter 7, a Triton paged-attention kernel.

Cases are chapter 6's: a NaN-filled pool with shuffled physical blocks. Here the block
tables are also a view into a wider buffer (a row stride larger than the row), whose slack
points at a decoy block of finite values, so a kernel that reads the table with the wrong
stride gets wrong numbers rather than a crash. Expected outputs come from chapter 6's fp32
reference (``kernels.paged_attention_ref``); hints compare a wrong output with what known
mistakes would produce, in float64.

On Triton's CPU interpreter the shapes stay small. On a GPU the thorough wrapper check also
runs production shapes (contexts to 32k, batches to 256, head dims 64 to 256, bf16) and a
pool with more than 2^31 elements, where an int32 offset would wrap.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from autograder.checks._helpers import learner_call, not_written
from autograder.checks.ch06 import PagedCase
from kernels.paged_attention import launch
from kernels.paged_attention_ref import paged_decode_attention
from kernels.split_kv import run_merge_kernel, run_split_kernel

SEED = 2027
_TOLERANCE = {torch.float32: (1e-5, 1e-4), torch.float16: (3e-3, 1e-2),
              torch.bfloat16: (2e-2, 5e-2)}  # (atol, rtol)
_TF32 = (2e-3, 2e-3)  # fp32 tl.dot on a GPU multiplies in TF32 (10-bit mantissa)


def on_gpu() -> bool:
    """Whether kernels compile for a CUDA GPU (rather than run on the interpreter)."""
    return torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"


def _device() -> str:
    return "cuda" if on_gpu() else "cpu"


def _tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return _TF32 if dtype == torch.float32 and on_gpu() else _TOLERANCE[dtype]


class KernelCase(PagedCase):
    """A chapter-6 case whose block tables are a strided view into a wider buffer, on the
    device the kernels run on."""

    def __init__(self, lengths, block_size, q_heads, kv_heads, head_dim=16,
                 dtype=torch.float32, seed=SEED):
        super().__init__(lengths, block_size, q_heads, kv_heads, head_dim, dtype, seed)
        used = set(self.tables.flatten().tolist())
        decoy = max(set(range(self.k_cache.shape[0])) - used)
        gen = torch.Generator().manual_seed(seed + 1)
        self.k_cache[decoy] = torch.randn(self.k_cache[decoy].shape, generator=gen).to(dtype)
        self.v_cache[decoy] = torch.randn(self.v_cache[decoy].shape, generator=gen).to(dtype)
        rows, width = self.tables.shape
        wide = torch.full((max(rows, width) + 1, width + 3), decoy, dtype=torch.int32)
        wide[:rows, :width] = self.tables
        self.tables = wide[:rows, :width]  # row stride width + 3
        device = _device()
        for name in ("k_cache", "v_cache", "tables", "seq_lens", "query"):
            setattr(self, name, getattr(self, name).to(device))

    def describe(self) -> str:
        return super().describe() + f", block table row stride {self.tables.stride(0)}"

    def reference(self) -> torch.Tensor:
        return paged_decode_attention(*(t.cpu() for t in (
            self.query, self.k_cache, self.v_cache, self.tables, self.seq_lens)), self.scale)

    def cpu_copy(self) -> PagedCase:
        """The case on the CPU, for the float64 oracle of ``PagedCase.expected``."""
        copy = PagedCase.__new__(PagedCase)
        copy.__dict__.update({k: v.cpu() if isinstance(v, torch.Tensor) else v
                              for k, v in self.__dict__.items()})
        return copy


def _diagnose(out: torch.Tensor, case: KernelCase, bad: list[int]) -> str:
    """What a wrong output matches, as a hint."""
    if out.isnan().any():
        return ("It has NaN: garbage from slots past a sequence's end leaked in. Mask the "
                "tail: load with mask=position < seq_len and other=0, and set masked scores "
                "to -inf before the softmax. ")
    cpu, got = case.cpu_copy(), out.cpu()

    def matches(**mistake) -> bool:
        return all(_close(got[s], cpu.expected(s, **mistake), case.dtype) for s in bad)

    if matches(scale=1.0):
        return "It matches attention without the scale: multiply the scores by scale. "
    group = case.q_heads // case.kv_heads
    if group > 1 and matches(kv_head=lambda h: h % case.kv_heads):
        return ("It matches KV head h % num_kv_heads: the query heads of a group are "
                "consecutive, so query head h uses KV head h // GROUP, and the program for KV "
                "head g loads query heads g x GROUP to g x GROUP + GROUP - 1. ")
    one_block = [s for s in range(len(case.lengths)) if case.lengths[s] <= case.block_size]
    if one_block and not set(one_block) & set(bad):
        return ("Sequences of one block are right and longer ones are not: when a block "
                "raises the running max, rescale the running sum and accumulator by "
                "exp(m_old - m_new) before adding the block. ")
    if 0 not in bad:
        return ("Sequence 0 is right and later ones are not: row seq of the block table "
                "starts at block_tables_ptr + seq x stride_table_seq (the row stride, which "
                "can exceed the row's length). ")
    return ""


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> bool:
    atol, rtol = _tolerance(dtype)
    return torch.allclose(got.double().cpu(), want.double().cpu(), atol=atol, rtol=rtol)


_IDEA = ("Query head h attends with scale x (q . k) over the first seq_len tokens of its "
         "sequence through KV head h // GROUP; token t is at block_tables[seq, t // "
         "BLOCK_SIZE], offset t % BLOCK_SIZE.")


def _compare(out, case: KernelCase, name: str, want: torch.Tensor | None = None) -> None:
    if not isinstance(out, torch.Tensor) or out.shape != case.query.shape:
        raise AssertionError(f"{name}(...) on {case.describe()} returned "
                             f"{getattr(out, 'shape', type(out).__name__)}, expected shape "
                             f"{tuple(case.query.shape)}.")
    want = case.reference() if want is None else want
    if out.dtype != case.query.dtype:
        raise AssertionError(f"{name}(...) on {case.describe()} returned {out.dtype}; the "
                             f"output has the query's dtype, {case.query.dtype}.")
    bad = [s for s in range(len(case.lengths)) if not _close(out[s], want[s], case.dtype)]
    if not bad:
        return
    error = (out[bad[0]].double().cpu() - want[bad[0]].double()).abs().max().item()
    raise AssertionError(f"{name}(...) on {case.describe()}: sequence {bad[0]} (length "
                         f"{case.lengths[bad[0]]}) is off by up to {error:.3g}. "
                         + _diagnose(out, case, bad) + _IDEA)


def _kernel(fn: Callable, name: str, case: KernelCase, per_query_head: bool) -> None:
    out = learner_call(name, launch, fn, case.query, case.k_cache, case.v_cache, case.tables,
                       case.seq_lens, case.scale, per_query_head=per_query_head)
    _compare(out, case, name)


# --- step 1: one block -----------------------------------------------------------------------


def check_one_block_kernel(fn: Callable) -> None:
    """Two sequences of exactly one block of 4, 4 query heads over 2 KV heads."""
    _kernel(fn, "one_block_kernel", KernelCase([4, 4], 4, 4, 2), per_query_head=True)


def check_one_block_kernel_thoroughly(fn: Callable) -> None:
    """Blocks of 1, 16 and 32; heads 8/2, 5/1, 4/4; head dim 32; fp16."""
    for lengths, q, kv, dim, dtype in [([1, 1, 1], 8, 2, 16, torch.float32),
                                       ([16, 16], 5, 1, 32, torch.float32),
                                       ([32], 4, 4, 16, torch.float16)]:
        _kernel(fn, "one_block_kernel", KernelCase(lengths, lengths[0], q, kv, dim, dtype),
                per_query_head=True)


# --- step 2: the loop over the block table ---------------------------------------------------


def check_block_loop_kernel(fn: Callable) -> None:
    """Sequences of 3 blocks and 1 block of 4 (lengths 12 and 4), 4 query heads over 2."""
    _kernel(fn, "block_loop_kernel", KernelCase([12, 4], 4, 4, 2), per_query_head=True)


def check_block_loop_kernel_thoroughly(fn: Callable) -> None:
    """Up to 40 blocks, block sizes 1 to 16, heads 8/2 and 5/1, fp16."""
    for lengths, block_size, q, kv, dtype in [([40, 8, 1], 1, 8, 2, torch.float32),
                                              ([64, 16, 128], 16, 5, 1, torch.float32),
                                              ([8, 96], 8, 4, 2, torch.float16)]:
        _kernel(fn, "block_loop_kernel", KernelCase(lengths, block_size, q, kv, dtype=dtype),
                per_query_head=True)


# --- step 3: GQA packing ---------------------------------------------------------------------


def check_gqa_kernel(fn: Callable) -> None:
    """Lengths 12 and 4 in blocks of 4, 8 query heads over 2 KV heads (groups of 4)."""
    _kernel(fn, "gqa_kernel", KernelCase([12, 4], 4, 8, 2), per_query_head=False)


def check_gqa_kernel_thoroughly(fn: Callable) -> None:
    """Groups of 1, 4, 5 and 16; up to 32 blocks; fp16."""
    for lengths, block_size, q, kv, dtype in [([16, 48], 16, 4, 4, torch.float32),
                                              ([32, 8], 8, 32, 8, torch.float32),
                                              ([64, 16], 16, 5, 1, torch.float32),
                                              ([32, 128], 4, 16, 1, torch.float16)]:
        _kernel(fn, "gqa_kernel", KernelCase(lengths, block_size, q, kv, dtype=dtype),
                per_query_head=False)


# --- step 4: the masked tail -----------------------------------------------------------------


def check_paged_attention_kernel(fn: Callable) -> None:
    """Lengths 9, 4 and 5 in blocks of 4: tails of one token, and one full block."""
    _kernel(fn, "paged_attention_kernel", KernelCase([9, 4, 5], 4, 4, 2),
            per_query_head=False)


def check_paged_attention_kernel_thoroughly(fn: Callable) -> None:
    """Lengths 1, 37 and 523; block sizes 1 to 32; heads 32/8, 8/2, 5/1, 4/4; fp16."""
    for lengths, block_size, q, kv, dtype in [([1, 37, 523], 16, 32, 8, torch.float32),
                                              ([37, 1], 1, 8, 2, torch.float32),
                                              ([15, 523, 12], 8, 5, 1, torch.float32),
                                              ([64, 33], 32, 4, 4, torch.float32),
                                              ([1, 37, 200], 16, 8, 2, torch.float16)]:
        _kernel(fn, "paged_attention_kernel", KernelCase(lengths, block_size, q, kv,
                                                         dtype=dtype), per_query_head=False)


# --- split-KV --------------------------------------------------------------------------------


def _expected_partials(case: KernelCase, num_splits: int):
    """float64 (m, l, acc) per (seq, query head, split), None where a split is empty."""
    group = case.q_heads // case.kv_heads
    per_split = -(-case.tables.shape[1] // num_splits) * case.block_size  # tokens
    found = {}
    for seq, length in enumerate(case.lengths):
        keys = case.keys[seq].double().repeat_interleave(group, dim=1)  # [t, q_heads, dim]
        values = case.values[seq].double().repeat_interleave(group, dim=1)
        query = case.query[seq].double().cpu()
        for split in range(num_splits):
            start, stop = split * per_split, min((split + 1) * per_split, length)
            for head in range(case.q_heads):
                if start >= stop:
                    found[seq, head, split] = None
                    continue
                scores = keys[start:stop, head] @ query[head] * case.scale
                m = scores.max()
                weights = torch.exp(scores - m)
                found[seq, head, split] = (m, weights.sum(), weights @ values[start:stop, head])
    return found


def _split(fn: Callable, case: KernelCase, num_splits: int) -> None:
    from kernels.split_kv import merge_splits_kernel

    name = "split_kv_kernel"
    partials = learner_call(name, run_split_kernel, fn, case.query, case.k_cache, case.v_cache,
                            case.tables, case.seq_lens, case.scale, num_splits)
    got_m, got_l, got_acc = (t.double().cpu() for t in partials)
    atol, rtol = _tolerance(case.dtype)
    where = f"{name}(...) on {case.describe()}, {num_splits} splits"
    for (seq, head, split), want in _expected_partials(case, num_splits).items():
        at = f"{where}: sequence {seq}, query head {head}, split {split}"
        if want is None:
            if got_l[seq, head, split] != 0 or got_acc[seq, head, split].abs().max() != 0:
                raise AssertionError(
                    f"{at} covers no tokens of the sequence (length {case.lengths[seq]}), so "
                    f"it must write l = 0 and acc = 0 (and m = -inf); got l = "
                    f"{got_l[seq, head, split].item():.4g}. Clip the split's block range to "
                    "cdiv(seq_len, BLOCK_SIZE) and still store the empty partial.")
            continue
        m, total, acc = want
        checks = [("m", got_m[seq, head, split], m), ("l", got_l[seq, head, split], total),
                  ("acc", got_acc[seq, head, split], acc)]
        for label, got, expected in checks:
            if not torch.allclose(got, expected, atol=atol, rtol=rtol):
                hint = ""
                if label == "acc" and torch.allclose(got * total, expected, atol=atol,
                                                     rtol=rtol):
                    hint = "It is acc / l: store acc undivided; the merge divides. "
                raise AssertionError(
                    f"{at}: {label} is wrong (off by up to "
                    f"{(got - expected).abs().max().item():.3g}). {hint}A split's partial "
                    "covers blocks [split x blocks_per_split, (split + 1) x "
                    "blocks_per_split) of the sequence, clipped to its length: m is the "
                    "largest scaled score, l the sum of exp(score - m), acc the sum of "
                    "exp(score - m) x value.")
    out = run_merge_kernel(merge_splits_kernel, *partials, case.query.dtype)
    _compare(out, case, name + " with the reference merge")


def check_split_kv_kernel(fn: Callable) -> None:
    """Lengths 5 and 17 in blocks of 4 (tables of 5 blocks), 3 splits of 2 blocks: the
    first sequence's last split is empty."""
    _split(fn, KernelCase([5, 17], 4, 4, 2), 3)


def check_split_kv_kernel_thoroughly(fn: Callable) -> None:
    """One split, a split per block, many empty splits, GQA 5/1, fp16."""
    _split(fn, KernelCase([37, 1, 200], 16, 8, 2), 1)
    _split(fn, KernelCase([37, 1, 200], 16, 8, 2), 14)
    _split(fn, KernelCase([523, 12], 8, 5, 1), 5)
    _split(fn, KernelCase([64, 100], 16, 4, 4, dtype=torch.float16), 4)


def _merge(fn: Callable, seqs: int, heads: int, splits: int, head_dim: int, spread: float,
           dtype: torch.dtype = torch.float32) -> None:
    gen = torch.Generator().manual_seed(SEED + splits)
    m = torch.randn(seqs, heads, splits, generator=gen, dtype=torch.float64) * spread
    total = torch.rand(seqs, heads, splits, generator=gen, dtype=torch.float64) * 10 + 1
    acc = torch.randn(seqs, heads, splits, head_dim, generator=gen, dtype=torch.float64) * 5
    empty = torch.rand(seqs, heads, splits, generator=gen) < 0.3
    empty[..., 0] = False  # a sequence's first split always has tokens
    m[empty], total[empty], acc[empty] = float("-inf"), 0.0, 0.0
    weight = torch.exp(m - m.max(dim=-1, keepdim=True).values)
    want = (weight[..., None] * acc).sum(dim=2) / (weight * total).sum(dim=2)[..., None]
    device = _device()
    partials = [t.float().to(device) for t in (m, total, acc)]
    out = learner_call("merge_splits_kernel", run_merge_kernel, fn, *partials, dtype)
    atol, rtol = _tolerance(dtype)
    if isinstance(out, torch.Tensor) and not out.isnan().any() and torch.allclose(
            out.double().cpu(), want, atol=atol, rtol=max(rtol, 1e-5)):
        return
    hint = ""
    plain = acc.sum(dim=2) / total.sum(dim=2)[..., None]
    if isinstance(out, torch.Tensor) and torch.allclose(out.double().cpu(), plain, rtol=1e-4):
        hint = "It adds the partials without rescaling them to a common max. "
    raise AssertionError(
        f"merge_splits_kernel(...) on {seqs} sequences x {heads} heads x {splits} splits "
        f"(head dim {head_dim}, max scores spread {spread}, some splits empty) disagrees with "
        f"the merged softmax. {hint}With M = max over splits of m, out = sum e^(m - M) acc / "
        "sum e^(m - M) l; an empty split (m = -inf, l = 0) adds nothing.")


def check_merge_splits_kernel(fn: Callable) -> None:
    """Two sequences, 4 heads, 3 splits, head dim 16."""
    _merge(fn, 2, 4, 3, 16, 1.0)


def check_merge_splits_kernel_thoroughly(fn: Callable) -> None:
    """One split, 17 splits (padded to 32), scores 50 apart, fp16 output."""
    _merge(fn, 3, 2, 1, 16, 1.0)
    _merge(fn, 2, 5, 17, 32, 50.0)
    _merge(fn, 4, 8, 6, 64, 3.0, torch.float16)


# --- the host wrapper ------------------------------------------------------------------------

_CHECKS = ("A wrapper checks what the kernel silently assumes: query [num_seqs, num_q_heads, "
           "head_dim], caches of one shape [num_blocks, block_size, num_kv_heads, head_dim], "
           "num_q_heads a multiple of num_kv_heads, tables [num_seqs, max_blocks], seq_lens "
           "[num_seqs], power-of-two head_dim and block_size, one float dtype for query and "
           "caches, integer tables and lengths, one device, caches with equal strides.")


def _bad_inputs(name: str, case: KernelCase):
    """A broken version of ``case``'s arguments, and the error it must raise."""
    q, k, v, t, s = case.query, case.k_cache, case.v_cache, case.tables, case.seq_lens
    return {
        "a query without its batch dimension": ((q[0], k, v, t, s), ValueError),
        "caches of different shapes": ((q, k, v[:-1], t, s), ValueError),
        "6 query heads over 4 KV heads": ((q[:, :3].repeat(1, 2, 1), k.repeat(1, 1, 2, 1),
                                           v.repeat(1, 1, 2, 1), t, s), ValueError),
        "a block table with one row too few": ((q, k, v, t[:-1], s), ValueError),
        "seq_lens with one entry too many": ((q, k, v, t, torch.cat([s, s[:1]])), ValueError),
        "head_dim 12 (not a power of two)": ((q[..., :12], k[..., :12].contiguous(),
                                             v[..., :12].contiguous(), t, s), ValueError),
        "a float16 query over float32 caches": ((q.half(), k, v, t, s), TypeError),
        "a float block table": ((q, k, v, t.float(), s), TypeError),
        "seq_lens on another device (meta)": ((q, k, v, t, s.to("meta")), ValueError),
        "a v_cache with other strides": ((q, k, v.transpose(0, 1).contiguous().transpose(0, 1),
                                          t, s), ValueError),
    }[name]


def _raises(fn: Callable, case: KernelCase, what: str) -> None:
    args, error = _bad_inputs(what, case)
    try:
        fn(*args, case.scale)
    except error:
        return
    except NotImplementedError:
        raise AssertionError(not_written("paged_attention")) from None
    except Exception as exc:
        raise AssertionError(f"paged_attention(...) with {what} raised {type(exc).__name__}: "
                             f"{str(exc)[:200]}; expected {error.__name__}. {_CHECKS}") from exc
    raise AssertionError(f"paged_attention(...) with {what} returned without an error; "
                         f"expected {error.__name__}. {_CHECKS}")


def _wrapper(fn: Callable, case: KernelCase) -> None:
    out = learner_call("paged_attention", fn, case.query, case.k_cache, case.v_cache,
                       case.tables, case.seq_lens, case.scale)
    name = "paged_attention"
    if case.dtype == torch.bfloat16 and not on_gpu() and isinstance(out, torch.Tensor) \
            and not _close(out, case.reference(), case.dtype):
        raise AssertionError(f"{name}(...) on {case.describe()} is wrong: the interpreter "
                             "has no bf16 arithmetic, so upcast bf16 inputs to float32 there "
                             "and cast the output back.")
    _compare(out, case, name)


def check_paged_attention(fn: Callable) -> None:
    """Lengths 5, 9 and 4 in blocks of 4; and a float16 query over float32 caches must raise
    TypeError."""
    case = KernelCase([5, 9, 4], 4, 4, 2)
    _wrapper(fn, case)
    _raises(fn, case, "a float16 query over float32 caches")


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
    _wrapper(fn, KernelCase([1, 37, 100], block, 8, 2, dtype=torch.float16))
    _wrapper(fn, KernelCase([37, 5], block, 4, 1, dtype=torch.bfloat16))
    if on_gpu():
        from autograder.checks.ch07_gpu import check_production_shapes

        check_production_shapes(fn)
