"""Chapter 7's kernel cases: the case a GPU runs for each, how close is right, and what a
wrong output matches.

Cases are chapter 6's: a NaN-filled pool with shuffled physical blocks. Here the block tables
are also a view into a wider buffer (a row stride larger than the row) whose other entries
name a decoy block of finite values, and the pool is a view with a poisoned block on either
side, so a kernel that reads the table with the wrong stride, or a block one too many, gets
wrong numbers rather than a crash. Head sizes are not powers of two (24, 40), as in real
models (80, 96, 112).

On a GPU the kernels compile: block sizes under 16 cannot run through ``tl.dot`` there, so
each case takes blocks of 16 instead, with the same number of blocks and the same tails (a
length of 9 in blocks of 4, two blocks and one token, becomes 33 in blocks of 16). The checks
ask the hidden module about both versions of every case, so the learner edition's recordings
answer on either machine.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from autograder.checks._tensors import expect_attention_output
from autograder.private import private
from course.notebook.paged_cases import KERNEL_SEED as SEED
from course.notebook.paged_cases import KernelCase, dtype_name, on_gpu

GPU_BLOCK = 16
"""The block size every case takes on a GPU: tl.dot's K >= 16 for 16-bit inputs there."""
_TOLERANCE = {torch.float32: (1e-5, 1e-4), torch.float16: (3e-3, 1e-2),
              torch.bfloat16: (2e-2, 5e-2)}  # (atol, rtol)
_TF32 = (2e-3, 2e-3)  # fp32 tl.dot on a GPU multiplies in TF32 (10-bit mantissa)


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return _TF32 if dtype == torch.float32 and on_gpu() else _TOLERANCE[dtype]


def gpu_twin(spec: dict) -> dict:
    """The case a GPU runs for ``spec``: blocks of ``GPU_BLOCK`` tokens, each length keeping
    its number of whole blocks and its tail (9 in blocks of 4 -> 33 in blocks of 16)."""
    block = spec["block_size"]
    if block >= GPU_BLOCK:
        return dict(spec)
    lengths = [n // block * GPU_BLOCK + n % block for n in spec["lengths"]]
    return dict(spec, lengths=lengths, block_size=GPU_BLOCK)


def device_case(lengths, block_size, q_heads, kv_heads, head_dim=16, dtype=torch.float32,
                seed=SEED) -> KernelCase:
    """The case as given on the interpreter, its ``gpu_twin`` on a GPU; ``case.specs`` holds
    both (the questions a check asks the hidden module on either machine)."""
    spec = dict(lengths=list(lengths), block_size=block_size, q_heads=q_heads,
                kv_heads=kv_heads, head_dim=head_dim, dtype=dtype_name(dtype), seed=seed)
    twin = gpu_twin(spec)
    case = KernelCase(**(twin if on_gpu() else spec))
    case.specs = [spec] if twin == spec else [spec, twin]
    return case


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype,
           equal_nan: bool = False) -> bool:
    atol, rtol = tolerance(dtype)
    return torch.allclose(got.double().cpu(), want.double().cpu(), atol=atol, rtol=rtol,
                          equal_nan=equal_nan)


# --- what a wrong output matches --------------------------------------------------------------

_MISTAKES = {
    "no_scale": "It matches attention without the scale: the scores are scale x (q . k). ",
    "kv_head_modulo": (
        "It matches query head h reading KV head h % num_kv_heads: the query heads of a group "
        "are consecutive, so query head h reads KV head h // GROUP, and the program for KV "
        "head g holds query heads g x GROUP to g x GROUP + GROUP - 1. "),
    "table_row0": (
        "Every sequence attends over sequence 0's blocks: row seq of the block table starts "
        "seq x stride_table_seq entries in (a row's stride can exceed its length). "),
    "table_ignored": (
        "It matches reading physical block j as a sequence's j-th block: the block table "
        "maps the sequence's j-th block to the physical block it names. "),
    "tail_dropped": (
        "It matches attention over each sequence's whole blocks only: the loop stops before "
        "the partly filled last block (a sequence of seq_len tokens has cdiv(seq_len, "
        "BLOCK_SIZE) blocks). "),
    "last_block_dropped": (
        "It matches attention without each sequence's last block: the loop over the block "
        "table runs one block short. "),
    "extra_block": (
        "It matches attention over one block too many: the loop also reads the table entry "
        "after the sequence's last block (here a block of other data). "),
    "rescale_missing": (
        "It matches an online softmax that never rescales: when a block raises the running "
        "max, the running sum and the accumulator, summed against the old max, are worth "
        "exp(m_old - m_new) as much against the new one. "),
    "rescale_sum_missing": (
        "It matches an online softmax that rescales the accumulator but not the running sum "
        "when a block raises the running max. "),
    "rescale_acc_missing": (
        "It matches an online softmax that rescales the running sum but not the accumulator "
        "when a block raises the running max. "),
}


def _diagnose(out: torch.Tensor, case: KernelCase, bad: list[int], known: dict,
              audit: Callable[[], str]) -> str:
    """What a wrong output matches, as a hint: a known mistake (the first whose output agrees
    on every wrong sequence), what the interpreter saw the kernel do (``audit()``), a
    sequence of length 0, or NaN."""
    got = out.detach().cpu()
    for mistake, hint in _MISTAKES.items():
        wrong = known.get(mistake)
        if wrong is None or all(wrong[s].isnan().all() for s in bad):
            continue  # a mistake that gives only NaN here says nothing NaN would not
        if all(close(got[s], wrong[s], case.dtype, equal_nan=True) for s in bad):
            return hint
    seen = audit()
    if seen:
        return seen + ". "
    empty = [s for s in bad if case.lengths[s] == 0]
    if empty:
        value = "NaN" if got[empty[0]].isnan().any() else "nonzero values"
        return (f"Sequence {empty[0]} has length 0 and got {value}: with no token to attend "
                "to, the softmax's sum is 0 (0 / 0 is NaN); a sequence of length 0 gets "
                "zeros. ")
    nan = [s for s in bad if got[s].isnan().any()]
    whole = [s for s in nan if case.lengths[s] % case.block_size == 0]
    if nan and not whole:
        return ("It has NaN, only in sequences whose last block is partly filled: garbage "
                "from slots past a sequence's end reached the arithmetic (NaN x 0 is still "
                "NaN, so masking the weights is too late). ")
    if nan:
        return (f"It has NaN in sequence {whole[0]}, whose length {case.lengths[whole[0]]} is "
                "a whole number of blocks: the kernel read slots that hold none of the "
                "sequence's tokens (the pool's unused slots hold NaN here). ")
    return ""


_IDEA = ("Query head h attends with scale x (q . k) over the first seq_len tokens of its "
         "sequence through KV head h // GROUP; token t is at block_tables[seq, t // "
         "BLOCK_SIZE], offset t % BLOCK_SIZE.")


def compare(out, case: KernelCase, name: str, want: torch.Tensor, known: dict,
             audit: Callable[[], str] = lambda: "", call: str | None = None) -> None:
    """``out`` against ``want`` (chapter 6's attention on the case, in its dtype); then what
    the interpreter saw (``audit()``), which must be nothing. ``call``: how the hint names
    the call (``name(...)``)."""
    name = call or f"{name}(...)"
    expect_attention_output(out, name, case.describe(), case.query)
    bad = [s for s in range(len(case.lengths)) if not close(out[s], want[s], case.dtype)]
    if bad:
        error = (out[bad[0]].double().cpu() - want[bad[0]].double()).abs()
        error = error.nan_to_num(float("inf")).max().item()
        raise AssertionError(f"{name} on {case.describe()}: sequence {bad[0]} (length "
                             f"{case.lengths[bad[0]]}) is off by up to {error:.3g}. "
                             + _diagnose(out, case, bad, known, audit) + _IDEA)
    seen = audit()
    if seen:
        raise AssertionError(f"{name} on {case.describe()} returned the right values, but "
                             f"{seen}.")


def asked(case: KernelCase) -> tuple[torch.Tensor, dict]:
    """The expected output of ``case`` and what known mistakes give there, asked before the
    code under test runs (for both the interpreter's and the GPU's version of the case)."""
    answers = private("07")
    found = {}
    for spec in case.specs:
        found[repr(spec)] = (answers.kernel_expected(**spec), answers.kernel_mistakes(**spec))
    return found[repr(case.spec())]


