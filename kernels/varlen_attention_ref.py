"""Chapter 9 in PyTorch: variable-length paged attention, one function for prefill chunks and
decodes alike. Chapter 9's Triton kernel (``kernels/varlen_attention.py``) computes the same.

Layout (chapter 6's pool and tables; queries packed, as vLLM's attention metadata has them)::

    query            [num_tokens, num_q_heads, head_dim]   every request's new tokens, packed
    query_start_loc  [num_seqs + 1]   request r's queries are query[start[r] : start[r + 1]]
    seq_lens         [num_seqs]       request r's context after this step: cached + new tokens
    block_tables     [num_seqs, max_blocks]
    k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim]   the new K/V written

    request r, q_len = start[r + 1] - start[r], seq_len = seq_lens[r]:
    its query j (0 <= j < q_len) is at position seq_len - q_len + j and sees keys 0 .. that
    position (causal); a decode is q_len = 1, seeing all seq_len keys (chapter 6 and 7).

Query head h reads KV head h // (num_q_heads // num_kv_heads) (grouped-query attention).
Answers are the bodies between ``### BEGIN SOLUTION`` and ``### END SOLUTION``: chapter 9's
notebook renders its cells from them, and a learner edition replaces them with stubs.
"""

from __future__ import annotations

import torch


def varlen_paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                           block_tables: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention of every packed query token over its request's keys up to its own position,
    gathered through the request's block table; fp32 arithmetic, output in the query's
    dtype."""
    ### BEGIN SOLUTION
    _, num_q_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    out = torch.empty_like(query)
    for seq in range(len(seq_lens)):
        start, end = int(query_start_loc[seq]), int(query_start_loc[seq + 1])
        length, q_len = int(seq_lens[seq]), end - start
        if q_len == 0:
            continue
        table = block_tables[seq, : -(-length // block_size)].long()
        keys = k_cache[table].reshape(-1, num_kv_heads, head_dim)[:length].float()
        values = v_cache[table].reshape(-1, num_kv_heads, head_dim)[:length].float()
        keys = keys.repeat_interleave(group, dim=1)  # [length, num_q_heads, head_dim]
        values = values.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", query[start:end].float(), keys) * scale
        positions = torch.arange(length - q_len, length, device=query.device)
        visible = torch.arange(length, device=query.device)[None, :] <= positions[:, None]
        scores = scores.masked_fill(~visible[None], float("-inf"))
        attended = torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), values)
        out[start:end] = attended.to(query.dtype)
    return out
    ### END SOLUTION
