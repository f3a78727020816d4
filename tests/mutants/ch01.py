"""Wrong chapter 1 solutions, as learners write them, with the hint each must get.

``MUTANTS[function] = [(mutant, hint fragment), ...]``: the checks for ``function`` must fail
on every mutant, and the failure message must contain the fragment.
"""

from __future__ import annotations

import math

from course import kv_sizing


def _without_factor_two(num_layers, num_kv_heads, head_dim, bytes_per_element):
    return num_layers * num_kv_heads * head_dim * bytes_per_element


def _one_layer(num_layers, num_kv_heads, head_dim, bytes_per_element):
    return 2 * num_kv_heads * head_dim * bytes_per_element


def _elements_not_bytes(num_layers, num_kv_heads, head_dim, bytes_per_element):
    return 2 * num_layers * num_kv_heads * head_dim


def _fp16_always(num_layers, num_kv_heads, head_dim, bytes_per_element):
    return 2 * num_layers * num_kv_heads * head_dim * 2


def _mla_with_factor_two(num_layers, kv_lora_rank, qk_rope_head_dim, bytes_per_element):
    return 2 * num_layers * (kv_lora_rank + qk_rope_head_dim) * bytes_per_element


def _mla_without_rope(num_layers, kv_lora_rank, qk_rope_head_dim, bytes_per_element):
    return num_layers * kv_lora_rank * bytes_per_element


def _query_heads(config, num_tokens, bytes_per_element=2):
    return (2 * config.num_layers * config.num_attention_heads * config.head_dim
            * bytes_per_element * num_tokens)


def _mla_as_mha(config, num_tokens, bytes_per_element=2):
    return kv_sizing.kv_bytes_per_token(config.num_layers, config.num_kv_heads, config.head_dim,
                                        bytes_per_element) * num_tokens


def _sequence_ignores_dtype(config, num_tokens, bytes_per_element=2):
    return kv_sizing.kv_bytes_per_sequence(config, num_tokens, 2)


def _sequence_off_by_one(config, num_tokens, bytes_per_element=2):
    return kv_sizing.kv_bytes_per_sequence(config, num_tokens + 1, bytes_per_element)


def _no_utilization(gpu_memory_bytes, gpu_memory_utilization, weight_bytes,
                    activation_peak_bytes, bytes_per_block):
    return max(0, (gpu_memory_bytes - weight_bytes - activation_peak_bytes) // bytes_per_block)


def _no_activations(gpu_memory_bytes, gpu_memory_utilization, weight_bytes,
                    activation_peak_bytes, bytes_per_block):
    budget = gpu_memory_bytes * gpu_memory_utilization - weight_bytes
    return max(0, int(budget // bytes_per_block))


def _negative_blocks(gpu_memory_bytes, gpu_memory_utilization, weight_bytes,
                     activation_peak_bytes, bytes_per_block):
    budget = gpu_memory_bytes * gpu_memory_utilization - weight_bytes - activation_peak_bytes
    return int(budget // bytes_per_block)


def _rounds_up(gpu_memory_bytes, gpu_memory_utilization, weight_bytes,
               activation_peak_bytes, bytes_per_block):
    budget = gpu_memory_bytes * gpu_memory_utilization - weight_bytes - activation_peak_bytes
    return max(0, math.ceil(budget / bytes_per_block))


def _contiguous_uncapped(lengths, capacity_tokens, max_model_len):
    return capacity_tokens // max_model_len


def _contiguous_real_lengths(lengths, capacity_tokens, max_model_len):
    return kv_sizing.requests_fit_paged(lengths, capacity_tokens, 1)


def _paged_tokens_not_blocks(lengths, capacity_tokens, block_size):
    return kv_sizing.requests_fit_paged(lengths, capacity_tokens, 1)


def _paged_overtaking(lengths, capacity_tokens, block_size):
    free, admitted = capacity_tokens // block_size, 0
    for length in lengths:
        need = -(-length // block_size)
        if need <= free:
            free, admitted = free - need, admitted + 1
    return admitted


def _paged_floor(lengths, capacity_tokens, block_size):
    free, admitted = capacity_tokens // block_size, 0
    for length in lengths:
        need = length // block_size
        if need > free:
            break
        free, admitted = free - need, admitted + 1
    return admitted


def _paged_off_by_one(lengths, capacity_tokens, block_size):
    return min(len(lengths), kv_sizing.requests_fit_paged(lengths, capacity_tokens, block_size) + 1)


MUTANTS = {
    "kv_bytes_per_token": [
        (_without_factor_two, "multiply by 2"),
        (_one_layer, "multiply by num_layers"),
        (_elements_not_bytes, "counts elements, not bytes"),
        (_fp16_always, "the fp16 size"),
    ],
    "mla_kv_bytes_per_token": [
        (_mla_with_factor_two, "no factor 2 in MLA"),
        (_mla_without_rope, "RoPE key"),
    ],
    "kv_bytes_per_sequence": [
        (_query_heads, "query heads"),
        (_mla_as_mha, "uses MLA"),
        (_sequence_ignores_dtype, "the fp16 size"),
        (_sequence_off_by_one, "times its number of tokens"),
    ],
    "num_gpu_blocks": [
        (_no_utilization, "gpu_memory_utilization"),
        (_no_activations, "activation peak"),
        (_negative_blocks, "never a negative count"),
        (_rounds_up, "round down"),
    ],
    "requests_fit_contiguous": [
        (_contiguous_uncapped, "only len(lengths) requests"),
        (_contiguous_real_lengths, "reserves max_model_len"),
    ],
    "requests_fit_paged": [
        (_paged_tokens_not_blocks, "tokens, not blocks"),
        (_paged_overtaking, "overtook"),
        (_paged_floor, "rounded down"),
        (_paged_off_by_one, "first come, first served"),
    ],
}
