"""Chapter 7: paged decode attention in Triton, and its host wrapper.

One program per (sequence, KV head). It loads the query heads that share that KV head, walks
the sequence's blocks through its block table, and keeps an online softmax (chapter 6's
``blockwise_decode_attention``, fused into one kernel)::

    block_tables[seq]   [ 7 | 2 | 9 | . ]          seq_len = 37, block_size = 16
                          |   |   |
    k_cache / v_cache   block 7: tokens  0..15
                        block 2: tokens 16..31
                        block 9: tokens 32..36, then 11 slots of garbage (masked)

    program (seq, kv_head):  q [GROUP_PAD, HEAD_PAD]   the group's query heads, zero-padded
        for each block:      K, V [BLOCK_SIZE, HEAD_PAD]   one KV head's slice of the block
                             scores = q @ K^T   [GROUP_PAD, BLOCK_SIZE]   (tl.dot)
                             rescale (m, l, acc) to the new running max, add this block
        out = acc / l        (a sequence of length 0: zeros)

``tl.arange`` needs a power of two, so the group is padded to ``GROUP_PAD`` rows and the head
dimension to ``HEAD_PAD`` columns (at least 16: ``tl.dot`` reduces over it, and NVIDIA GPUs
need K >= 16 for 16-bit inputs); padding rows and columns are masked, never stored. A head
size of 80 runs in a 128-column tile. Pool offsets are computed in int64: a pool of a few GiB
has more than 2^31 elements, and an int32 offset would wrap.

Answers are the bodies between ``### BEGIN SOLUTION`` and ``### END SOLUTION``: chapter 7's
notebook renders its cells from them, and a learner edition replaces them with stubs.
Import after ``course.setup()``.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels.split_kv import (
    choose_num_splits,
    head_pad,
    merge_splits_kernel,
    run_on_grid,
    run_split_kv,
    split_kv_kernel,
    table_layout,
)

__all__ = ["interpreted", "launch", "merge_splits_kernel", "paged_attention",
           "paged_attention_kernel", "split_kv_kernel", "validate_inputs"]


@triton.jit
def paged_attention_kernel(
    out_ptr, query_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, scale,
    stride_q_seq, stride_q_head,                       # query and out [seqs, q_heads, dim]
    stride_kv_block, stride_kv_token, stride_kv_head,  # caches [blocks, block, kv_heads, dim]
    stride_table_seq,                                  # block_tables [seqs, max_blocks]
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr,
):
    """Decode attention of one sequence's query heads that share one KV head, over any
    seq_len >= 0: the last block is masked past the sequence's end, table entries past the
    sequence's blocks are never read, and a sequence of length 0 gets zeros."""
    ### BEGIN SOLUTION
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    rows = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + rows  # consecutive query heads share a KV head
    real = rows < GROUP
    tokens = tl.arange(0, BLOCK_SIZE)
    dims = tl.arange(0, HEAD_PAD)
    in_head = dims < HEAD_DIM

    q_offsets = seq * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :]
    q_mask = real[:, None] & in_head[None, :]
    q = tl.load(query_ptr + q_offsets, mask=q_mask, other=0.0)
    seq_len = tl.load(seq_lens_ptr + seq)

    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    total = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_PAD], tl.float32)
    for index in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):
        block = tl.load(block_tables_ptr + seq * stride_table_seq + index).to(tl.int64)
        valid = index * BLOCK_SIZE + tokens < seq_len
        kv_offsets = (block * stride_kv_block + tokens[:, None] * stride_kv_token
                      + kv_head * stride_kv_head + dims[None, :])
        # masked loads: slots past the end hold garbage (NaN x 0 would still be NaN)
        kv_mask = valid[:, None] & in_head[None, :]
        k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)

        scores = tl.dot(q, tl.trans(k)) * scale
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        rescale = tl.exp(m - m_new)  # what the old max's exponentials are worth now
        weights = tl.exp(scores - m_new[:, None])
        total = total * rescale + tl.sum(weights, axis=1)
        acc = acc * rescale[:, None] + tl.dot(weights.to(v.dtype), v)
        m = m_new

    # total >= 1 wherever a token was seen; a sequence of length 0 has acc = 0: zeros
    out = acc / tl.where(total > 0, total, 1.0)[:, None]
    tl.store(out_ptr + q_offsets, out.to(out_ptr.dtype.element_ty), mask=q_mask)
    ### END SOLUTION


def launch(kernel, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float, *after_scale: int,
           per_query_head: bool = False) -> torch.Tensor:
    """Run a chapter-7 decode kernel on a grid of (num_seqs, num_kv_heads) programs, or
    (num_seqs, num_q_heads) with ``per_query_head``, and return its output (a new tensor
    shaped and typed like ``query``).

    Every kernel of the chapter takes the same arguments: output and input pointers, the
    scale (then ``after_scale``: a sliding window's size), the strides (in elements) of query,
    caches and block tables, then the constants
    GROUP (query heads per KV head), GROUP_PAD (GROUP rounded up to a power of two),
    BLOCK_SIZE, HEAD_DIM and HEAD_PAD (HEAD_DIM rounded up to a power of two, at least 16).
    ``k_cache`` and ``v_cache`` must have the same strides, the head dimension contiguous.
    A query of any strides is copied to a contiguous one (out shares its strides); a block
    table whose entries within a row are not adjacent, and non-contiguous ``seq_lens``, are
    copied too (the kernel is given only a table's row stride).
    """
    query = query.contiguous()
    block_tables, seq_lens = table_layout(block_tables, seq_lens)
    num_seqs, num_q_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    out = torch.empty_like(query)
    grid = (num_seqs, num_q_heads if per_query_head else num_kv_heads)
    run_on_grid(
        kernel, grid,
        out, query, k_cache, v_cache, block_tables, seq_lens, scale, *after_scale,
        query.stride(0), query.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        GROUP=group, GROUP_PAD=triton.next_power_of_2(group), BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim, HEAD_PAD=head_pad(head_dim),
    )
    return out


def interpreted() -> bool:
    """Whether Triton runs kernels on its CPU interpreter (``TRITON_INTERPRET=1``, set by
    ``course.setup()`` where there is no GPU) rather than compiling them for a GPU."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def validate_inputs(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                    num_splits: int | None = None) -> None:
    """Refuse what the kernels cannot run correctly, in this order, with a message that
    names the argument, what it is and the rule:

    1. types (``TypeError``), before any attribute is read: the five tensors are
       ``torch.Tensor``; ``scale`` a real number (not a bool); ``num_splits`` None or an int.
       Then ``num_splits >= 1`` (``ValueError``).
    2. shapes (``ValueError``): query [num_seqs, num_q_heads, head_dim]; k_cache and v_cache
       one shape [num_blocks, block_size, num_kv_heads, head_dim] with the query's head_dim;
       every size >= 1 except num_seqs and num_blocks; num_q_heads a multiple of
       num_kv_heads; block_tables [num_seqs, max_blocks]; seq_lens [num_seqs]; block_size a
       power of two (head_dim may be any size).
    3. dtypes (``TypeError``): query float32, float16 or bfloat16; caches the query's dtype;
       block_tables and seq_lens int32 or int64.
    4. devices (``ValueError``): all on one device; compiled (not on the interpreter), CUDA,
       and block_size at least 16 for 16-bit dtypes and 8 for float32 (``tl.dot``'s K).
    5. layout (``ValueError``): k_cache and v_cache share strides and have stride(3) == 1.
    6. values (``ValueError``): every length in [0, max_blocks x block_size] (what a table
       row covers); the block ids a sequence uses (its first cdiv(seq_len, block_size)
       entries) in [0, num_blocks). Entries past them are never read and may hold anything.
    """
    ### BEGIN SOLUTION
    tensors = {"query": query, "k_cache": k_cache, "v_cache": v_cache,
               "block_tables": block_tables, "seq_lens": seq_lens}
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if isinstance(scale, bool) or not isinstance(scale, int | float):
        raise TypeError(f"scale must be a real number, got {type(scale).__name__}")
    if num_splits is not None:
        if isinstance(num_splits, bool) or not isinstance(num_splits, int):
            raise TypeError(f"num_splits must be an int or None, got "
                            f"{type(num_splits).__name__}")
        if num_splits < 1:
            raise ValueError(f"num_splits must be >= 1 (or None to choose), got {num_splits}")

    if query.dim() != 3:
        raise ValueError(f"query must be [num_seqs, num_q_heads, head_dim], got shape "
                         f"{tuple(query.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must both be [num_blocks, block_size, "
                         f"num_kv_heads, head_dim], got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    num_seqs, num_q_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    if cache_head_dim != head_dim:
        raise ValueError(f"query has head_dim {head_dim} but the caches {cache_head_dim}")
    for name, size in (("num_q_heads", num_q_heads), ("num_kv_heads", num_kv_heads),
                       ("head_dim", head_dim), ("block_size", block_size)):
        if size < 1:
            raise ValueError(f"{name} must be at least 1, got {size}")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads "
                         f"({num_kv_heads}) for grouped-query attention")
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables must be [num_seqs={num_seqs}, max_blocks], got "
                         f"{tuple(block_tables.shape)}")
    if tuple(seq_lens.shape) != (num_seqs,):
        raise ValueError(f"seq_lens must be [num_seqs={num_seqs}], got {tuple(seq_lens.shape)}")
    if block_size & (block_size - 1):  # tl.arange needs a power of two
        raise ValueError(f"block_size must be a power of two, got {block_size}")

    if query.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"query must be float32, float16 or bfloat16, got {query.dtype}")
    if k_cache.dtype != query.dtype or v_cache.dtype != query.dtype:
        raise TypeError(f"query, k_cache and v_cache must share one dtype, got {query.dtype}, "
                        f"{k_cache.dtype} and {v_cache.dtype}")
    for name, tensor in (("block_tables", block_tables), ("seq_lens", seq_lens)):
        if tensor.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be int32 or int64, got {tensor.dtype}")

    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        where = ", ".join(f"{name} on {t.device}" for name, t in tensors.items())
        raise ValueError(f"query, k_cache, v_cache, block_tables and seq_lens must be on one "
                         f"device, got {where}")
    if os.environ.get("TRITON_INTERPRET") != "1":  # compiled for a GPU
        if query.device.type != "cuda":
            raise ValueError(f"compiled Triton kernels need CUDA tensors, got {query.device}; "
                             "without a GPU, run course.setup() before importing kernels")
        least = 8 if query.dtype == torch.float32 else 16
        if block_size < least:  # P.V reduces over the block's tokens
            raise ValueError(f"block_size must be at least {least} for {query.dtype} on a GPU "
                             f"(tl.dot's K), got {block_size}")

    if k_cache.stride() != v_cache.stride() or k_cache.stride(3) != 1:
        raise ValueError(f"k_cache and v_cache must share strides with head_dim contiguous "
                         f"(stride(3) == 1), got {k_cache.stride()} and {v_cache.stride()}")

    lengths = seq_lens.long()
    covered = block_tables.shape[1] * block_size
    outside = (lengths < 0) | (lengths > covered)
    if outside.any():
        seq = int(outside.nonzero()[0, 0])
        raise ValueError(f"seq_lens[{seq}] = {int(lengths[seq])} is outside [0, {covered}]: a "
                         f"row of block_tables holds {block_tables.shape[1]} blocks of "
                         f"{block_size} tokens")
    entries = torch.arange(block_tables.shape[1], device=lengths.device)
    used = entries[None, :] < ((lengths + block_size - 1) // block_size)[:, None]
    tables = block_tables.long()
    unknown = used & ((tables < 0) | (tables >= num_blocks))
    if unknown.any():
        seq, index = (int(i) for i in unknown.nonzero()[0])
        raise ValueError(f"block_tables[{seq}, {index}] = {int(tables[seq, index])} is not a "
                         f"block of the pool (0 to {num_blocks - 1}), and sequence {seq} (length "
                         f"{int(lengths[seq])}) uses it")
    ### END SOLUTION


def paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                    num_splits: int | None = None, *, validate: bool = True) -> torch.Tensor:
    """Decode attention over a paged KV cache (shapes as in chapter 6), in the query's dtype;
    a sequence of length 0 gets zeros.

    ``validate=False`` skips ``validate_inputs`` (a serving engine that builds the inputs
    itself, or a benchmark). Validation costs little arithmetic but, on a GPU, its checks of
    lengths and block ids copy a boolean back to the CPU: one synchronisation per call, which
    stalls the CPU until the queued GPU work is done.

    ``num_splits`` > 1 splits each sequence's blocks across that many programs per KV head
    and merges their partials (flash-decoding, ``run_split_kv``);
    ``None`` lets ``choose_num_splits`` decide from the GPU's multiprocessor count (always 1
    on the interpreter); 1 launches ``paged_attention_kernel``.
    """
    ### BEGIN SOLUTION
    if validate:
        validate_inputs(query, k_cache, v_cache, block_tables, seq_lens, scale, num_splits)
    if query.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1":
        # the interpreter has no bf16 arithmetic: compute in fp32, return bf16
        return paged_attention(query.float(), k_cache.float(), v_cache.float(), block_tables,
                               seq_lens, scale, num_splits, validate=False).to(torch.bfloat16)
    if num_splits is None:
        num_splits = choose_num_splits(query.shape[0], k_cache.shape[2], block_tables.shape[1],
                                       query.device)
    if num_splits == 1:
        return launch(paged_attention_kernel, query, k_cache, v_cache, block_tables, seq_lens,
                      scale)
    return run_split_kv(split_kv_kernel, merge_splits_kernel, query, k_cache, v_cache,
                        block_tables, seq_lens, scale, int(num_splits))
    ### END SOLUTION
