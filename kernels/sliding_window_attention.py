"""Paged decode attention for a sliding-window layer, in PyTorch and in Triton.

A sliding-window layer's query at position ``p`` sees only the keys of positions
``p - window + 1`` to ``p``. The decode query of a sequence of ``seq_len`` tokens is its last
token, so it sees positions ``max(0, seq_len - window)`` to ``seq_len - 1``. A hybrid cache
(``course.hybrid_manager``) has put the null block in the table slots before that, so the
kernel's block loop starts at the window's first block, and never reads a null slot::

    seq_len = 14, window = 6, block_size = 4: the query (position 13) sees 8..13

    block_tables[seq]   [ 0 | 0 | 7 | 2 ]      0: the null block, never read
    loop                          ^-- starts at block 8 // 4 = 2
    valid slots                  8..11, 12..13 (14, 15 masked)

Otherwise this is chapter 7's program (one per sequence and KV head, the query heads of a
group together, an online softmax over the blocks). Import after ``course.setup()``.

The kernel's answer is its body between ``### BEGIN SOLUTION`` and ``### END SOLUTION``:
chapter 10's notebook renders its cell from it, and a learner edition replaces it with a stub.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from kernels.paged_attention import launch, validate_inputs

__all__ = ["check_window", "sliding_window_attention", "sliding_window_kernel",
           "sliding_window_reference"]


@triton.jit
def sliding_window_kernel(
    out_ptr, query_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, scale,
    window,
    stride_q_seq, stride_q_head,                       # query and out [seqs, q_heads, dim]
    stride_kv_block, stride_kv_token, stride_kv_head,  # caches [blocks, block, kv_heads, dim]
    stride_table_seq,                                  # block_tables [seqs, max_blocks]
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr,
):
    """Decode attention of sequence ``tl.program_id(0)``'s query heads that share KV head
    ``tl.program_id(1)`` (rows ``kv_head * GROUP`` on, padded to ``GROUP_PAD``; the head
    padded to ``HEAD_PAD``, masked), over the last ``window`` of its ``seq_len`` tokens:
    positions ``first = max(seq_len - window, 0)`` to ``seq_len - 1``. The block loop starts at
    the window's first block, ``first // BLOCK_SIZE``: the table entries before it (the null
    block) are never read, and a position before ``first`` in that block is masked out. An
    online softmax over the blocks, in fp32, as chapter 7's; a sequence of length 0 gets
    zeros; only the ``GROUP`` real rows are stored."""
    ### BEGIN SOLUTION
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    rows = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + rows
    real = rows < GROUP
    tokens = tl.arange(0, BLOCK_SIZE)
    dims = tl.arange(0, HEAD_PAD)
    in_head = dims < HEAD_DIM

    q_offsets = seq * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :]
    q_mask = real[:, None] & in_head[None, :]
    q = tl.load(query_ptr + q_offsets, mask=q_mask, other=0.0)
    seq_len = tl.load(seq_lens_ptr + seq)
    first = tl.maximum(seq_len - window, 0)  # the first position the query sees

    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    total = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_PAD], tl.float32)
    for index in range(first // BLOCK_SIZE, tl.cdiv(seq_len, BLOCK_SIZE)):
        block = tl.load(block_tables_ptr + seq * stride_table_seq + index).to(tl.int64)
        positions = index * BLOCK_SIZE + tokens
        valid = (positions >= first) & (positions < seq_len)
        kv_offsets = (block * stride_kv_block + tokens[:, None] * stride_kv_token
                      + kv_head * stride_kv_head + dims[None, :])
        kv_mask = valid[:, None] & in_head[None, :]
        k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)

        scores = tl.dot(q, tl.trans(k)) * scale
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        rescale = tl.exp(m - m_new)
        weights = tl.exp(scores - m_new[:, None])
        total = total * rescale + tl.sum(weights, axis=1)
        acc = acc * rescale[:, None] + tl.dot(weights.to(v.dtype), v)
        m = m_new

    out = acc / tl.where(total > 0, total, 1.0)[:, None]
    tl.store(out_ptr + q_offsets, out.to(out_ptr.dtype.element_ty), mask=q_mask)
    ### END SOLUTION


def check_window(window: int) -> None:
    """Refuse a window that is not an int (``TypeError``) or under one token (``ValueError``)."""
    if isinstance(window, bool) or not isinstance(window, int):
        raise TypeError(f"window must be an int, got {type(window).__name__}")
    if window < 1:
        raise ValueError(f"window must be at least 1 (the query sees itself), got {window}")


def sliding_window_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                             block_tables: torch.Tensor, seq_lens: torch.Tensor, window: int,
                             scale: float, kernel: Callable | None = None) -> torch.Tensor:
    """Decode attention over the last ``window`` tokens of each sequence of a paged cache
    (shapes and rules as chapter 7's ``validate_inputs``, and ``window`` an int >= 1), in the
    query's dtype, by ``kernel`` (``sliding_window_kernel`` unless given); a sequence of length
    0 gets zeros. Table slots before the window's first block are never read: they hold the
    null block (or any block of the pool)."""
    check_window(window)
    validate_inputs(query, k_cache, v_cache, block_tables, seq_lens, scale)
    if query.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1":
        # the interpreter has no bf16 arithmetic: compute in fp32, return bf16
        return sliding_window_attention(query.float(), k_cache.float(), v_cache.float(),
                                        block_tables, seq_lens, window, scale, kernel
                                        ).to(torch.bfloat16)
    return launch(kernel or sliding_window_kernel, query, k_cache, v_cache, block_tables,
                  seq_lens, scale, window)


def sliding_window_reference(query: torch.Tensor, k_cache: torch.Tensor,
                             v_cache: torch.Tensor, block_tables: torch.Tensor,
                             seq_lens: torch.Tensor, window: int, scale: float
                             ) -> torch.Tensor:
    """The same in PyTorch: each sequence's decode is a variable-length batch's query of one
    token (``kernels.sliding_window_varlen``'s reference); a sequence of length 0 gets zeros."""
    from kernels.sliding_window_varlen import window_varlen_reference

    check_window(window)
    out = torch.zeros_like(query)
    live = (seq_lens > 0).nonzero().flatten().to(query.device)
    if len(live):
        one_each = torch.arange(len(live) + 1, dtype=torch.int32, device=query.device)
        out[live] = window_varlen_reference(query[live], k_cache, v_cache, one_each,
                                            seq_lens.to(query.device)[live],
                                            block_tables.to(query.device)[live], window, scale)
    return out
