"""Chapter 10 solved another way: bytes counted layer by layer, slots tested position by
position, hits found by trying every length from the longest down, and the window's first key
as the keys it has left behind."""

from __future__ import annotations

import triton
import triton.language as tl

from course.v1.hybrid_cache import NULL_BLOCK, full_attention_hit


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


@triton.jit
def window_first_key(context, window):
    # the keys the window has left behind: none while the request is no longer than it
    return context - tl.minimum(context, window)
