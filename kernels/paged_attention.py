"""Chapter 7: paged decode attention in Triton, and its host wrapper.

One program per (sequence, KV head). It loads the query heads that share that KV head, walks
the sequence's blocks through its block table, and keeps an online softmax (chapter 6's
``blockwise_decode_attention``, fused into one kernel)::

    block_tables[seq]   [ 7 | 2 | 9 | . ]          seq_len = 37, block_size = 16
                          |   |   |
    k_cache / v_cache   block 7: tokens  0..15
                        block 2: tokens 16..31
                        block 9: tokens 32..36, then 11 slots of garbage (masked)

    program (seq, kv_head):  q [GROUP_PAD, HEAD_DIM]   the group's query heads, zero-padded
        for each block:      K, V [BLOCK_SIZE, HEAD_DIM]   one KV head's slice of the block
                             scores = q @ K^T   [GROUP_PAD, BLOCK_SIZE]   (tl.dot)
                             rescale (m, l, acc) to the new running max, add this block
        out = acc / l

The group is padded to 16 rows because NVIDIA's ``tl.dot`` needs at least 16 along every
dimension; the padding rows are zero and never stored. Pool offsets are computed in int64: a
pool of a few GiB has more than 2^31 elements, and an int32 offset would wrap.

Answers are the bodies between ``### BEGIN SOLUTION`` and ``### END SOLUTION``: chapter 7's
notebook renders its cells from them, and the learner edition replaces them with stubs
(``autograder/render.py``, ``autograder/edition.py``).
Import after ``course.setup()``.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels.split_kv import (
    choose_num_splits,
    merge_splits_kernel,
    run_on_grid,
    run_split_kv,
    split_kv_kernel,
)

__all__ = ["launch", "merge_splits_kernel", "paged_attention", "paged_attention_kernel",
           "split_kv_kernel", "validate_inputs"]


@triton.jit
def paged_attention_kernel(
    out_ptr, query_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, scale,
    stride_q_seq, stride_q_head,                       # query and out [seqs, q_heads, dim]
    stride_kv_block, stride_kv_token, stride_kv_head,  # caches [blocks, block, kv_heads, dim]
    stride_table_seq,                                  # block_tables [seqs, max_blocks]
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """Decode attention of one sequence's query heads that share one KV head, over any
    seq_len >= 1: the last block is masked past the sequence's end."""
    ### BEGIN SOLUTION
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    rows = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + rows  # consecutive query heads share a KV head
    real = rows < GROUP
    tokens = tl.arange(0, BLOCK_SIZE)
    dims = tl.arange(0, HEAD_DIM)

    q_offsets = seq * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :]
    q = tl.load(query_ptr + q_offsets, mask=real[:, None], other=0.0)
    seq_len = tl.load(seq_lens_ptr + seq)

    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    total = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for index in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):
        block = tl.load(block_tables_ptr + seq * stride_table_seq + index).to(tl.int64)
        valid = index * BLOCK_SIZE + tokens < seq_len
        kv_offsets = (block * stride_kv_block + tokens[:, None] * stride_kv_token
                      + kv_head * stride_kv_head + dims[None, :])
        # masked loads: slots past the end hold garbage (NaN x 0 would still be NaN)
        k = tl.load(k_cache_ptr + kv_offsets, mask=valid[:, None], other=0.0)
        v = tl.load(v_cache_ptr + kv_offsets, mask=valid[:, None], other=0.0)

        scores = tl.dot(q, tl.trans(k)) * scale
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        rescale = tl.exp(m - m_new)  # what the old max's exponentials are worth now
        weights = tl.exp(scores - m_new[:, None])
        total = total * rescale + tl.sum(weights, axis=1)
        acc = acc * rescale[:, None] + tl.dot(weights.to(v.dtype), v)
        m = m_new

    out = acc / total[:, None]
    tl.store(out_ptr + q_offsets, out.to(out_ptr.dtype.element_ty), mask=real[:, None])
    ### END SOLUTION


def launch(kernel, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float, *,
           per_query_head: bool = False) -> torch.Tensor:
    """Run a chapter-7 decode kernel on a grid of (num_seqs, num_kv_heads) programs, or
    (num_seqs, num_q_heads) with ``per_query_head``, and return its output.

    Every kernel of the chapter takes the same arguments: output and input pointers, the
    scale, the strides (in elements) of query, caches and block tables, then the constants
    GROUP (query heads per KV head), GROUP_PAD (GROUP padded to a power of two >= 16),
    BLOCK_SIZE and HEAD_DIM. ``k_cache`` and ``v_cache`` must have the same strides.
    """
    query = query.contiguous()  # out is allocated like it, so both share its strides
    num_seqs, num_q_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    out = torch.empty_like(query)
    grid = (num_seqs, num_q_heads if per_query_head else num_kv_heads)
    run_on_grid(
        kernel, grid,
        out, query, k_cache, v_cache, block_tables, seq_lens, scale,
        query.stride(0), query.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)),
        BLOCK_SIZE=block_size, HEAD_DIM=head_dim,
    )
    return out


def validate_inputs(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, seq_lens: torch.Tensor) -> None:
    """Raise ``ValueError`` (shapes, devices, layout) or ``TypeError`` (dtypes) with a message
    that names the argument, what it is and what the kernel needs."""
    ### BEGIN SOLUTION
    if query.dim() != 3:
        raise ValueError(f"query must be [num_seqs, num_q_heads, head_dim], got shape "
                         f"{tuple(query.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must both be [num_blocks, block_size, "
                         f"num_kv_heads, head_dim], got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    num_seqs, num_q_heads, head_dim = query.shape
    _, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    if cache_head_dim != head_dim:
        raise ValueError(f"query has head_dim {head_dim} but the caches {cache_head_dim}")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads "
                         f"({num_kv_heads}) for grouped-query attention")
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables must be [num_seqs={num_seqs}, max_blocks], got "
                         f"{tuple(block_tables.shape)}")
    if tuple(seq_lens.shape) != (num_seqs,):
        raise ValueError(f"seq_lens must be [num_seqs={num_seqs}], got {tuple(seq_lens.shape)}")
    for name, size in (("head_dim", head_dim), ("block_size", block_size)):
        if size & (size - 1):  # tl.arange needs a power of two
            raise ValueError(f"{name} must be a power of two, got {size}")
    if query.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"query must be float32, float16 or bfloat16, got {query.dtype}")
    if k_cache.dtype != query.dtype or v_cache.dtype != query.dtype:
        raise TypeError(f"query, k_cache and v_cache must share one dtype, got {query.dtype}, "
                        f"{k_cache.dtype} and {v_cache.dtype}")
    for name, tensor in (("block_tables", block_tables), ("seq_lens", seq_lens)):
        if tensor.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be int32 or int64, got {tensor.dtype}")
    devices = {t.device for t in (query, k_cache, v_cache, block_tables, seq_lens)}
    if len(devices) > 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    if os.environ.get("TRITON_INTERPRET") != "1":
        if query.device.type != "cuda":
            raise ValueError(f"compiled Triton kernels need CUDA tensors, got {query.device}; "
                             "without a GPU, run course.setup() before importing kernels")
        if block_size < 16 or head_dim < 16:
            raise ValueError(f"tl.dot on NVIDIA GPUs needs block_size and head_dim >= 16, got "
                             f"{block_size} and {head_dim}")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(3) != 1:
        raise ValueError(f"k_cache and v_cache must share strides with head_dim contiguous, "
                         f"got {k_cache.stride()} and {v_cache.stride()}")
    ### END SOLUTION


def paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                    num_splits: int | None = None) -> torch.Tensor:
    """Decode attention over a paged KV cache (shapes as in chapter 6), in the query's dtype.

    ``num_splits`` > 1 splits each sequence's blocks across that many programs per KV head
    and merges their partials (flash-decoding); ``None`` lets ``choose_num_splits`` decide
    from the GPU's multiprocessor count (always 1 on the interpreter).
    """
    ### BEGIN SOLUTION
    validate_inputs(query, k_cache, v_cache, block_tables, seq_lens)
    if query.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1":
        # the interpreter has no bf16 arithmetic: compute in fp32, return bf16
        return paged_attention(query.float(), k_cache.float(), v_cache.float(), block_tables,
                               seq_lens, scale, num_splits).to(torch.bfloat16)
    if num_splits is None:
        num_splits = choose_num_splits(query.shape[0], k_cache.shape[2], block_tables.shape[1],
                                       query.device)
    if num_splits == 1:
        return launch(paged_attention_kernel, query, k_cache, v_cache, block_tables, seq_lens,
                      scale)
    return run_split_kv(split_kv_kernel, merge_splits_kernel, query, k_cache, v_cache,
                        block_tables, seq_lens, scale, num_splits)
    ### END SOLUTION
