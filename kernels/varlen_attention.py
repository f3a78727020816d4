"""Chapter 9: variable-length paged attention in Triton, one kernel for prefill chunks and
decodes (chapter 9's ``varlen_paged_attention`` in PyTorch computes the same), and for every
kind of attention layer whose query sees a run of keys ending at its own position.

One program per (query token, KV head). The program finds its request (``token_seqs``, from
the host), the request's first query token and query length (``query_start_loc``) and its
context (``seq_lens``), so it knows its own position; it then runs chapter 7's decode loop over
the request's blocks, from the block of the first key it sees to the block of its own position
(the causal mask)::

    request r: seq_len = 7, q_len = 3 (4 cached tokens, 3 new), blocks of 4
    query token j=0 at position 4 sees keys 0..4   -> blocks 0, 1 (1 valid slot)
    query token j=2 at position 6 sees keys 0..6   -> blocks 0, 1 (3 valid slots)
    a decode (q_len = 1) sees all seq_len keys: chapter 7's program exactly

Which key comes first is the one thing a kind of layer changes, so the kernel asks
``FIRST_KEY(context, window)``, a ``triton.jit`` function given as a compile-time constant:
``all_keys`` (0) for full attention, chapter 10's ``window_first_key`` for a sliding window
(vLLM's Triton attention takes its window the same way, as a constant of one kernel). Triton
compiles one kernel per function given, so full attention pays nothing for the window.

Any head size and block size: both are padded to a power of two of at least 16 (``HEAD_PAD``,
``BLOCK_PAD``; what ``tl.arange`` and NVIDIA's ``tl.dot`` need), with masks for the padding;
the group of query heads sharing a KV head is padded to ``GROUP_PAD`` rows, as in chapter 7.

Answers are the bodies between ``### BEGIN SOLUTION`` and ``### END SOLUTION``: chapter 9's
notebook renders its cells from them, and a learner edition replaces them with stubs.
Import after ``course.setup()``.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels.split_kv import run_on_grid

__all__ = ["all_keys", "keys_from", "launch_varlen", "varlen_attention",
           "varlen_attention_kernel"]


@triton.jit
def all_keys(context, window):
    """Full attention: a query sees its request's keys from key 0 (``window`` is not used)."""
    return 0


@triton.jit
def keys_from(context, window):
    """Keys from key ``window`` on (the query's own alone where that comes first): a first key
    other than 0, with which chapter 9's checks try where a kernel's block loop starts."""
    return tl.minimum(window, context - 1)


@triton.jit
def varlen_attention_kernel(
    out_ptr, query_ptr, k_cache_ptr, v_cache_ptr, query_start_loc_ptr, seq_lens_ptr,
    block_tables_ptr, token_seqs_ptr, scale, window,
    stride_q_token, stride_q_head,                     # query and out [tokens, q_heads, dim]
    stride_kv_block, stride_kv_token, stride_kv_head,  # caches [blocks, block, kv_heads, dim]
    stride_table_seq,                                  # block_tables [seqs, max_blocks]
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr,
    FIRST_KEY: tl.constexpr,
):
    """Attention of one query token's heads that share one KV head, over its request's keys
    from ``FIRST_KEY(context, window)`` up to the token's own position."""
    ### BEGIN SOLUTION
    token = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.load(token_seqs_ptr + token)
    start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - start
    seq_len = tl.load(seq_lens_ptr + seq)
    context = seq_len - q_len + (token - start) + 1  # keys up to its own position
    first = FIRST_KEY(context, window)  # and from this one: 0, or where its window starts

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
    ### END SOLUTION


def _pad(size: int) -> int:
    return max(16, triton.next_power_of_2(size))


def launch_varlen(kernel, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                  block_tables: torch.Tensor, scale: float, window: int = 0,
                  first_key=all_keys) -> torch.Tensor:
    """Run a chapter-9 kernel on a grid of (num_tokens, num_kv_heads) programs and return its
    output. The arguments are the kernel's signature: pointers (``token_seqs``, each query
    token's request, computed here), the scale and ``window``, the strides in elements, then
    GROUP, GROUP_PAD, BLOCK_SIZE, BLOCK_PAD, HEAD_DIM, HEAD_PAD and FIRST_KEY
    (``first_key``)."""
    query = query.contiguous()
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1 or block_tables.stride(1) != 1:
        raise ValueError("the kernel reads head_dim in the caches and a block table's entries "
                         "at stride 1: pass caches and block tables whose last dimension is "
                         "contiguous")
    num_tokens, num_q_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    out = torch.empty_like(query)
    if num_tokens == 0:
        return out
    q_lens = (query_start_loc[1:] - query_start_loc[:-1]).long()
    token_seqs = torch.repeat_interleave(
        torch.arange(len(q_lens), device=query.device, dtype=torch.int32), q_lens)
    run_on_grid(
        kernel, (num_tokens, num_kv_heads),
        out, query, k_cache, v_cache, query_start_loc.to(torch.int32),
        seq_lens.to(torch.int32), block_tables, token_seqs, scale, window,
        query.stride(0), query.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        GROUP=group, GROUP_PAD=_pad(group), BLOCK_SIZE=block_size, BLOCK_PAD=_pad(block_size),
        HEAD_DIM=head_dim, HEAD_PAD=_pad(head_dim), FIRST_KEY=first_key,
    )
    return out


def varlen_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                     block_tables: torch.Tensor, scale: float, kernel=None, window: int = 0,
                     first_key=all_keys) -> torch.Tensor:
    """``varlen_paged_attention`` through the Triton kernel (``kernel``, by default the
    course's), each query seeing its keys from ``first_key(context, window)`` on (by default
    all of them), in the query's dtype; bf16 is computed in fp32 on the interpreter (it has
    no bf16 arithmetic)."""
    kernel = kernel or varlen_attention_kernel
    if query.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1":
        return varlen_attention(query.float(), k_cache.float(), v_cache.float(),
                                query_start_loc, seq_lens, block_tables, scale, kernel,
                                window, first_key).to(torch.bfloat16)
    if k_cache.stride() != v_cache.stride():
        raise ValueError("k_cache and v_cache must share strides")
    return launch_varlen(kernel, query, k_cache, v_cache, query_start_loc, seq_lens,
                         block_tables, scale, window, first_key)
