"""Chapter 7's kernel, built in steps: each one adds a single idea to the one before.

1. ``one_block_kernel``: one program per (sequence, query head); the sequence is exactly one
   block long, so a plain softmax over that block's keys suffices. The head dimension is
   padded to ``HEAD_PAD`` (a power of two) and masked, so any head size works.
2. ``block_loop_kernel``: sequences of whole blocks; walk the block table with an online
   softmax (running max m, sum l, accumulator acc).
3. ``gqa_kernel``: one program per (sequence, KV head) loads the KV block once for all the
   query heads that share it (rows padded to ``GROUP_PAD``, a power of two) and multiplies
   with ``tl.dot``.
4. ``kernels.paged_attention.paged_attention_kernel``: any length, the tail masked.

All take the arguments that ``kernels.paged_attention.launch`` passes.

Answers are the bodies between ``### BEGIN SOLUTION`` and ``### END SOLUTION``: chapter 7's
notebook renders its cells from them, and a learner edition replaces them with stubs.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.interpreter import lighten

lighten()  # under the interpreter: see kernels.interpreter


@triton.jit
def one_block_kernel(
    out_ptr, query_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, scale,
    stride_q_seq, stride_q_head, stride_kv_block, stride_kv_token, stride_kv_head,
    stride_table_seq,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr,
):
    """Program (seq, head): attention of one query head over a sequence of exactly
    BLOCK_SIZE tokens, all in the block at block_tables[seq, 0]. Tiles span HEAD_PAD columns;
    only the first HEAD_DIM are loaded and stored."""
    ### BEGIN SOLUTION
    seq = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    tokens = tl.arange(0, BLOCK_SIZE)
    dims = tl.arange(0, HEAD_PAD)
    in_head = dims < HEAD_DIM  # the padding columns are never read or written

    q_offsets = seq * stride_q_seq + head * stride_q_head + dims
    q = tl.load(query_ptr + q_offsets, mask=in_head, other=0.0).to(tl.float32)  # [HEAD_PAD]
    block = tl.load(block_tables_ptr + seq * stride_table_seq).to(tl.int64)
    kv_offsets = (block * stride_kv_block + tokens[:, None] * stride_kv_token
                  + kv_head * stride_kv_head + dims[None, :])
    k = tl.load(k_cache_ptr + kv_offsets, mask=in_head[None, :], other=0.0).to(tl.float32)
    v = tl.load(v_cache_ptr + kv_offsets, mask=in_head[None, :], other=0.0).to(tl.float32)

    scores = tl.sum(q[None, :] * k, axis=1) * scale  # [BLOCK_SIZE]
    weights = tl.exp(scores - tl.max(scores, axis=0))
    out = tl.sum(weights[:, None] * v, axis=0) / tl.sum(weights, axis=0)
    tl.store(out_ptr + q_offsets, out.to(out_ptr.dtype.element_ty), mask=in_head)
    ### END SOLUTION


@triton.jit
def block_loop_kernel(
    out_ptr, query_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, scale,
    stride_q_seq, stride_q_head, stride_kv_block, stride_kv_token, stride_kv_head,
    stride_table_seq,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr,
):
    """Program (seq, head): one query head over a sequence of seq_len tokens, a multiple of
    BLOCK_SIZE, block by block through its block table with an online softmax."""
    ### BEGIN SOLUTION
    seq = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    tokens = tl.arange(0, BLOCK_SIZE)
    dims = tl.arange(0, HEAD_PAD)
    in_head = dims < HEAD_DIM

    q_offsets = seq * stride_q_seq + head * stride_q_head + dims
    q = tl.load(query_ptr + q_offsets, mask=in_head, other=0.0).to(tl.float32)
    seq_len = tl.load(seq_lens_ptr + seq)

    m = float("-inf")  # running max of the scores
    total = 0.0  # running sum of exp(score - m)
    acc = tl.zeros([HEAD_PAD], tl.float32)  # running sum of exp(score - m) x value
    for index in range(0, seq_len // BLOCK_SIZE):
        block = tl.load(block_tables_ptr + seq * stride_table_seq + index).to(tl.int64)
        kv_offsets = (block * stride_kv_block + tokens[:, None] * stride_kv_token
                      + kv_head * stride_kv_head + dims[None, :])
        k = tl.load(k_cache_ptr + kv_offsets, mask=in_head[None, :], other=0.0).to(tl.float32)
        v = tl.load(v_cache_ptr + kv_offsets, mask=in_head[None, :], other=0.0).to(tl.float32)

        scores = tl.sum(q[None, :] * k, axis=1) * scale
        m_new = tl.maximum(m, tl.max(scores, axis=0))
        rescale = tl.exp(m - m_new)
        weights = tl.exp(scores - m_new)
        total = total * rescale + tl.sum(weights, axis=0)
        acc = acc * rescale + tl.sum(weights[:, None] * v, axis=0)
        m = m_new

    tl.store(out_ptr + q_offsets, (acc / total).to(out_ptr.dtype.element_ty), mask=in_head)
    ### END SOLUTION


@triton.jit
def gqa_kernel(
    out_ptr, query_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, scale,
    stride_q_seq, stride_q_head, stride_kv_block, stride_kv_token, stride_kv_head,
    stride_table_seq,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr,
):
    """Program (seq, kv_head): the GROUP query heads that share one KV head (rows padded to
    GROUP_PAD, never stored), over a sequence whose length is a multiple of BLOCK_SIZE;
    scores and outputs with ``tl.dot``."""
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
    q = tl.load(query_ptr + q_offsets, mask=q_mask, other=0.0)  # [GROUP_PAD, HEAD_PAD]
    seq_len = tl.load(seq_lens_ptr + seq)

    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    total = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_PAD], tl.float32)
    for index in range(0, seq_len // BLOCK_SIZE):
        block = tl.load(block_tables_ptr + seq * stride_table_seq + index).to(tl.int64)
        kv_offsets = (block * stride_kv_block + tokens[:, None] * stride_kv_token
                      + kv_head * stride_kv_head + dims[None, :])
        k = tl.load(k_cache_ptr + kv_offsets, mask=in_head[None, :], other=0.0)  # cache dtype
        v = tl.load(v_cache_ptr + kv_offsets, mask=in_head[None, :], other=0.0)

        scores = tl.dot(q, tl.trans(k)) * scale  # [GROUP_PAD, BLOCK_SIZE], fp32
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        rescale = tl.exp(m - m_new)
        weights = tl.exp(scores - m_new[:, None])
        total = total * rescale + tl.sum(weights, axis=1)
        acc = acc * rescale[:, None] + tl.dot(weights.to(v.dtype), v)
        m = m_new

    out = acc / total[:, None]
    tl.store(out_ptr + q_offsets, out.to(out_ptr.dtype.element_ty), mask=q_mask)
    ### END SOLUTION
