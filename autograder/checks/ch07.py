"""Visible checks for chapter 7, a Triton paged-attention kernel: each TODO's readable case.

The cases, and what a wrong output matches, are in ``ch07_cases``; what the interpreter saw,
in ``ch07_audit``; the host wrapper's checks, in ``ch07_wrapper``. Here are the checks of the
kernels, one per TODO.

Expected outputs and partials, and what known mistakes would produce, come from the chapter's
hidden module (``autograder.private``), asked by a case's description (its shapes and seed)
before the code under test runs; the thorough checks are there too.

Where the checks look, beyond the output:

- on Triton's CPU interpreter, every program's loads and stores (``_memory_audit``): a program
  that writes another program's output rows (which the next program overwrites, so the output
  looks right), reads a block-table entry past its sequence's blocks, or reads outside every
  argument, fails; so does a wrapper that never launches the split-KV grid when asked to;
- on any machine, the kernel compiled for an A100 (sm_80) with Triton's own compiler
  (``kernels.compile_check``): it must compile, and multiply a block number by
  ``stride_kv_block`` in int64 (a product in int32 wraps once a pool passes 2^31 elements).

On a GPU the cases take blocks of 16 (``ch07_cases.gpu_twin``) and the interpreter's audit
does not run.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from autograder.checks._helpers import learner_call
from autograder.checks._memory_audit import MemoryAudit
from autograder.checks.ch07_audit import decode_audit, merge_audit, quiet, split_audit
from autograder.checks.ch07_cases import asked, compare, device_case, tolerance
from autograder.checks.ch07_wrapper import check_paged_attention
from autograder.private import private, visible
from course.notebook.paged_cases import KERNEL_SEED as SEED
from course.notebook.paged_cases import KernelCase, kernel_device
from kernels.paged_attention import launch
from kernels.split_kv import run_merge_kernel, run_split_kernel

__all__ = ["check_block_loop_kernel", "check_gqa_kernel", "check_merge_splits_kernel",
           "check_one_block_kernel", "check_paged_attention", "check_paged_attention_kernel",
           "check_split_kv_kernel"]


def _addresses_in_int64(fn, name: str) -> None:
    """``fn`` compiled for an A100 (sm_80): it must compile, and its block number x
    ``stride_kv_block`` products must be int64."""
    from kernels import compile_check

    try:
        found = compile_check.inspect_anywhere(fn, "fp16", None, "sm_80 (A100)")
    except (OSError, TypeError, ValueError):  # no source to compile: nothing to say
        return
    if found.get("internal"):
        return
    if found["error"]:
        raise AssertionError(
            f"{name} does not compile for an NVIDIA A100 (sm_80; fp16, blocks of 16, head size "
            f"128): {found['error']}. The interpreter accepts code that GPUs' compiler "
            "refuses; on a GPU this kernel would not run.")
    narrow = [p for p in found["products"] if not p["int64"]]
    if narrow:
        where = (f" (line {narrow[0]['line']} of the kernel: `{narrow[0]['code']}`)"
                 if narrow[0].get("code") else "")
        raise AssertionError(
            f"{name}, compiled for an NVIDIA A100 (sm_80), multiplies a block number read "
            f"from the block table by stride_kv_block in {narrow[0]['type']}, not int64{where}: "
            "on a GPU that product wraps once the pool holds more than 2^31 elements (4 GiB of "
            "fp16), and the kernel reads another address. The block number is int64 before it "
            "is multiplied.")


def _kernel(fn: Callable, name: str, case: KernelCase, per_query_head: bool,
            want: torch.Tensor, known: dict, int64: bool = False) -> None:
    with MemoryAudit() as audit, quiet():
        out = learner_call(name, launch, fn, *case.arguments(), per_query_head=per_query_head)
    compare(out, case, name, want, known, decode_audit(audit, case, out, per_query_head))
    if int64:
        _addresses_in_int64(fn, name)


def _visible_kernel(fn: Callable, name: str, case: KernelCase, per_query_head: bool,
                    int64: bool = False) -> None:
    _kernel(fn, name, case, per_query_head, *asked(case), int64=int64)


# --- step 1: one block -----------------------------------------------------------------------


@visible
def check_one_block_kernel(fn: Callable) -> None:
    """Two sequences of exactly one block of 4, 4 query heads over 2 KV heads, head size 24
    (tiles of 32 columns)."""
    _visible_kernel(fn, "one_block_kernel", device_case([4, 4], 4, 4, 2, head_dim=24),
                    per_query_head=True)


# --- step 2: the loop over the block table ---------------------------------------------------


@visible
def check_block_loop_kernel(fn: Callable) -> None:
    """Sequences of 3 blocks, 1 block and 2 blocks of 4 (lengths 12, 4, 8), 4 query heads
    over 2, head size 24."""
    _visible_kernel(fn, "block_loop_kernel", device_case([12, 4, 8], 4, 4, 2, head_dim=24),
                    per_query_head=True)


# --- step 3: GQA packing ---------------------------------------------------------------------


@visible
def check_gqa_kernel(fn: Callable) -> None:
    """Lengths 12 and 4 in blocks of 4, 6 query heads over 2 KV heads (groups of 3, padded to
    4 rows), head size 40 (tiles of 64 columns)."""
    _visible_kernel(fn, "gqa_kernel", device_case([12, 4], 4, 6, 2, head_dim=40),
                    per_query_head=False)


# --- step 4: the masked tail -----------------------------------------------------------------


@visible
def check_paged_attention_kernel(fn: Callable) -> None:
    """Lengths 9, 8, 5 and 0 in blocks of 4 (tails of one token, two whole blocks, an empty
    sequence), 6 query heads over 2, head size 24; then compiled for an A100."""
    _visible_kernel(fn, "paged_attention_kernel", device_case([9, 8, 5, 0], 4, 6, 2,
                                                              head_dim=24),
                    per_query_head=False, int64=True)


# --- split-KV --------------------------------------------------------------------------------

_SPLIT_IDEA = ("A split's partial covers blocks [split x blocks_per_split, (split + 1) x "
               "blocks_per_split) of the sequence, clipped to its length: m is the largest "
               "scaled score, l the sum of exp(score - m), acc the sum of exp(score - m) x "
               "value.")


def _split(fn: Callable, case: KernelCase, num_splits: int, want: dict):
    """What the interpreter saw the learner's split kernel do, then its partials against
    ``want`` (float64 ``m``, ``l``, ``acc`` per (seq, query head, split), and ``empty``: the
    splits that cover no token); returns them."""
    name = "split_kv_kernel"
    with MemoryAudit() as audit, quiet():
        partials = learner_call(name, run_split_kernel, fn, *case.arguments(), num_splits)
    where = f"{name}(...) on {case.describe()}, {num_splits} splits"
    seen = split_audit(audit, case, partials, num_splits)()
    if seen:  # what the kernel was seen doing names the cause best
        raise AssertionError(f"{where}: {seen}.")
    got_m, got_l, got_acc = (t.double().cpu() for t in partials)
    atol, rtol = tolerance(case.dtype)
    for seq in range(len(case.lengths)):
        for split in range(num_splits):
            for head in range(case.q_heads):
                at = f"{where}: sequence {seq}, query head {head}, split {split}"
                index = seq, head, split
                if want["empty"][index]:
                    m = got_m[index].item()
                    if got_l[index] != 0 or got_acc[index].abs().max() != 0 or m != m \
                            or m == float("inf"):
                        raise AssertionError(
                            f"{at} covers no tokens of the sequence (length "
                            f"{case.lengths[seq]}), so it must write l = 0 and acc = 0 (and "
                            f"m = -inf); got l = {got_l[index].item():.4g}, m = {m:.4g}. A "
                            "split's block range ends at the sequence's last block, and an "
                            "empty range still stores its partial.")
                    continue
                checks = [("m", got_m[index], want["m"][index]),
                          ("l", got_l[index], want["l"][index]),
                          ("acc", got_acc[index], want["acc"][index])]
                for label, got, expected in checks:
                    if not torch.allclose(got, expected, atol=atol, rtol=rtol):
                        hint = ""
                        if label == "acc" and torch.allclose(got * want["l"][index], expected,
                                                             atol=atol, rtol=rtol):
                            hint = "It is acc / l: acc is stored undivided; the merge divides. "
                        raise AssertionError(
                            f"{at}: {label} is wrong (off by up to "
                            f"{(got - expected).abs().nan_to_num(float('inf')).max().item():.3g}"
                            f"). {hint}" + _SPLIT_IDEA)
    return partials


def _split_partials(case: KernelCase, num_splits: int) -> dict:
    """The expected partials, asked for both versions of the case."""
    answers = private("07")
    found = {repr(spec): answers.split_partials(**spec, num_splits=num_splits)
             for spec in case.specs}
    return found[repr(case.spec())]


@visible
def check_split_kv_kernel(fn: Callable) -> None:
    """Lengths 5, 17 and 8 in blocks of 4 (tables of 6 blocks), 3 splits of 2 blocks: the
    first and last sequences' last splits are empty; head size 24, groups of 3; then
    compiled for an A100."""
    case = device_case([5, 17, 8], 4, 6, 2, head_dim=24)
    _split(fn, case, 3, _split_partials(case, 3))
    _addresses_in_int64(fn, "split_kv_kernel")


def merge_inputs(seqs: int, heads: int, splits: int, head_dim: int, spread: float):
    """Seeded float64 partials (m, l, acc) of ``splits`` splits, about 30 % of them empty
    (m = -inf, l = 0, acc = 0; a sequence's first split never is, except for the first
    head of the last sequence, whose splits are all empty: a sequence of length 0)."""
    gen = torch.Generator().manual_seed(SEED + splits)
    m = torch.randn(seqs, heads, splits, generator=gen, dtype=torch.float64) * spread
    total = torch.rand(seqs, heads, splits, generator=gen, dtype=torch.float64) * 10 + 1
    acc = torch.randn(seqs, heads, splits, head_dim, generator=gen, dtype=torch.float64) * 5
    empty = torch.rand(seqs, heads, splits, generator=gen) < 0.3
    empty[..., 0] = False  # a sequence's first split has tokens, unless the sequence is empty
    empty[-1, 0, :] = True
    m[empty], total[empty], acc[empty] = float("-inf"), 0.0, 0.0
    return m, total, acc


def _merge(fn: Callable, ask: Callable, seqs: int, heads: int, splits: int, head_dim: int,
           spread: float, dtype: torch.dtype = torch.float32) -> None:
    """The learner's merge of ``merge_inputs`` against ``ask``'s: the merged softmax, and
    what adding the partials without rescaling gives."""
    want, plain = ask(seqs=seqs, heads=heads, splits=splits, head_dim=head_dim, spread=spread)
    device = kernel_device()
    partials = [t.float().to(device) for t in merge_inputs(seqs, heads, splits, head_dim,
                                                           spread)]
    with MemoryAudit() as audit, quiet():
        out = learner_call("merge_splits_kernel", run_merge_kernel, fn, *partials, dtype)
    atol, rtol = tolerance(dtype)
    where = (f"merge_splits_kernel(...) on {seqs} sequences x {heads} heads x {splits} splits "
             f"(head size {head_dim}, max scores spread {spread}, some splits empty, and all "
             f"of sequence {seqs - 1}'s for head 0)")
    if isinstance(out, torch.Tensor) and not out.isnan().any() and torch.allclose(
            out.double().cpu(), want, atol=atol, rtol=max(rtol, 1e-5)):
        seen = merge_audit(audit, out)()
        if seen:
            raise AssertionError(f"{where} returned the right values, but {seen}.")
        return
    hint = ""
    if isinstance(out, torch.Tensor) and out.shape == want.shape:
        got = out.double().cpu()
        if not got[-1, 0].isfinite().all() or got[-1, 0].abs().max() > 0:
            if torch.allclose(got[:-1], want[:-1], atol=atol, rtol=max(rtol, 1e-5)):
                hint = (f"Only sequence {seqs - 1}'s head 0, whose splits are all empty, is "
                        "wrong: with every m = -inf there is nothing to merge, and the row is "
                        "zeros. ")
        if not hint and torch.allclose(got[:-1], plain[:-1], rtol=1e-4):
            hint = "It adds the partials without rescaling them to a common max. "
    raise AssertionError(
        f"{where} disagrees with the merged softmax. {hint}With M = max over splits of m, "
        "out = sum e^(m - M) acc / sum e^(m - M) l; an empty split (m = -inf, l = 0) adds "
        "nothing.")


@visible
def check_merge_splits_kernel(fn: Callable) -> None:
    """Two sequences, 4 heads, 3 splits, head size 24 (tiles of 32 columns)."""
    _merge(fn, private("07").merge_case, 2, 4, 3, 24, 1.0)


