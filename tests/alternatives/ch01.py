"""Chapter 1 solved another way: loops and fractions instead of one-line formulas."""

from __future__ import annotations

import math
from fractions import Fraction


def kv_bytes_per_token(num_layers, num_kv_heads, head_dim, bytes_per_element):
    total = 0
    for _layer in range(num_layers):
        for _tensor in ("key", "value"):
            total += num_kv_heads * head_dim * bytes_per_element
    return total


def mla_kv_bytes_per_token(num_layers, kv_lora_rank, qk_rope_head_dim, bytes_per_element):
    widths = [kv_lora_rank, qk_rope_head_dim]
    return sum(widths) * bytes_per_element * num_layers


def kv_bytes_per_sequence(config, num_tokens, bytes_per_element=2):
    if getattr(config, "kv_lora_rank", None):
        per_token = mla_kv_bytes_per_token(config.num_layers, config.kv_lora_rank,
                                           config.qk_rope_head_dim, bytes_per_element)
    else:
        per_token = kv_bytes_per_token(config.num_layers, config.num_kv_heads, config.head_dim,
                                       bytes_per_element)
    return num_tokens * per_token


def num_gpu_blocks(gpu_memory_bytes, gpu_memory_utilization, weight_bytes,
                   activation_peak_bytes, bytes_per_block):
    usable = Fraction(str(gpu_memory_utilization)) * gpu_memory_bytes
    left = usable - weight_bytes - activation_peak_bytes
    if left < bytes_per_block:
        return 0
    return math.floor(left / bytes_per_block)


def requests_fit_contiguous(lengths, capacity_tokens, max_model_len):
    if max(lengths, default=0) > max_model_len:
        raise ValueError("a request is longer than max_model_len")
    count = 0
    remaining = capacity_tokens
    for _ in lengths:
        if remaining < max_model_len:
            break
        remaining -= max_model_len
        count += 1
    return count


def requests_fit_paged(lengths, capacity_tokens, block_size):
    blocks_needed = [math.ceil(n / block_size) for n in lengths]
    running_total, pool = 0, capacity_tokens // block_size
    for count, need in enumerate(blocks_needed):
        running_total += need
        if running_total > pool:
            return count
    return len(lengths)
