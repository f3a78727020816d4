"""Wrong chapter 6 solutions, as learners write them, with the hint each must get."""

from __future__ import annotations

import torch

from kernels import paged_attention_ref as reference


def _writes_padding(k_cache, v_cache, key, value, slot_mapping):
    block_size = k_cache.shape[1]
    flat_k = k_cache.view(-1, *k_cache.shape[2:])
    flat_v = v_cache.view(-1, *v_cache.shape[2:])
    for i, slot in enumerate(slot_mapping.tolist()):
        flat_k[slot] = key[i]  # -1 silently writes the last slot
        flat_v[slot] = value[i]
    del block_size


def _skips_only_minus_one(k_cache, v_cache, key, value, slot_mapping):
    flat_k = k_cache.view(-1, *k_cache.shape[2:])
    flat_v = v_cache.view(-1, *v_cache.shape[2:])
    for i, slot in enumerate(slot_mapping.tolist()):
        if slot != -1:  # padding is -1 ... but -6 wraps to the end
            flat_k[slot] = key[i]
            flat_v[slot] = value[i]


def _answers_in_fp32(query, k_cache, v_cache, block_tables, seq_lens, scale):
    return reference.paged_decode_attention(query.float(), k_cache.float(), v_cache.float(),
                                            block_tables, seq_lens, scale)


def _fp16_arithmetic(query, k_cache, v_cache, block_tables, seq_lens, scale):
    """Computes in the pool's dtype: fp16 scores, softmax and sums."""
    num_seqs, num_q_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    out = torch.empty_like(query)
    for seq in range(num_seqs):
        n = int(seq_lens[seq])
        table = block_tables[seq, : -(-n // block_size)].long()
        keys = k_cache[table].reshape(-1, num_kv_heads, head_dim)[:n]
        values = v_cache[table].reshape(-1, num_kv_heads, head_dim)[:n]
        keys = keys.repeat_interleave(group, dim=1)
        values = values.repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,thd->ht", query[seq], keys) * scale
        out[seq] = torch.einsum("ht,thd->hd", scores.softmax(dim=-1), values)
    return out


def _no_scale(query, k_cache, v_cache, block_tables, seq_lens, scale):
    return reference.paged_decode_attention(query, k_cache, v_cache, block_tables, seq_lens, 1.0)


def _kv_head_modulo(query, k_cache, v_cache, block_tables, seq_lens, scale):
    num_q_heads, num_kv_heads = query.shape[1], k_cache.shape[2]
    heads = torch.arange(num_q_heads) % num_kv_heads
    out = torch.empty_like(query)
    block_size = k_cache.shape[1]
    for seq in range(query.shape[0]):
        n = int(seq_lens[seq])
        table = block_tables[seq, : -(-n // block_size)].long()
        keys = k_cache[table].reshape(-1, num_kv_heads, query.shape[2])[:n][:, heads].float()
        values = v_cache[table].reshape(-1, num_kv_heads, query.shape[2])[:n][:, heads].float()
        scores = torch.einsum("hd,thd->ht", query[seq].float(), keys) * scale
        out[seq] = torch.einsum("ht,thd->hd", scores.softmax(-1), values).to(query.dtype)
    return out


def _tail_not_masked(query, k_cache, v_cache, block_tables, seq_lens, scale):
    block_size = k_cache.shape[1]
    rounded = (seq_lens + block_size - 1) // block_size * block_size
    return reference.paged_decode_attention(query, k_cache, v_cache, block_tables, rounded, scale)


def _merge_without_rescaling_acc(m_a, l_a, acc_a, m_b, l_b, acc_b):
    m = torch.maximum(m_a, m_b)
    return m, l_a * torch.exp(m_a - m) + l_b * torch.exp(m_b - m), acc_a + acc_b


def _blockwise_without_rescaling(query, k_cache, v_cache, block_table, seq_len, scale):
    saved = reference.merge_partials
    reference.merge_partials = _merge_without_rescaling_acc
    try:
        return reference.blockwise_decode_attention(query, k_cache, v_cache, block_table,
                                                    seq_len, scale)
    finally:
        reference.merge_partials = saved


def _blockwise_returns_fp32(query, k_cache, v_cache, block_table, seq_len, scale):
    return reference.blockwise_decode_attention(query, k_cache, v_cache, block_table, seq_len,
                                                scale).float()


def _attends_before_writing(query, key, value, k_cache, v_cache, block_tables, seq_lens, scale):
    out = reference.paged_decode_attention(query, k_cache, v_cache, block_tables, seq_lens - 1,
                                           scale) if bool((seq_lens > 1).all()) else None
    reference.decode_step(query, key, value, k_cache, v_cache, block_tables, seq_lens, scale)
    return out if out is not None else query * 0


MUTANTS = {
    "write_kv": [(_writes_padding, "slot -1"),
                 (_skips_only_minus_one, "Every negative slot is padding")],
    "paged_decode_attention": [(_no_scale, "scores left unscaled"),
                               (_kv_head_modulo, "share KV head 0"),
                               (_tail_not_masked, "garbage from slots"),
                               (_answers_in_fp32, "in the query's dtype"),
                               (_fp16_arithmetic, "promised in fp32")],
    "merge_partials": [(_merge_without_rescaling_acc, "The sums l are right but acc is not")],
    "blockwise_decode_attention": [(_blockwise_without_rescaling, "fix that first"),
                                   (_blockwise_returns_fp32, "in the query's dtype")],
    "decode_step": [(_attends_before_writing, "did not attend to itself")],
}
