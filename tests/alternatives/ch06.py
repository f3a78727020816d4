"""Chapter 6 solved another way: loops over blocks and heads instead of gathers."""

from __future__ import annotations

import math

import torch


def write_kv(k_cache, v_cache, key, value, slot_mapping):
    block_size = k_cache.shape[1]
    for token, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        block, offset = divmod(slot, block_size)
        k_cache[block, offset].copy_(key[token])
        v_cache[block, offset].copy_(value[token])


def paged_decode_attention(query, k_cache, v_cache, block_tables, seq_lens, scale):
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = query.shape[1] // kv_heads
    out = torch.zeros_like(query)
    for seq in range(query.shape[0]):
        length = int(seq_lens[seq])
        keys, values = [], []
        for position in range(length):  # walk the positions, block by block
            block = int(block_tables[seq, position // block_size])
            keys.append(k_cache[block, position % block_size])
            values.append(v_cache[block, position % block_size])
        k = torch.stack(keys).double()  # [length, kv_heads, head_dim]
        v = torch.stack(values).double()
        for head in range(query.shape[1]):
            scores = k[:, head // group] @ query[seq, head].double() * scale
            out[seq, head] = (torch.softmax(scores, 0) @ v[:, head // group]).to(query.dtype)
    return out


def merge_partials(m_a, l_a, acc_a, m_b, l_b, acc_b):
    m = torch.where(m_a > m_b, m_a, m_b)
    scale_a = (m_a - m).exp()
    scale_b = (m_b - m).exp()
    return m, scale_a * l_a + scale_b * l_b, scale_a.unsqueeze(-1) * acc_a + \
        scale_b.unsqueeze(-1) * acc_b


def blockwise_decode_attention(query, k_cache, v_cache, block_table, seq_len, scale):
    heads, dim = query.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    out = torch.empty(heads, dim, dtype=query.dtype)
    for h in range(heads):
        m = torch.tensor([-math.inf], dtype=torch.float64)
        total = torch.zeros(1, dtype=torch.float64)
        acc = torch.zeros(1, dim, dtype=torch.float64)
        for start in range(0, seq_len, block_size):
            block = int(block_table[start // block_size])
            count = min(block_size, seq_len - start)
            keys = k_cache[block, :count, h // group].double()
            values = v_cache[block, :count, h // group].double()
            scores = keys @ query[h].double() * scale
            piece_m = scores.max().reshape(1)
            weights = (scores - piece_m).exp()
            if math.isinf(m.item()):
                m, total, acc = piece_m, weights.sum().reshape(1), (weights @ values)[None]
            else:
                m, total, acc = merge_partials(m, total, acc, piece_m, weights.sum().reshape(1),
                                               (weights @ values)[None])
        out[h] = (acc[0] / total[0]).to(query.dtype)
    return out


def decode_step(query, key, value, k_cache, v_cache, block_tables, seq_lens, scale):
    block_size = k_cache.shape[1]
    slots = []
    for seq, length in enumerate(seq_lens.tolist()):
        position = length - 1
        slots.append(int(block_tables[seq, position // block_size]) * block_size
                     + position % block_size)
    write_kv(k_cache, v_cache, key, value, torch.tensor(slots))
    return paged_decode_attention(query, k_cache, v_cache, block_tables, seq_lens, scale)
