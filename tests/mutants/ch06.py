"""Wrong chapter 6 solutions, as learners write them, with the hint each must get; and
``RULES``: each rule the notebook states about a TODO, with the mutants that break it alone."""

from __future__ import annotations

import torch

from kernels import paged_attention_ref as reference
from mutants import Rule


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


def _slots_across_blocks(k_cache, v_cache, key, value, slot_mapping):
    """Numbers slots across the blocks first: slot s at block s % num_blocks."""
    num_blocks = k_cache.shape[0]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache[slots % num_blocks, slots // num_blocks] = key[keep]
    v_cache[slots % num_blocks, slots // num_blocks] = value[keep]


def _index_put_not_in_place(k_cache, v_cache, key, value, slot_mapping):
    """index_put, not index_put_: new tensors, bound to local names; the pool is untouched."""
    block_size = k_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    where = (slots // block_size, slots % block_size)
    k_cache = k_cache.index_put(where, key[keep])
    v_cache = v_cache.index_put(where, value[keep])


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


def _pool_as_one_sequence(query, k_cache, v_cache, block_tables, seq_lens, scale):
    """Reads the pool's slots in order, as if every sequence's tokens started at slot 0."""
    num_kv_heads, head_dim = k_cache.shape[2:]
    group = query.shape[1] // num_kv_heads
    out = torch.empty_like(query)
    for seq in range(query.shape[0]):
        n = int(seq_lens[seq])
        keys = k_cache.reshape(-1, num_kv_heads, head_dim)[:n].float()
        values = v_cache.reshape(-1, num_kv_heads, head_dim)[:n].float()
        scores = torch.einsum("hd,thd->ht", query[seq].float(),
                              keys.repeat_interleave(group, dim=1)) * scale
        out[seq] = torch.einsum("ht,thd->hd", scores.softmax(-1),
                                values.repeat_interleave(group, dim=1)).to(query.dtype)
    return out


def _merge_without_rescaling_acc(m_a, l_a, acc_a, m_b, l_b, acc_b):
    m = torch.maximum(m_a, m_b)
    return m, l_a * torch.exp(m_a - m) + l_b * torch.exp(m_b - m), acc_a + acc_b


def _merge_l_unscaled(m_a, l_a, acc_a, m_b, l_b, acc_b):
    m = torch.maximum(m_a, m_b)
    a, b = torch.exp(m_a - m), torch.exp(m_b - m)
    return m, l_a + l_b, acc_a * a[:, None] + acc_b * b[:, None]


def _merge_keeps_first_max(m_a, l_a, acc_a, m_b, l_b, acc_b):
    b = torch.exp(m_b - m_a)
    return m_a, l_a + l_b * b, acc_a + acc_b * b[:, None]


def _merge_unshifted(m_a, l_a, acc_a, m_b, l_b, acc_b):
    """Scales by exp of each maximum, then divides by exp of the merged one: equal on paper."""
    m = torch.maximum(m_a, m_b)
    a, b, top = torch.exp(m_a), torch.exp(m_b), torch.exp(m)
    return m, (l_a * a + l_b * b) / top, (acc_a * a[:, None] + acc_b * b[:, None]) / top[:, None]


def _blockwise(merge: bool = True, valid_only: bool = True):
    def blockwise_decode_attention(query, k_cache, v_cache, block_table, seq_len, scale):
        num_q_heads = query.shape[0]
        _, block_size, num_kv_heads, _ = k_cache.shape
        group = num_q_heads // num_kv_heads
        state = None
        for index in range(-(-seq_len // block_size)):
            valid = min(block_size, seq_len - index * block_size) if valid_only else block_size
            block = int(block_table[index])
            keys = k_cache[block, :valid].float().repeat_interleave(group, dim=1)
            values = v_cache[block, :valid].float().repeat_interleave(group, dim=1)
            scores = torch.einsum("hd,thd->ht", query.float(), keys) * scale
            m = scores.max(dim=-1).values
            weights = torch.exp(scores - m[:, None])
            partial = (m, weights.sum(dim=-1), torch.einsum("ht,thd->hd", weights, values))
            state = reference.merge_partials(*state, *partial) if merge and state else partial
        _, total, acc = state
        return (acc / total[:, None]).to(query.dtype)
    return blockwise_decode_attention


def _named(function, name):
    function.__name__ = name
    return function


_blockwise_whole_blocks = _named(_blockwise(valid_only=False), "_blockwise_whole_blocks")
_blockwise_last_block_only = _named(_blockwise(merge=False), "_blockwise_last_block_only")


def _blockwise_returns_fp32(query, k_cache, v_cache, block_table, seq_len, scale):
    return reference.blockwise_decode_attention(query, k_cache, v_cache, block_table, seq_len,
                                                scale).float()


def _writes_at_seq_len(query, key, value, k_cache, v_cache, block_tables, seq_lens, scale):
    block_size = k_cache.shape[1]
    positions = seq_lens.long()  # the new token counted, so one past it
    rows = torch.arange(len(seq_lens))
    slots = block_tables[rows, positions // block_size].long() * block_size \
        + positions % block_size
    reference.write_kv(k_cache, v_cache, key, value, slots)
    return reference.paged_decode_attention(query, k_cache, v_cache, block_tables, seq_lens,
                                            scale)


def _attends_before_writing(query, key, value, k_cache, v_cache, block_tables, seq_lens, scale):
    out = reference.paged_decode_attention(query, k_cache, v_cache, block_tables, seq_lens - 1,
                                           scale) if bool((seq_lens > 1).all()) else None
    reference.decode_step(query, key, value, k_cache, v_cache, block_tables, seq_lens, scale)
    return out if out is not None else query * 0


MUTANTS = {
    "write_kv": [(_writes_padding, "slot -1"),
                 (_skips_only_minus_one, "Every negative slot is padding"),
                 (_slots_across_blocks, "Slot s is block s // block_size"),
                 (_index_put_not_in_place, "a write into a copy")],
    "paged_decode_attention": [(_no_scale, "scores left unscaled"),
                               (_kv_head_modulo, "share KV head 0"),
                               (_tail_not_masked, "garbage from slots"),
                               (_answers_in_fp32, "in the query's dtype"),
                               (_fp16_arithmetic, "promised in fp32"),
                               (_pool_as_one_sequence, "a block its table does not name")],
    "merge_partials": [(_merge_without_rescaling_acc, "The sums l are right but acc is not"),
                       (_merge_l_unscaled, "Each piece's l was summed against its own maximum"),
                       (_merge_keeps_first_max, "The merged m is the larger"),
                       (_merge_unshifted, "not shifted by a maximum overflows")],
    "blockwise_decode_attention": [(_blockwise_whole_blocks, "garbage from slots"),
                                   (_blockwise_last_block_only, "is off by up to"),
                                   (_blockwise_returns_fp32, "in the query's dtype")],
    "decode_step": [(_attends_before_writing, "did not attend to itself"),
                    (_writes_at_seq_len, "or went to another slot")],
}

RULES = [
    Rule("**Every negative slot is padding**", "write_kv", ("_skips_only_minus_one",)),
    Rule("Python's negative indexing would quietly write slot -1 into the pool's last slot",
         "write_kv", ("_writes_padding",)),
    Rule("Slot s is block `s // block_size`, offset `s % block_size`.", "write_kv",
         ("_slots_across_blocks",)),
    Rule("It returns nothing: it changes the pool in place.", "write_kv",
         ("_index_put_not_in_place",)),
    Rule("its one query token attends over its `seq_len` tokens, gathered through its block "
         "table", "paged_decode_attention", ("_pool_as_one_sequence",)),
    Rule("Scores are `scale x (q . k)`.", "paged_decode_attention", ("_no_scale",)),
    Rule("query head h reads KV head `h // (num_q_heads // num_kv_heads)`",
         "paged_decode_attention", ("_kv_head_modulo",)),
    Rule("Read only the first `seq_len` tokens", "paged_decode_attention", ("_tail_not_masked",)),
    Rule("Compute in fp32 (scores, softmax and sums)", "paged_decode_attention",
         ("_fp16_arithmetic",)),
    Rule("return the query's dtype", "paged_decode_attention", ("_answers_in_fp32",)),
    Rule("with `m = max(m_a, m_b)`", "merge_partials", ("_merge_keeps_first_max",)),
    Rule("l   = l_a x exp(m_a - m) + l_b x exp(m_b - m)", "merge_partials",
         ("_merge_l_unscaled",)),
    Rule("acc = acc_a x exp(m_a - m) + acc_b x exp(m_b - m)", "merge_partials",
         ("_merge_without_rescaling_acc",)),
    Rule("Subtracting the max keeps every `exp` at most 1, so nothing overflows however large "
         "the scores.", "merge_partials", ("_merge_unshifted",)),
    Rule("compute each block's partial (only its valid tokens)", "blockwise_decode_attention",
         ("_blockwise_whole_blocks",)),
    Rule("merge it into the running one with your `merge_partials`",
         "blockwise_decode_attention", ("_blockwise_last_block_only",)),
    Rule("in the query's dtype, fp32 arithmetic as in TODO 2", "blockwise_decode_attention",
         ("_blockwise_returns_fp32",)),
    Rule("writes each sequence's newest token's K/V (at position `seq_len - 1`", "decode_step",
         ("_writes_at_seq_len",)),
    Rule("then attends over all `seq_len` tokens, that one included", "decode_step",
         ("_attends_before_writing",)),
]
