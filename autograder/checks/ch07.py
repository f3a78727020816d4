"""Visible checks for chapter 7, a Triton paged-attention kernel: each TODO's readable case.

Cases are chapter 6's: a NaN-filled pool with shuffled physical blocks. Here the block tables
are also a view into a wider buffer (a row stride larger than the row) whose other entries
name a decoy block of finite values, and the pool is a view with a poisoned block on either
side, so a kernel that reads the table with the wrong stride, or a block one too many, gets
wrong numbers rather than a crash. Head sizes are not powers of two (24, 40), as in real
models (80, 96, 112).

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

On a GPU the kernels compile: block sizes under 16 cannot run through ``tl.dot`` there, so
each case takes blocks of 16 instead, with the same number of blocks and the same tails (a
length of 9 in blocks of 4, two blocks and one token, becomes 33 in blocks of 16). The checks
ask the hidden module about both versions of every case, so the learner edition's recordings
answer on either machine. The interpreter's audit does not run on a GPU.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable

import numpy as np
import torch

from autograder.checks._helpers import learner_call, not_written
from autograder.checks._memory_audit import MemoryAudit, nearest
from autograder.private import private, visible
from course.paged_cases import KERNEL_SEED as SEED
from course.paged_cases import KernelCase, PagedCase, dtype_name, kernel_device, on_gpu
from kernels.paged_attention import launch
from kernels.split_kv import run_merge_kernel, run_split_kernel

GPU_BLOCK = 16
"""The block size every case takes on a GPU: tl.dot's K >= 16 for 16-bit inputs there."""
_TOLERANCE = {torch.float32: (1e-5, 1e-4), torch.float16: (3e-3, 1e-2),
              torch.bfloat16: (2e-2, 5e-2)}  # (atol, rtol)
_TF32 = (2e-3, 2e-3)  # fp32 tl.dot on a GPU multiplies in TF32 (10-bit mantissa)


def _tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return _TF32 if dtype == torch.float32 and on_gpu() else _TOLERANCE[dtype]


@contextlib.contextmanager
def quiet():
    """NumPy's floating-point warnings off: a wrong kernel's NaN arithmetic on the
    interpreter would print them to stderr, which nbgrader scores as a failed cell."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


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


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype,
           equal_nan: bool = False) -> bool:
    atol, rtol = _tolerance(dtype)
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
        if all(_close(got[s], wrong[s], case.dtype, equal_nan=True) for s in bad):
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


def _compare(out, case: KernelCase, name: str, want: torch.Tensor, known: dict,
             audit: Callable[[], str] = lambda: "", call: str | None = None) -> None:
    """``out`` against ``want`` (chapter 6's attention on the case, in its dtype); then what
    the interpreter saw (``audit()``), which must be nothing. ``call``: how the hint names
    the call (``name(...)``)."""
    name = call or f"{name}(...)"
    if not isinstance(out, torch.Tensor) or out.shape != case.query.shape:
        raise AssertionError(f"{name} on {case.describe()} returned "
                             f"{getattr(out, 'shape', type(out).__name__)}, expected shape "
                             f"{tuple(case.query.shape)}.")
    if out.dtype != case.query.dtype:
        raise AssertionError(f"{name} on {case.describe()} returned {out.dtype}; the "
                             f"output has the query's dtype, {case.query.dtype}.")
    bad = [s for s in range(len(case.lengths)) if not _close(out[s], want[s], case.dtype)]
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


# --- what the interpreter saw ------------------------------------------------------------------


def _program(program: tuple[int, ...], per_query_head: bool) -> str:
    return (f"program (seq {program[0]}, {'query' if per_query_head else 'KV'} head "
            f"{program[1]})")


def store_finding(audit: MemoryAudit, out: torch.Tensor, owns: Callable, who: Callable,
                  label: str, rows: int, columns: int) -> str:
    """The first store into ``out`` (a contiguous tensor named ``label``) outside the storing
    program's own elements (``owns(program, index) -> bool array``), or a store that writes
    one element twice; '' if none. ``rows``/``columns``: the real rows and columns of a
    program's tile, to say which padding spilled."""
    for access, offsets, inside in audit.touching(out, "store"):
        where = offsets[inside]
        if ((where < 0) | (where >= out.numel())).any():
            return f"{who(access.program)} wrote outside {label}"
        index = np.unravel_index(where, tuple(out.shape))
        own = owns(access.program, index)
        values, counts = np.unique(where, return_counts=True)
        culprit = ~own if not own.all() else np.isin(where, values[counts > 1])
        if not culprit.any():
            continue
        first = int(np.argmax(culprit))
        element = "[" + ", ".join(str(int(i[first])) for i in index) + "]"
        lanes = [lane[inside] for lane in access.lanes]
        spill = ""
        if lanes and (lanes[-1][culprit] >= columns).any():
            spill = (": the tile's columns past HEAD_DIM (its padding) ran into the next "
                     "head's row; only the HEAD_DIM real columns are stored")
        elif len(lanes) == 2 and (lanes[0][culprit] >= rows).any():
            spill = (": the tile's padding rows past GROUP were stored into another group's "
                     "heads; only the GROUP real rows are stored")
        if not own.all():
            return (f"{who(access.program)} wrote {label}{element}, which belongs to another "
                    f"program{spill} (the interpreter runs programs one after another, so "
                    "that program overwrote it here; on a GPU the two race)")
        return f"{who(access.program)} wrote {label}{element} twice in one store{spill}"
    return ""


def _table_finding(audit: MemoryAudit, case: KernelCase, allowed: Callable, who: Callable
                   ) -> str:
    """The first block-table read outside ``allowed(program) -> (row, first, stop)``."""
    stride = case.tables.stride(0)
    width = case.tables.shape[1]
    for access, offsets, inside in audit.touching(case.tables, "load"):
        row, first, stop = allowed(access.program)
        for offset in offsets[inside]:
            r, c = divmod(int(offset), stride)
            if r == row and first <= c < stop:
                continue
            length = case.lengths[row]
            if r != row:
                return (f"{who(access.program)} read block_tables[{r}, {c}], in sequence {r}'s "
                        f"row: sequence {row}'s row starts {row} x stride_table_seq entries in")
            past = "past the end of the row, " if c >= width else ""
            return (f"{who(access.program)} read block_tables[{r}, {c}], {past}outside the "
                    f"entries it needs ({first} to {stop - 1}; sequence {row} has length "
                    f"{length}, {case.blocks(row)} block(s) of {case.block_size}): the table "
                    "may end after a sequence's last block (the K/V loads of an extra block "
                    "are masked, so the output does not show it)")
    return ""


def _stray_finding(audit: MemoryAudit, case: PagedCase, who: Callable,
                   extra: dict[str, torch.Tensor]) -> str:
    """The first store, then load, at an address in none of the case's tensors and
    ``extra``'s (a kernel's other arguments), as a hint; '' if none."""
    tensors = {"query": case.query, "k_cache": case.k_cache, "v_cache": case.v_cache,
               "block_tables": case.tables, "seq_lens": case.seq_lens} | extra
    for kind in ("store", "load"):
        found = audit.stray_loads(list(tensors.values()), kind)
        if found:
            access, address = found[0]
            program, near = who(access.program), nearest(tensors, address)
            if kind == "store":
                return f"{program} wrote memory outside every argument ({near})"
            return f"{program} read memory outside every argument ({near})"
    return ""


def decode_audit(audit: MemoryAudit, case: KernelCase, out, per_query_head: bool
                 ) -> Callable[[], str]:
    """What the interpreter saw a decode kernel do wrong, as a hint ('' if nothing)."""
    def seen() -> str:
        if not audit.active or not isinstance(out, torch.Tensor) or \
                out.shape != case.query.shape or not out.is_contiguous():
            return ""
        group = case.q_heads // case.kv_heads

        def who(program):
            return _program(program, per_query_head)

        def owns(program, index):
            seq, head = index[0], index[1]
            first, count = (program[1], 1) if per_query_head else (program[1] * group, group)
            return (seq == program[0]) & (head >= first) & (head < first + count)

        return (store_finding(audit, out, owns, who, "out", group, case.head_dim)
                or _table_finding(audit, case, lambda p: (p[0], 0, case.blocks(p[0])), who)
                or _stray_finding(audit, case, who, {"out": out}))
    return seen


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
    _compare(out, case, name, want, known, decode_audit(audit, case, out, per_query_head))
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


def split_audit(audit: MemoryAudit, case: KernelCase, partials, num_splits: int
                ) -> Callable[[], str]:
    """What the interpreter saw a split kernel do wrong, as a hint ('' if nothing)."""
    def seen() -> str:
        if not audit.active or not isinstance(partials, tuple) or len(partials) != 3:
            return ""
        group = case.q_heads // case.kv_heads
        per_split = -(-case.tables.shape[1] // num_splits)

        def who(program):
            return f"program (seq {program[0]}, KV head {program[1]}, split {program[2]})"

        def owns(program, index):
            seq, head, split = index[0], index[1], index[2]
            return ((seq == program[0]) & (head // group == program[1])
                    & (split == program[2]))

        def allowed(program):
            first = program[2] * per_split
            return program[0], first, min(first + per_split, case.blocks(program[0]))

        for label, tensor in zip(("the m partials", "the l partials", "the acc partials"),
                                 partials, strict=True):
            found = store_finding(audit, tensor, owns, who, label, group, case.head_dim)
            if found:
                return found
        return (_table_finding(audit, case, allowed, who)
                or _stray_finding(audit, case, who, dict(zip("mla", partials, strict=True))))
    return seen


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
    atol, rtol = _tolerance(case.dtype)
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


def merge_audit(audit: MemoryAudit, out) -> Callable[[], str]:
    def seen() -> str:
        if not audit.active or not isinstance(out, torch.Tensor) or out.dim() != 3:
            return ""

        def owns(program, index):
            return (index[0] == program[0]) & (index[1] == program[1])

        return store_finding(audit, out, owns,
                              lambda p: f"program (seq {p[0]}, query head {p[1]})", "out", 1,
                              out.shape[2])
    return seen


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
    atol, rtol = _tolerance(dtype)
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


# --- the host wrapper ------------------------------------------------------------------------


def _padded_like(tensor: torch.Tensor, gap: int, dim: int) -> torch.Tensor:
    """``tensor`` as a view whose ``dim`` steps ``gap`` elements apart in a wider buffer."""
    shape = list(tensor.shape)
    shape[dim] *= gap
    wide = torch.zeros(shape, dtype=tensor.dtype, device=tensor.device)
    index = [slice(None)] * tensor.dim()
    index[dim] = slice(None, None, gap)
    wide[tuple(index)] = tensor
    return wide[tuple(index)]


def _kv_views(case: KernelCase) -> tuple[torch.Tensor, torch.Tensor]:
    """The caches as vLLM holds them: kv[:, 0] and kv[:, 1] of one [num_blocks, 2,
    block_size, kv_heads, head_dim] tensor."""
    kv = torch.stack([case.k_cache, case.v_cache], dim=1)
    return kv[:, 0], kv[:, 1]


def _with(case: KernelCase, **changes):
    """The case's arguments with some replaced: (args, kwargs)."""
    arguments = dict(query=case.query, k_cache=case.k_cache, v_cache=case.v_cache,
                     block_tables=case.tables, seq_lens=case.seq_lens, scale=case.scale)
    options = {k: changes.pop(k) for k in ("num_splits",) if k in changes}
    arguments.update(changes)
    return tuple(arguments.values()), options


def _used_entry(case: KernelCase) -> tuple[int, int]:
    """(seq, index) of the last block the longest sequence uses."""
    seq = max(range(len(case.lengths)), key=lambda s: case.lengths[s])
    return seq, case.blocks(seq) - 1


def _with_entry(case: KernelCase, value: int) -> torch.Tensor:
    """The case's table (a view of a copy of its wide buffer) with one used entry set."""
    wide = case.wide.clone()
    seq, index = _used_entry(case)
    wide[seq, index] = value
    return wide[:case.tables.shape[0], :case.tables.shape[1]]


def _longer(case: KernelCase) -> torch.Tensor:
    lengths = case.seq_lens.clone()
    seq, _ = _used_entry(case)
    lengths[seq] = case.tables.shape[1] * case.block_size + 1
    return lengths


def _padded_with(case: KernelCase, value: int) -> torch.Tensor:
    """The table with every entry past each sequence's blocks set to ``value`` (vLLM pads
    block tables; -1 is common)."""
    wide = torch.full_like(case.wide, value)
    for seq in range(len(case.lengths)):
        wide[seq, :case.blocks(seq)] = case.wide[seq, :case.blocks(seq)]
    return wide[:case.tables.shape[0], :case.tables.shape[1]]


def _head_dim_strided(case: KernelCase) -> tuple[torch.Tensor, torch.Tensor]:
    k = case.k_cache.transpose(2, 3).contiguous().transpose(2, 3)
    v = case.v_cache.transpose(2, 3).contiguous().transpose(2, 3)
    return k, v


# Each bad input: how to build it, the error it must raise, and the rule (the hint's idea).
BAD_INPUTS: dict[str, tuple[Callable, type, str]] = {
    "seq_lens as a list": (
        lambda c: _with(c, seq_lens=c.seq_lens.tolist()), TypeError,
        "the arguments' types are checked before any attribute (shape, dtype) is read: "
        "query, k_cache, v_cache, block_tables and seq_lens are torch.Tensors"),
    "query as a list of lists": (
        lambda c: _with(c, query=c.query.tolist()), TypeError,
        "query, k_cache, v_cache, block_tables and seq_lens are torch.Tensors"),
    "scale as a string": (
        lambda c: _with(c, scale=str(c.scale)), TypeError, "scale is a real number"),
    "num_splits=2.5": (
        lambda c: _with(c, num_splits=2.5), TypeError, "num_splits is an int or None"),
    "num_splits=0": (
        lambda c: _with(c, num_splits=0), ValueError,
        "num_splits is at least 1 (None lets the wrapper choose)"),
    "a query without its batch dimension": (
        lambda c: _with(c, query=c.query[0]), ValueError,
        "query is [num_seqs, num_q_heads, head_dim]"),
    "caches of different shapes": (
        lambda c: _with(c, v_cache=c.v_cache[:-1]), ValueError,
        "k_cache and v_cache have one shape [num_blocks, block_size, num_kv_heads, head_dim]"),
    "query and caches of different head sizes": (
        lambda c: _with(c, query=c.query[..., :-1].contiguous()), ValueError,
        "query's head_dim is the caches' head_dim"),
    "a query with 3 heads over 2 KV heads": (
        lambda c: _with(c, query=c.query[:, :3].contiguous()), ValueError,
        "num_q_heads is a multiple of num_kv_heads"),
    "a block table with one row too few": (
        lambda c: _with(c, block_tables=c.tables[:-1]), ValueError,
        "block_tables is [num_seqs, max_blocks]"),
    "seq_lens with one entry too many": (
        lambda c: _with(c, seq_lens=torch.cat([c.seq_lens, c.seq_lens[:1]])), ValueError,
        "seq_lens is [num_seqs]"),
    "block size 3 (not a power of two)": (
        lambda c: _with(c, k_cache=c.k_cache[:, :3], v_cache=c.v_cache[:, :3]), ValueError,
        "block_size is a power of two (tl.arange needs one)"),
    "a float16 query over float32 caches": (
        lambda c: _with(c, query=c.query.half()), TypeError,
        "query, k_cache and v_cache share one float dtype (float32, float16 or bfloat16)"),
    "float64 tensors": (
        lambda c: _with(c, query=c.query.double(), k_cache=c.k_cache.double(),
                        v_cache=c.v_cache.double()), TypeError,
        "the dtype is float32, float16 or bfloat16"),
    "a float block table": (
        lambda c: _with(c, block_tables=c.tables.float()), TypeError,
        "block_tables and seq_lens are int32 or int64"),
    "seq_lens on another device (meta)": (
        lambda c: _with(c, seq_lens=c.seq_lens.to("meta")), ValueError,
        "every tensor is on one device"),
    "a v_cache with other strides": (
        lambda c: _with(c, v_cache=c.v_cache.transpose(0, 1).contiguous().transpose(0, 1)),
        ValueError, "k_cache and v_cache share their strides (the kernel is given k_cache's)"),
    "caches whose head dimension is not contiguous": (
        lambda c: _with(c, **dict(zip(("k_cache", "v_cache"), _head_dim_strided(c),
                                      strict=True))), ValueError,
        "the caches' head dimension is contiguous (stride(3) == 1): the kernel reads a head's "
        "elements as adjacent"),
    "a block id past the pool": (
        lambda c: _with(c, block_tables=_with_entry(c, c.k_cache.shape[0])), ValueError,
        "every block id a sequence uses names a block of the pool (0 to num_blocks - 1); "
        "past the pool the kernel reads memory that is not the cache"),
    "a block id of -1 inside a sequence": (
        lambda c: _with(c, block_tables=_with_entry(c, -1)), ValueError,
        "the block ids a sequence uses are non-negative"),
    "a length longer than the table covers": (
        lambda c: _with(c, seq_lens=_longer(c)), ValueError,
        "a length is at most max_blocks x block_size (what a table row covers); past it the "
        "kernel reads the next row's entries or beyond the table"),
    "a negative length": (
        lambda c: _with(c, seq_lens=c.seq_lens - c.seq_lens.max() - 1), ValueError,
        "a length is at least 0"),
}
ON_GPU_ONLY = {
    "blocks of 8 in float16 on a GPU": (
        lambda c: _with(c, query=c.query.half(), k_cache=c.k_cache[:, :8].half(),
                        v_cache=c.v_cache[:, :8].half()), ValueError,
        "on a GPU, block_size is at least 16 for 16-bit dtypes (and 8 for float32): tl.dot "
        "reduces P.V over the block's tokens"),
}
# Valid inputs a wrapper must accept and get right (what makes each valid, for the hint).
ACCEPTED: dict[str, tuple[Callable, str]] = {
    "-1 padding past each sequence's blocks": (
        lambda c: _with(c, block_tables=_padded_with(c, -1)),
        "only the entries a sequence uses (its first cdiv(seq_len, block_size)) are block ids; "
        "the rest of a row is padding and never read"),
    "a block table whose entries are 2 apart (stride(1) == 2)": (
        lambda c: _with(c, block_tables=_padded_like(c.tables, 2, 1)),
        "launch and run_split_kv copy a table whose entries are not adjacent"),
    "a transposed block table": (
        lambda c: _with(c, block_tables=c.tables.t().contiguous().t()),
        "launch and run_split_kv copy a table whose entries are not adjacent"),
    "seq_lens with stride 2": (
        lambda c: _with(c, seq_lens=_padded_like(c.seq_lens, 2, 0)),
        "launch and run_split_kv copy non-contiguous lengths"),
    "a query whose heads are 2 apart": (
        lambda c: _with(c, query=_padded_like(c.query, 2, 1)),
        "launch copies a non-contiguous query"),
    "vLLM's kv[:, 0] and kv[:, 1] views of one tensor": (
        lambda c: _with(c, **dict(zip(("k_cache", "v_cache"), _kv_views(c), strict=True))),
        "the kernel is given the caches' block, token and head strides"),
}


def _raises(fn: Callable, case: KernelCase, what: str, table: dict | None = None) -> None:
    build, error, rule = (table or BAD_INPUTS)[what]
    args, options = build(case)
    try:
        with MemoryAudit(), quiet():  # fenced: a wild store fails the check, not the process
            fn(*args, **options)
    except error:
        return
    except NotImplementedError as exc:
        if not str(exc) or "not written" in str(exc):
            raise AssertionError(not_written("paged_attention")) from None
        raise AssertionError(f"paged_attention(...) with {what} raised NotImplementedError: "
                             f"{str(exc)[:200]}; expected {error.__name__}: {rule}.") from exc
    except Exception as exc:
        raise AssertionError(f"paged_attention(...) with {what} raised {type(exc).__name__}: "
                             f"{str(exc)[:200]}; expected {error.__name__}: {rule}.") from exc
    raise AssertionError(f"paged_attention(...) with {what} returned without an error; "
                         f"expected {error.__name__}: {rule}.")


def _accepts(fn: Callable, case: KernelCase, what: str, want: torch.Tensor) -> None:
    build, why = ACCEPTED[what]
    args, options = build(case)
    try:
        with MemoryAudit(), quiet():  # fenced, as above
            out = fn(*args, **options)
    except NotImplementedError as exc:
        if not str(exc) or "not written" in str(exc):
            raise AssertionError(not_written("paged_attention")) from None
        raise AssertionError(f"paged_attention(...) with {what} raised NotImplementedError; "
                             f"that input is valid: {why}.") from exc
    except Exception as exc:
        raise AssertionError(f"paged_attention(...) with {what} raised {type(exc).__name__}: "
                             f"{str(exc)[:200]}; that input is valid: {why}.") from exc
    if not isinstance(out, torch.Tensor) or out.shape != want.shape or \
            not _close(out, want, case.dtype):
        error = ((out.double().cpu() - want.double()).abs().nan_to_num(float("inf")).max()
                 .item() if isinstance(out, torch.Tensor) and out.shape == want.shape else None)
        if error is None:
            raise AssertionError(f"paged_attention(...) with {what} returned the wrong shape; "
                                 f"that input is valid: {why}.")
        raise AssertionError(f"paged_attention(...) with {what} is off by up to {error:.3g}; "
                             f"that input is valid: {why}.")


def _wrapper(fn: Callable, case: KernelCase, want: torch.Tensor, known: dict,
             num_splits: int | None = None) -> None:
    name = "paged_attention"
    options = {} if num_splits is None else {"num_splits": num_splits}
    with MemoryAudit() as audit, quiet():
        out = learner_call(name, fn, *case.arguments(), **options)
    where = name + (f"(..., num_splits={num_splits})" if num_splits else "(...)")
    if case.dtype == torch.bfloat16 and not on_gpu() and isinstance(out, torch.Tensor) \
            and not _close(out, want, case.dtype):
        raise AssertionError(f"{where} on {case.describe()} is wrong: the interpreter has no "
                             "bf16 arithmetic, so bf16 inputs are computed in float32 there "
                             "and the output cast back.")
    _compare(out, case, name, want, known, call=where)
    if num_splits and num_splits > 1 and audit.active:
        grids = [g for g in audit.grids if g[2] == num_splits]
        if not grids:
            raise AssertionError(
                f"{where} on {case.describe()} returned the right values without launching "
                f"any grid of num_splits = {num_splits} programs per (sequence, KV head): "
                "num_splits > 1 asks for the split-KV path (split_kv_kernel's partials, then "
                "merge_splits_kernel).")


VISIBLE_BAD = ("a float16 query over float32 caches", "seq_lens as a list", "num_splits=0",
               "caches whose head dimension is not contiguous", "a block id past the pool",
               "a length longer than the table covers")


@visible
def check_paged_attention(fn: Callable) -> None:
    """Lengths 5, 9, 8 and 0 in blocks of 4, 6 query heads over 2, head size 24: in one pass,
    and with num_splits=3 (the split-KV path); -1 padding in the block table; then six bad
    inputs it must refuse."""
    case = device_case([5, 9, 8, 0], 4, 6, 2, head_dim=24)
    want, known = asked(case)
    _wrapper(fn, case, want, known)
    _wrapper(fn, case, want, known, num_splits=3)
    _accepts(fn, case, "-1 padding past each sequence's blocks", want)
    for what in VISIBLE_BAD:
        _raises(fn, case, what)
