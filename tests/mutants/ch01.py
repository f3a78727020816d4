"""Wrong chapter 1 solutions, as learners write them, with the hint each must get.

``MUTANTS[function] = [(mutant, hint fragment), ...]``: the checks for ``function`` must fail
on every mutant, and the failure message must contain the fragment.
"""

from __future__ import annotations

import math
import types

from course import kv_sizing


def _in_notebook(function, name, **beside):
    """``function`` as a notebook holds it, with earlier TODOs' versions ``beside`` it."""
    return types.FunctionType(function.__code__, {**function.__globals__, **beside}, name,
                              function.__defaults__)


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


def _unwritten(*args, **kwargs):
    raise NotImplementedError()


# a right kv_bytes_per_sequence next to a kv_bytes_per_token without its factor 2, and next to
# an unwritten mla_kv_bytes_per_token
_sequence_on_a_wrong_kv_bytes_per_token = _in_notebook(
    kv_sizing.kv_bytes_per_sequence, "_sequence_on_a_wrong_kv_bytes_per_token",
    kv_bytes_per_token=_without_factor_two)
_sequence_on_an_unwritten_mla = _in_notebook(
    kv_sizing.kv_bytes_per_sequence, "_sequence_on_an_unwritten_mla",
    mla_kv_bytes_per_token=_unwritten)


def _float_blocks(gpu_memory_bytes, gpu_memory_utilization, weight_bytes,
                  activation_peak_bytes, bytes_per_block):
    budget = gpu_memory_bytes * gpu_memory_utilization - weight_bytes - activation_peak_bytes
    return max(0, budget // bytes_per_block)  # a float budget floor-divides to 7168.0


def _contiguous_uncapped(lengths, capacity_tokens, max_model_len):
    return capacity_tokens // max_model_len


def _contiguous_real_lengths(lengths, capacity_tokens, max_model_len):
    return kv_sizing.requests_fit_paged(lengths, capacity_tokens, 1)


def _contiguous_no_length_check(lengths, capacity_tokens, max_model_len):
    return min(len(lengths), capacity_tokens // max_model_len)


def _contiguous_checks_admitted_only(lengths, capacity_tokens, max_model_len):
    admitted, left = 0, capacity_tokens
    for length in lengths:
        if left < max_model_len:
            break
        if length > max_model_len:
            raise ValueError(length)
        admitted, left = admitted + 1, left - max_model_len
    return admitted


def _contiguous_rejects_full_length(lengths, capacity_tokens, max_model_len):
    if any(n >= max_model_len for n in lengths):
        raise ValueError("too long")
    return min(len(lengths), capacity_tokens // max_model_len)


def _contiguous_strict_pool(lengths, capacity_tokens, max_model_len):
    if any(n > max_model_len for n in lengths):
        raise ValueError("too long")
    admitted, left = 0, capacity_tokens
    for _ in lengths:
        if left <= max_model_len:
            break
        admitted, left = admitted + 1, left - max_model_len
    return admitted


def _contiguous_float(lengths, capacity_tokens, max_model_len):
    if any(n > max_model_len for n in lengths):
        raise ValueError("too long")
    return min(len(lengths), capacity_tokens / max_model_len // 1)


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


def _paged_strict(lengths, capacity_tokens, block_size):
    free, admitted = capacity_tokens // block_size, 0
    for length in lengths:
        need = -(-length // block_size)
        if need >= free:
            break
        free, admitted = free - need, admitted + 1
    return admitted


def _paged_plus_one_block(lengths, capacity_tokens, block_size):
    free, admitted = capacity_tokens // block_size, 0
    for length in lengths:
        need = length // block_size + 1
        if need > free:
            break
        free, admitted = free - need, admitted + 1
    return admitted


def _paged_off_by_one(lengths, capacity_tokens, block_size):
    return min(len(lengths), kv_sizing.requests_fit_paged(lengths, capacity_tokens, block_size) + 1)


MUTANTS = {
    "kv_bytes_per_token": [
        (_without_factor_two, "the cache holds both"),
        (_one_layer, "one layer's share"),
        (_elements_not_bytes, "counts elements, not bytes"),
        (_fp16_always, "the fp16 size"),
    ],
    "mla_kv_bytes_per_token": [
        (_mla_with_factor_two, "rebuilt from the one cached latent"),
        (_mla_without_rope, "RoPE key"),
    ],
    "kv_bytes_per_sequence": [
        (_query_heads, "query heads"),
        (_mla_as_mha, "uses MLA"),
        (_sequence_ignores_dtype, "the fp16 size"),
        (_sequence_off_by_one, "one token's cache for each of its tokens"),
        (_sequence_on_a_wrong_kv_bytes_per_token, "Fix kv_bytes_per_token first"),
        (_sequence_on_an_unwritten_mla, "Write mla_kv_bytes_per_token first"),
    ],
    "num_gpu_blocks": [
        (_no_utilization, "gpu_memory_utilization"),
        (_no_activations, "activation peak"),
        (_negative_blocks, "never negative"),
        (_rounds_up, "only whole blocks fit"),
        (_float_blocks, "returned 7168.0, a float; it promises an int"),
    ],
    "requests_fit_contiguous": [
        (_contiguous_uncapped, "only len(lengths) requests"),
        (_contiguous_real_lengths, "reserves max_model_len"),
        (_contiguous_no_length_check, "wherever it stands"),
        (_contiguous_checks_admitted_only, "wherever it stands"),
        (_contiguous_rejects_full_length, "exactly max_model_len tokens is allowed"),
        (_contiguous_strict_pool, "the last reservation fits exactly"),
        (_contiguous_float, "a float; it promises an int"),
    ],
    "requests_fit_paged": [
        (_paged_tokens_not_blocks, "tokens, not blocks"),
        (_paged_overtaking, "overtook"),
        (_paged_floor, "rounded down"),
        (_paged_off_by_one, "first come, first served"),
        (_paged_strict, "exactly the blocks left fits"),
        (_paged_plus_one_block, "fills exactly k blocks"),
    ],
}
