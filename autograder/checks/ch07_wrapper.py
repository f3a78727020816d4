"""Chapter 7's host wrapper, ``paged_attention``: the valid inputs it must accept and get
right, the bad ones it must refuse with the right error, and its split-KV path.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from autograder.checks._helpers import learner_call, not_written
from autograder.checks._memory_audit import MemoryAudit
from autograder.checks.ch07_audit import quiet
from autograder.checks.ch07_cases import asked, close, compare, device_case
from autograder.private import visible
from course.notebook.paged_cases import KernelCase, on_gpu


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
            not close(out, want, case.dtype):
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
            and not close(out, want, case.dtype):
        raise AssertionError(f"{where} on {case.describe()} is wrong: the interpreter has no "
                             "bf16 arithmetic, so bf16 inputs are computed in float32 there "
                             "and the output cast back.")
    compare(out, case, name, want, known, call=where)
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
