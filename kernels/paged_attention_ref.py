"""Chapter 6 in PyTorch: KV writes through a slot mapping, and paged decode attention
(gathered, and block by block with an online softmax). Chapter 7's Triton kernels compute the
same.

Layout::

    k_cache, v_cache  [num_blocks, block_size, num_kv_heads, head_dim]   the pool
    block_tables      [num_seqs, max_blocks]   int, padded past each sequence's blocks
    seq_lens          [num_seqs]               int, tokens per sequence
    query             [num_seqs, num_q_heads, head_dim]   one decode token per sequence

Query head h reads KV head h // (num_q_heads // num_kv_heads) (grouped-query attention).
Answers are the bodies between ``### BEGIN SOLUTION`` and ``### END SOLUTION``: chapter 6's
notebook renders its cells from them, and a learner edition replaces them with stubs.
"""

from __future__ import annotations

import torch


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, key: torch.Tensor,
             value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write ``key``/``value`` ([num_tokens, num_kv_heads, head_dim]) into the pool, in place,
    at the flat slots ``slot_mapping`` ([num_tokens]); every negative slot is padding and is
    skipped."""
    ### BEGIN SOLUTION
    block_size = k_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    k_cache[slots // block_size, slots % block_size] = key[keep].to(k_cache.dtype)
    v_cache[slots // block_size, slots % block_size] = value[keep].to(v_cache.dtype)
    ### END SOLUTION


def paged_decode_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor,
                           scale: float) -> torch.Tensor:
    """Attention of each sequence's one query token ([num_seqs, num_q_heads, head_dim]) over
    its first ``seq_lens`` tokens, gathered through its block table; fp32 arithmetic, output
    [num_seqs, num_q_heads, head_dim] in the query's dtype."""
    ### BEGIN SOLUTION
    num_seqs, num_q_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    out = torch.empty_like(query)
    for seq in range(num_seqs):
        length = int(seq_lens[seq])
        table = block_tables[seq, : -(-length // block_size)].long()
        keys = k_cache[table].reshape(-1, num_kv_heads, head_dim)[:length].float()
        values = v_cache[table].reshape(-1, num_kv_heads, head_dim)[:length].float()
        keys = keys.repeat_interleave(group, dim=1)  # [length, num_q_heads, head_dim]
        values = values.repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,thd->ht", query[seq].float(), keys) * scale
        out[seq] = torch.einsum("ht,thd->hd", scores.softmax(dim=-1), values).to(query.dtype)
    return out
    ### END SOLUTION


def merge_partials(m_a: torch.Tensor, l_a: torch.Tensor, acc_a: torch.Tensor,
                   m_b: torch.Tensor, l_b: torch.Tensor, acc_b: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Combine the softmax partials of two disjoint pieces of a sequence.

    Per head: ``m`` is the piece's largest score, ``l`` the sum of exp(score - m), ``acc``
    ([heads, head_dim]) the sum of exp(score - m) x value. The attention output is acc / l.
    """
    ### BEGIN SOLUTION
    m = torch.maximum(m_a, m_b)
    a, b = torch.exp(m_a - m), torch.exp(m_b - m)
    return m, l_a * a + l_b * b, acc_a * a[:, None] + acc_b * b[:, None]
    ### END SOLUTION


def blockwise_decode_attention(query: torch.Tensor, k_cache: torch.Tensor,
                               v_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int,
                               scale: float) -> torch.Tensor:
    """One sequence's decode attention, one block at a time: each block's partial (m, l, acc)
    is merged into the running one (an online softmax). ``query`` [num_q_heads, head_dim],
    ``block_table`` [max_blocks], ``seq_len`` an int; returns [num_q_heads, head_dim] in the
    query's dtype, fp32 arithmetic."""
    ### BEGIN SOLUTION
    num_q_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    state = None
    for index in range(-(-seq_len // block_size)):
        valid = min(block_size, seq_len - index * block_size)
        block = int(block_table[index])
        keys = k_cache[block, :valid].float().repeat_interleave(group, dim=1)
        values = v_cache[block, :valid].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,thd->ht", query.float(), keys) * scale
        m = scores.max(dim=-1).values
        weights = torch.exp(scores - m[:, None])
        partial = (m, weights.sum(dim=-1), torch.einsum("ht,thd->hd", weights, values))
        state = partial if state is None else merge_partials(*state, *partial)
    _, total, acc = state
    return (acc / total[:, None]).to(query.dtype)
    ### END SOLUTION


def decode_step(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """One decode step: write each sequence's new token's K/V (``key``, ``value``:
    [num_seqs, num_kv_heads, head_dim]) at position seq_len - 1 (its blocks already in its
    table), then attend over everything, that token included. ``query`` [num_seqs,
    num_q_heads, head_dim]; returns [num_seqs, num_q_heads, head_dim] in the query's dtype."""
    ### BEGIN SOLUTION
    block_size = k_cache.shape[1]
    positions = seq_lens.long() - 1
    rows = torch.arange(len(seq_lens))
    slots = block_tables[rows, positions // block_size].long() * block_size \
        + positions % block_size
    write_kv(k_cache, v_cache, key, value, slots)
    return paged_decode_attention(query, k_cache, v_cache, block_tables, seq_lens, scale)
    ### END SOLUTION
