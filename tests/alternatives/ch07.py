"""Chapter 7 solved another way: exp2 with log2(e) folded into the scale, a two-pass softmax,
broadcast products instead of ``tl.dot``, the tail block peeled off the loop, a merge that
walks the splits one at a time, and a wrapper that validates with a table of rules.

Each function is self-contained (the grading tests paste them into a notebook), using only
what the chapter's notebook imports: os, torch, triton, tl, launch, choose_num_splits and
run_split_kv.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels.paged_attention import launch
from kernels.split_kv import choose_num_splits, run_split_kv


@triton.jit
def one_block_kernel(out_ptr, query_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr,
                     seq_lens_ptr, scale, stride_q_seq, stride_q_head, stride_kv_block,
                     stride_kv_token, stride_kv_head, stride_table_seq, GROUP: tl.constexpr,
                     GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                     HEAD_PAD: tl.constexpr):
    seq, head = tl.program_id(0), tl.program_id(1)
    columns = tl.arange(0, HEAD_PAD)
    inside = columns < HEAD_DIM
    block = tl.load(block_tables_ptr + seq * stride_table_seq).to(tl.int64)
    base = block * stride_kv_block + (head // GROUP) * stride_kv_head
    offsets = base + tl.arange(0, BLOCK_SIZE)[:, None] * stride_kv_token + columns[None, :]
    q_ptrs = query_ptr + seq * stride_q_seq + head * stride_q_head + columns
    q = tl.load(q_ptrs, mask=inside, other=0.0).to(tl.float32) * (scale * 1.4426950408889634)
    keys = tl.load(k_cache_ptr + offsets, mask=inside[None, :], other=0.0).to(tl.float32)
    scores = tl.sum(keys * q[None, :], axis=1)
    weights = tl.exp2(scores - tl.max(scores, axis=0))
    weights = weights / tl.sum(weights, axis=0)
    values = tl.load(v_cache_ptr + offsets, mask=inside[None, :], other=0.0).to(tl.float32)
    out = tl.sum(values * weights[:, None], axis=0)
    out_ptrs = out_ptr + seq * stride_q_seq + head * stride_q_head + columns
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=inside)


@triton.jit
def block_loop_kernel(out_ptr, query_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr,
                      seq_lens_ptr, scale, stride_q_seq, stride_q_head, stride_kv_block,
                      stride_kv_token, stride_kv_head, stride_table_seq, GROUP: tl.constexpr,
                      GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                      HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr):
    # two passes: the global max first, then sums against it (no rescaling needed)
    seq, head = tl.program_id(0), tl.program_id(1)
    dims = tl.arange(0, HEAD_PAD)
    keep = (dims < HEAD_DIM)[None, :] & (tl.arange(0, BLOCK_SIZE) >= 0)[:, None]
    within = tl.arange(0, BLOCK_SIZE)[:, None] * stride_kv_token + dims[None, :] \
        + (head // GROUP) * stride_kv_head
    q_ptrs = query_ptr + seq * stride_q_seq + head * stride_q_head + dims
    q = tl.load(q_ptrs, mask=dims < HEAD_DIM, other=0.0).to(tl.float32) * scale
    num_blocks = tl.load(seq_lens_ptr + seq) // BLOCK_SIZE
    row = block_tables_ptr + seq * stride_table_seq
    top = -float("inf")
    for index in range(num_blocks):
        block = tl.load(row + index).to(tl.int64)
        keys = tl.load(k_cache_ptr + block * stride_kv_block + within, mask=keep,
                       other=0.0).to(tl.float32)
        top = tl.maximum(top, tl.max(tl.sum(keys * q[None, :], axis=1), axis=0))
    denominator = 0.0
    numerator = tl.zeros([HEAD_PAD], tl.float32)
    for index in range(num_blocks):
        block = tl.load(row + index).to(tl.int64)
        keys = tl.load(k_cache_ptr + block * stride_kv_block + within, mask=keep,
                       other=0.0).to(tl.float32)
        values = tl.load(v_cache_ptr + block * stride_kv_block + within, mask=keep,
                         other=0.0).to(tl.float32)
        weights = tl.exp(tl.sum(keys * q[None, :], axis=1) - top)
        denominator += tl.sum(weights, axis=0)
        numerator += tl.sum(weights[:, None] * values, axis=0)
    tl.store(out_ptr + seq * stride_q_seq + head * stride_q_head + dims,
             (numerator / denominator).to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM)


@triton.jit
def gqa_kernel(out_ptr, query_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
               scale, stride_q_seq, stride_q_head, stride_kv_block, stride_kv_token,
               stride_kv_head, stride_table_seq, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
               BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr):
    # broadcast products and sums instead of tl.dot (fine here; slower on a GPU)
    seq, kv_head = tl.program_id(0), tl.program_id(1)
    member = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_PAD)
    rows = seq * stride_q_seq + (kv_head * GROUP + member)[:, None] * stride_q_head \
        + dims[None, :]
    tile = (member[:, None] < GROUP) & (dims[None, :] < HEAD_DIM)
    q = tl.load(query_ptr + rows, mask=tile, other=0.0).to(tl.float32)
    within = tl.arange(0, BLOCK_SIZE)[:, None] * stride_kv_token + kv_head * stride_kv_head \
        + dims[None, :]
    columns = (tl.arange(0, BLOCK_SIZE)[:, None] >= 0) & (dims[None, :] < HEAD_DIM)
    best = tl.zeros([GROUP_PAD], tl.float32) - float("inf")
    mass = tl.zeros([GROUP_PAD], tl.float32)
    mix = tl.zeros([GROUP_PAD, HEAD_PAD], tl.float32)
    for index in range(tl.load(seq_lens_ptr + seq) // BLOCK_SIZE):
        block = tl.load(block_tables_ptr + seq * stride_table_seq + index).to(tl.int64)
        keys = tl.load(k_cache_ptr + block * stride_kv_block + within, mask=columns,
                       other=0.0).to(tl.float32)
        values = tl.load(v_cache_ptr + block * stride_kv_block + within, mask=columns,
                         other=0.0).to(tl.float32)
        scores = tl.sum(q[:, None, :] * keys[None, :, :], axis=2) * scale
        new_best = tl.maximum(best, tl.max(scores, axis=1))
        weights = tl.exp(scores - new_best[:, None])
        shrink = tl.exp(best - new_best)
        mass = mass * shrink + tl.sum(weights, axis=1)
        mix = mix * shrink[:, None] + tl.sum(weights[:, :, None] * values[None, :, :], axis=1)
        best = new_best
    tl.store(out_ptr + rows, (mix / mass[:, None]).to(out_ptr.dtype.element_ty), mask=tile)


@triton.jit
def paged_attention_kernel(out_ptr, query_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr,
                           seq_lens_ptr, scale, stride_q_seq, stride_q_head, stride_kv_block,
                           stride_kv_token, stride_kv_head, stride_table_seq,
                           GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                           BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                           HEAD_PAD: tl.constexpr):
    # full blocks in the loop, masked by column only; the partial last block, if any, peeled off
    seq, kv_head = tl.program_id(0), tl.program_id(1)
    member = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_PAD)
    slots = tl.arange(0, BLOCK_SIZE)
    rows = seq * stride_q_seq + (kv_head * GROUP + member)[:, None] * stride_q_head \
        + dims[None, :]
    tile = (member[:, None] < GROUP) & (dims[None, :] < HEAD_DIM)
    q = tl.load(query_ptr + rows, mask=tile, other=0.0)
    log2_scale = scale * 1.4426950408889634
    within = slots[:, None] * stride_kv_token + kv_head * stride_kv_head + dims[None, :]
    columns = (slots[:, None] >= 0) & (dims[None, :] < HEAD_DIM)
    row = block_tables_ptr + seq * stride_table_seq
    seq_len = tl.load(seq_lens_ptr + seq)
    full = seq_len // BLOCK_SIZE
    best = tl.zeros([GROUP_PAD], tl.float32) - float("inf")
    mass = tl.zeros([GROUP_PAD], tl.float32)
    mix = tl.zeros([GROUP_PAD, HEAD_PAD], tl.float32)
    for index in range(full):
        start = tl.load(row + index).to(tl.int64) * stride_kv_block
        keys = tl.load(k_cache_ptr + start + within, mask=columns, other=0.0)
        values = tl.load(v_cache_ptr + start + within, mask=columns, other=0.0)
        scores = tl.dot(q, tl.trans(keys)) * log2_scale
        new_best = tl.maximum(best, tl.max(scores, axis=1))
        weights = tl.exp2(scores - new_best[:, None])
        shrink = tl.exp2(best - new_best)
        mass = mass * shrink + tl.sum(weights, axis=1)
        mix = mix * shrink[:, None] + tl.dot(weights.to(values.dtype), values)
        best = new_best
    tail = seq_len - full * BLOCK_SIZE
    if tail > 0:
        start = tl.load(row + full).to(tl.int64) * stride_kv_block
        keep = slots < tail
        keys = tl.load(k_cache_ptr + start + within, mask=keep[:, None] & columns, other=0.0)
        values = tl.load(v_cache_ptr + start + within, mask=keep[:, None] & columns, other=0.0)
        scores = tl.where(keep[None, :], tl.dot(q, tl.trans(keys)) * log2_scale, -float("inf"))
        new_best = tl.maximum(best, tl.max(scores, axis=1))
        weights = tl.exp2(scores - new_best[:, None])
        shrink = tl.exp2(best - new_best)
        mass = mass * shrink + tl.sum(weights, axis=1)
        mix = mix * shrink[:, None] + tl.dot(weights.to(values.dtype), values)
    # an empty sequence never added anything: mass 0, mix 0, and its output is zeros
    mass = tl.maximum(mass, 1e-30)
    tl.store(out_ptr + rows, (mix / mass[:, None]).to(out_ptr.dtype.element_ty), mask=tile)


@triton.jit
def split_kv_kernel(max_ptr, sum_ptr, acc_ptr, query_ptr, k_cache_ptr, v_cache_ptr,
                    block_tables_ptr, seq_lens_ptr, scale, stride_q_seq, stride_q_head,
                    stride_kv_block, stride_kv_token, stride_kv_head, stride_table_seq,
                    blocks_per_split, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                    HEAD_PAD: tl.constexpr):
    # token positions rather than block counts decide what a split covers
    seq, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    member = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_PAD)
    slots = tl.arange(0, BLOCK_SIZE)
    heads = kv_head * GROUP + member
    tile = (member[:, None] < GROUP) & (dims[None, :] < HEAD_DIM)
    q = tl.load(query_ptr + seq * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :],
                mask=tile, other=0.0)
    seq_len = tl.load(seq_lens_ptr + seq)
    begin = split * blocks_per_split * BLOCK_SIZE
    end = tl.minimum(begin + blocks_per_split * BLOCK_SIZE, seq_len)
    within = slots[:, None] * stride_kv_token + kv_head * stride_kv_head + dims[None, :]
    best = tl.zeros([GROUP_PAD], tl.float32) - float("inf")
    mass = tl.zeros([GROUP_PAD], tl.float32)
    mix = tl.zeros([GROUP_PAD, HEAD_PAD], tl.float32)
    for position in range(begin, end, BLOCK_SIZE):
        start = tl.load(block_tables_ptr + seq * stride_table_seq
                        + position // BLOCK_SIZE).to(tl.int64) * stride_kv_block
        keep = position + slots < end
        load_mask = keep[:, None] & (dims[None, :] < HEAD_DIM)
        keys = tl.load(k_cache_ptr + start + within, mask=load_mask, other=0.0)
        values = tl.load(v_cache_ptr + start + within, mask=load_mask, other=0.0)
        scores = tl.where(keep[None, :], tl.dot(q, tl.trans(keys)) * scale, -float("inf"))
        new_best = tl.maximum(best, tl.max(scores, axis=1))
        weights = tl.exp(scores - new_best[:, None])
        shrink = tl.exp(best - new_best)
        mass = mass * shrink + tl.sum(weights, axis=1)
        mix = mix * shrink[:, None] + tl.dot(weights.to(values.dtype), values)
        best = new_best
    where = (seq * tl.num_programs(1) * GROUP + heads) * tl.num_programs(2) + split
    real = member < GROUP
    tl.store(max_ptr + where, best, mask=real)
    tl.store(sum_ptr + where, mass, mask=real)
    tl.store(acc_ptr + where[:, None] * HEAD_DIM + dims[None, :], mix, mask=tile)


@triton.jit
def merge_splits_kernel(out_ptr, max_ptr, sum_ptr, acc_ptr, stride_out_seq, stride_out_head,
                        num_splits, HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr,
                        SPLITS_PAD: tl.constexpr):
    # one split at a time, merged into a running partial (chapter 6's merge_partials)
    seq, head = tl.program_id(0), tl.program_id(1)
    dims = tl.arange(0, HEAD_PAD)
    inside = dims < HEAD_DIM
    first = (seq * tl.num_programs(1) + head) * num_splits
    best = tl.load(max_ptr + first)
    mass = tl.load(sum_ptr + first)
    mix = tl.load(acc_ptr + first * HEAD_DIM + dims, mask=inside, other=0.0)
    for split in range(1, num_splits):
        other = tl.load(max_ptr + first + split)
        weight = tl.load(sum_ptr + first + split)
        if weight > 0:
            if mass > 0:
                top = tl.maximum(best, other)
                mass = mass * tl.exp(best - top) + weight * tl.exp(other - top)
                mix = mix * tl.exp(best - top) + tl.load(
                    acc_ptr + (first + split) * HEAD_DIM + dims, mask=inside,
                    other=0.0) * tl.exp(other - top)
                best = top
            else:  # everything so far was empty: this split is the running partial
                best = other
                mass = weight
                mix = tl.load(acc_ptr + (first + split) * HEAD_DIM + dims, mask=inside,
                              other=0.0)
    mass = tl.where(mass > 0, mass, 1.0)  # every split empty: mix is 0, the row zeros
    tl.store(out_ptr + seq * stride_out_seq + head * stride_out_head + dims,
             (mix / mass).to(out_ptr.dtype.element_ty), mask=inside)


def paged_attention(query, k_cache, v_cache, block_tables, seq_lens, scale, num_splits=None,
                    *, validate=True):
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if validate:
        arguments = dict(query=query, k_cache=k_cache, v_cache=v_cache,
                         block_tables=block_tables, seq_lens=seq_lens)
        wrong = [n for n, t in arguments.items() if not isinstance(t, torch.Tensor)]
        if wrong:
            raise TypeError(f"{', '.join(wrong)}: torch.Tensor expected")
        if isinstance(scale, bool) or not isinstance(scale, int | float):
            raise TypeError(f"scale: a real number expected, got {type(scale).__name__}")
        if num_splits is not None and (isinstance(num_splits, bool)
                                       or not isinstance(num_splits, int)):
            raise TypeError(f"num_splits: an int or None, got {type(num_splits).__name__}")
        if num_splits is not None and num_splits <= 0:
            raise ValueError(f"num_splits: at least 1, got {num_splits}")
        shape_rules = [
            (query.dim() == 3, "query must be 3-D"),
            (k_cache.dim() == 4 and k_cache.shape == v_cache.shape, "caches: one 4-D shape"),
            (query.dim() == 3 and k_cache.dim() == 4 and query.shape[2] == k_cache.shape[3]
             and min(k_cache.shape[1:]) > 0 and query.shape[1] > 0
             and query.shape[1] % k_cache.shape[2] == 0, "heads or head_dim do not match"),
            (block_tables.dim() == 2 and block_tables.shape[0] == query.shape[0],
             "one table row per sequence"),
            (seq_lens.shape == query.shape[:1], "one length per sequence"),
            (k_cache.shape[1] & (k_cache.shape[1] - 1) == 0, "block_size: a power of two"),
        ]
        type_rules = [
            (query.dtype in (torch.float16, torch.bfloat16, torch.float32), "query dtype"),
            (k_cache.dtype == v_cache.dtype == query.dtype, "one float dtype"),
            (block_tables.dtype in (torch.int32, torch.int64)
             and seq_lens.dtype in (torch.int32, torch.int64), "int32/int64 tables, lengths"),
        ]
        place_rules = [
            (len({t.device for t in arguments.values()}) == 1, "one device"),
            (interpreted or query.device.type == "cuda", "compiled kernels need CUDA tensors"),
            (interpreted or k_cache.shape[1] >= (8 if query.dtype == torch.float32 else 16),
             "block_size: tl.dot's K on a GPU"),
            (k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1,
             "cache strides: shared, head_dim contiguous"),
        ]
        for rules, error in ((shape_rules, ValueError), (type_rules, TypeError),
                             (place_rules, ValueError)):
            broken = [message for ok, message in rules if not ok]
            if broken:
                raise error("; ".join(broken))
        block_size, num_blocks = k_cache.shape[1], k_cache.shape[0]
        for seq, length in enumerate(seq_lens.tolist()):
            if not 0 <= length <= block_tables.shape[1] * block_size:
                raise ValueError(f"seq_lens[{seq}] = {length}: outside what its table row "
                                 "covers")
            ids = block_tables[seq, :triton.cdiv(length, block_size)].tolist()
            if any(not 0 <= i < num_blocks for i in ids):
                raise ValueError(f"block_tables row {seq}: a block id outside the pool")
    if interpreted and query.dtype == torch.bfloat16:
        out = paged_attention(query.float(), k_cache.float(), v_cache.float(), block_tables,
                              seq_lens, scale, num_splits, validate=False)
        return out.bfloat16()
    splits = num_splits or choose_num_splits(len(query), k_cache.shape[2],
                                             block_tables.shape[1], query.device)
    if splits > 1:
        return run_split_kv(split_kv_kernel, merge_splits_kernel, query, k_cache, v_cache,
                            block_tables, seq_lens, scale, splits)
    return launch(paged_attention_kernel, query, k_cache, v_cache, block_tables, seq_lens,
                  scale)
