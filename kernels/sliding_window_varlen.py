"""Chapter 9's variable-length paged attention for a sliding-window layer: prefill chunks and
decodes in one batch, each query token seeing only the last ``window`` keys up to its own
position, in PyTorch and in Triton.

    request r: seq_len = 10, q_len = 4 (6 cached, 4 new), window 3, blocks of 4
    query j=0 at position 6 sees 4..6     blocks 1
    query j=3 at position 9 sees 7..9     blocks 1, 2
    block 0 is the null block: no query of the chunk sees it (the first sees from 4)

A hybrid cache (``course.hybrid_manager``) has given back the blocks the chunk's first query
no longer sees, so each program's block loop starts at its own window's first block. Layout
and arguments as ``kernels.varlen_attention``, with the window after the scale. Import after
``course.setup()``.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels.sliding_window_attention import check_window
from kernels.varlen_attention import launch_varlen

__all__ = ["window_varlen_attention", "window_varlen_kernel", "window_varlen_reference"]


@triton.jit
def window_varlen_kernel(
    out_ptr, query_ptr, k_cache_ptr, v_cache_ptr, query_start_loc_ptr, seq_lens_ptr,
    block_tables_ptr, token_seqs_ptr, scale, window,
    stride_q_token, stride_q_head,                     # query and out [tokens, q_heads, dim]
    stride_kv_block, stride_kv_token, stride_kv_head,  # caches [blocks, block, kv_heads, dim]
    stride_table_seq,                                  # block_tables [seqs, max_blocks]
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr,
):
    """Attention of one query token's heads that share one KV head, over the last ``window``
    keys of its request up to the token's own position."""
    token = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.load(token_seqs_ptr + token)
    start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - start
    seq_len = tl.load(seq_lens_ptr + seq)
    context = seq_len - q_len + (token - start) + 1  # keys up to its own position
    first = tl.maximum(context - window, 0)  # the first key its window sees

    rows = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + rows
    real = rows < GROUP
    dims = tl.arange(0, HEAD_PAD)
    dim_ok = dims < HEAD_DIM
    slots = tl.arange(0, BLOCK_PAD)
    in_block = slots < BLOCK_SIZE

    q_offsets = (token.to(tl.int64) * stride_q_token + heads[:, None] * stride_q_head
                 + dims[None, :])
    q_mask = real[:, None] & dim_ok[None, :]
    q = tl.load(query_ptr + q_offsets, mask=q_mask, other=0.0)

    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    total = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_PAD], tl.float32)
    for index in range(first // BLOCK_SIZE, tl.cdiv(context, BLOCK_SIZE)):
        block = tl.load(block_tables_ptr + seq * stride_table_seq + index).to(tl.int64)
        positions = index * BLOCK_SIZE + slots
        valid = in_block & (positions >= first) & (positions < context)
        kv_offsets = (block * stride_kv_block + slots[:, None] * stride_kv_token
                      + kv_head * stride_kv_head + dims[None, :])
        kv_mask = valid[:, None] & dim_ok[None, :]
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

    out = acc / total[:, None]
    tl.store(out_ptr + q_offsets, out.to(out_ptr.dtype.element_ty), mask=q_mask)


def window_varlen_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                            block_tables: torch.Tensor, window: int, scale: float
                            ) -> torch.Tensor:
    """``window_varlen_reference`` through the Triton kernel, in the query's dtype (bf16
    computed in fp32 on the interpreter, which has no bf16 arithmetic); ``window`` as
    ``check_window`` wants it."""
    check_window(window)
    if query.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1":
        return window_varlen_attention(query.float(), k_cache.float(), v_cache.float(),
                                       query_start_loc, seq_lens, block_tables, window,
                                       scale).to(torch.bfloat16)
    if k_cache.stride() != v_cache.stride():
        raise ValueError("k_cache and v_cache must share strides")
    return launch_varlen(window_varlen_kernel, query, k_cache, v_cache, query_start_loc,
                         seq_lens, block_tables, scale, window)


def window_varlen_reference(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                            block_tables: torch.Tensor, window: int, scale: float
                            ) -> torch.Tensor:
    """Each packed query token over its request's last ``window`` keys up to its own
    position, gathered from the request's blocks from the chunk's first window on; fp32
    arithmetic, output in the query's dtype."""
    _, num_q_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    out = torch.empty_like(query)
    for seq in range(len(seq_lens)):
        start, end = int(query_start_loc[seq]), int(query_start_loc[seq + 1])
        length, q_len = int(seq_lens[seq]), end - start
        if q_len == 0:
            continue
        first_block = max(0, length - q_len - window + 1) // block_size
        table = block_tables[seq, first_block: -(-length // block_size)].long()
        offset = first_block * block_size  # the position of the first key gathered
        keys = k_cache[table].reshape(-1, num_kv_heads, head_dim)[:length - offset].float()
        values = v_cache[table].reshape(-1, num_kv_heads, head_dim)[:length - offset].float()
        keys = keys.repeat_interleave(group, dim=1)
        values = values.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query[start:end].float(), keys) * scale
        positions = torch.arange(length - q_len, length, device=query.device)[:, None]
        keyed = torch.arange(offset, length, device=query.device)[None, :]
        visible = (keyed <= positions) & (keyed > positions - window)
        scores = scores.masked_fill(~visible[None], float("-inf"))
        attended = torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), values)
        out[start:end] = attended.to(query.dtype)
    return out
