"""Chapter 10 solved another way: bytes counted layer by layer, slots tested position by
position, hits found by trying every length from the longest down, a step's blocks counted
before anything changes but the freed ones, and the window's attention in two passes (the
scores' maximum, then the weighted sum) instead of an online softmax."""

from __future__ import annotations

import triton
import triton.language as tl

from course.hybrid_cache import NULL_BLOCK, full_attention_hit


def request_bytes(model, num_tokens, bytes_per_element=2):
    elements = 0
    for group in model.groups:
        for _layer in range(group.num_layers):
            if group.state_elements:  # a state layer: one state, once a token is seen
                elements += group.state_elements if num_tokens > 0 else 0
                continue
            seen = num_tokens if group.window is None else min(num_tokens, group.window)
            elements += seen * group.num_kv_heads * group.head_dim * 2
    return elements * bytes_per_element


def free_skipped_blocks(table, num_computed, window, block_size):
    oldest_seen = num_computed - window + 1  # the next token's window starts here
    freed = []
    for index, block in enumerate(table):
        if (index + 1) * block_size > oldest_seen:
            break
        if block != NULL_BLOCK:
            freed.append(block)
            table[index] = NULL_BLOCK
    return freed


def sliding_window_hit(cached, max_length, block_size, window):
    for length in range(max_length - max_length % block_size, 0, -block_size):
        first_needed = max(0, length - (window - 1)) // block_size
        if all(block in cached for block in range(first_needed, length // block_size)):
            return length
    return 0


def hybrid_hit(groups, num_tokens, block_size):
    longest = (num_tokens - 1) - (num_tokens - 1) % block_size
    for length in range(longest, 0, -block_size):
        accepted = True
        for cached, window in groups:
            hit = (full_attention_hit(cached, length, block_size) if window is None
                   else sliding_window_hit(cached, length, block_size, window))
            accepted = accepted and hit == length
        if accepted:
            return length
    return 0


class HybridBlockManager:
    """The pool as a list of free blocks and, per request, one table per group; a step's
    blocks counted before any is taken."""

    def __init__(self, num_blocks, block_size, windows):
        self.block_size, self.windows = block_size, tuple(windows)
        self.free_blocks = list(range(1, num_blocks))
        self.tables = {}

    def blocks_to_allocate(self, request, num_tokens):
        blocks = -(-num_tokens // self.block_size)
        return [max(0, blocks - len(table))
                for table in self.tables.get(request, [[]] * len(self.windows))]

    def allocate_slots(self, request, num_computed, num_new):
        if not (num_computed >= 0 and num_new >= 1):
            raise ValueError(f"a step computes 1 or more tokens, got {num_new} after "
                             f"{num_computed}")
        tables = self.tables[request] if request in self.tables else [[] for _ in self.windows]
        for group, window in enumerate(self.windows):
            if window is not None:
                freed = free_skipped_blocks(tables[group], num_computed, window, self.block_size)
                self._give_back(freed)
        blocks = -(-(num_computed + num_new) // self.block_size)
        wanted = [max(0, blocks - len(table)) for table in tables]
        if sum(wanted) > self.num_free():
            return False
        new_blocks = [self._take() for _ in range(sum(wanted))]
        for table, count in zip(tables, wanted, strict=True):
            table += new_blocks[:count]
            del new_blocks[:count]
        self.tables[request] = tables
        return True

    def free(self, request):
        for table in self.tables.pop(request, []):
            self._give_back([block for block in table[::-1] if block != NULL_BLOCK])

    def num_free(self):
        return len(self.free_blocks)

    def _take(self):
        return self.free_blocks.pop(0)

    def _give_back(self, blocks):
        self.free_blocks.extend(blocks)


ALTERNATIVES = [HybridBlockManager]


@triton.jit
def sliding_window_kernel(
    out_ptr, query_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, scale,
    window,
    stride_q_seq, stride_q_head,
    stride_kv_block, stride_kv_token, stride_kv_head,
    stride_table_seq,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr,
):
    # two passes over the window's blocks: the scores' maximum first, then the weighted sum
    seq, kv_head = tl.program_id(0), tl.program_id(1)
    group_rows = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_PAD)
    slots = tl.arange(0, BLOCK_SIZE)
    q_ptrs = (query_ptr + seq * stride_q_seq + (kv_head * GROUP + group_rows)[:, None]
              * stride_q_head + dims[None, :])
    q_ok = (group_rows < GROUP)[:, None] & (dims < HEAD_DIM)[None, :]
    q = tl.load(q_ptrs, mask=q_ok, other=0.0).to(tl.float32)
    end = tl.load(seq_lens_ptr + seq)
    start = end - window
    start = tl.where(start > 0, start, 0)
    lo = start // BLOCK_SIZE
    hi = (end + BLOCK_SIZE - 1) // BLOCK_SIZE
    row = block_tables_ptr + seq * stride_table_seq

    best = tl.zeros([GROUP_PAD], tl.float32) - float("inf")
    for b in range(lo, hi):
        physical = tl.load(row + b).to(tl.int64)
        where = b * BLOCK_SIZE + slots
        seen = (where >= start) & (where < end)
        k = tl.load(k_cache_ptr + physical * stride_kv_block + slots[:, None] * stride_kv_token
                    + kv_head * stride_kv_head + dims[None, :],
                    mask=seen[:, None] & (dims < HEAD_DIM)[None, :], other=0.0).to(tl.float32)
        s = tl.where(seen[None, :], tl.dot(q, tl.trans(k)) * scale, float("-inf"))
        best = tl.maximum(best, tl.max(s, axis=1))

    norm = tl.zeros([GROUP_PAD], tl.float32)
    summed = tl.zeros([GROUP_PAD, HEAD_PAD], tl.float32)
    for b in range(lo, hi):
        physical = tl.load(row + b).to(tl.int64)
        where = b * BLOCK_SIZE + slots
        seen = (where >= start) & (where < end)
        base = (physical * stride_kv_block + slots[:, None] * stride_kv_token
                + kv_head * stride_kv_head + dims[None, :])
        kv_ok = seen[:, None] & (dims < HEAD_DIM)[None, :]
        k = tl.load(k_cache_ptr + base, mask=kv_ok, other=0.0).to(tl.float32)
        v = tl.load(v_cache_ptr + base, mask=kv_ok, other=0.0).to(tl.float32)
        s = tl.where(seen[None, :], tl.dot(q, tl.trans(k)) * scale, float("-inf"))
        p = tl.exp(s - best[:, None])
        norm += tl.sum(p, axis=1)
        summed += tl.dot(p, v)

    result = tl.where(norm[:, None] > 0, summed / tl.where(norm > 0, norm, 1.0)[:, None], 0.0)
    out_ptrs = (out_ptr + seq * stride_q_seq + (kv_head * GROUP + group_rows)[:, None]
                * stride_q_head + dims[None, :])
    tl.store(out_ptrs, result.to(out_ptr.dtype.element_ty), mask=q_ok)
