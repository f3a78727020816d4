"""Wrong chapter 1 solutions, as learners write them, with the hint each must get.

``MUTANTS[function] = [(mutant, hint fragment), ...]``: the checks for ``function`` must fail
on every mutant, and the failure message must contain the fragment. ``RULES``: each rule the
notebook states about a TODO, with the mutants that break it alone.
"""

from __future__ import annotations

import math

from course.experiments import kv_sizing
from mutants import Rule


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


def _mla_one_layer(num_layers, kv_lora_rank, qk_rope_head_dim, bytes_per_element):
    return (kv_lora_rank + qk_rope_head_dim) * bytes_per_element


def _mla_elements_not_bytes(num_layers, kv_lora_rank, qk_rope_head_dim, bytes_per_element):
    return num_layers * (kv_lora_rank + qk_rope_head_dim)


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


def _no_weights(gpu_memory_bytes, gpu_memory_utilization, weight_bytes,
                activation_peak_bytes, bytes_per_block):
    budget = gpu_memory_bytes * gpu_memory_utilization - activation_peak_bytes
    return max(0, int(budget // bytes_per_block))


def _negative_blocks(gpu_memory_bytes, gpu_memory_utilization, weight_bytes,
                     activation_peak_bytes, bytes_per_block):
    budget = gpu_memory_bytes * gpu_memory_utilization - weight_bytes - activation_peak_bytes
    return int(budget // bytes_per_block)


def _rounds_up(gpu_memory_bytes, gpu_memory_utilization, weight_bytes,
               activation_peak_bytes, bytes_per_block):
    budget = gpu_memory_bytes * gpu_memory_utilization - weight_bytes - activation_peak_bytes
    return max(0, math.ceil(budget / bytes_per_block))


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


def _paged_counts_by_index(lengths, capacity_tokens, block_size):
    free = capacity_tokens // block_size
    for index, length in enumerate(lengths):
        need = -(-length // block_size)
        if need > free:
            return index
        free -= need
    return index + 1  # no requests: the loop never bound index


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
        (_mla_one_layer, "one layer's share"),
        (_mla_elements_not_bytes, "counted in bytes"),
    ],
    "kv_bytes_per_sequence": [
        (_query_heads, "query heads"),
        (_mla_as_mha, "uses MLA"),
        (_sequence_ignores_dtype, "the fp16 size"),
        (_sequence_off_by_one, "one token's cache for each of its tokens"),
    ],
    "num_gpu_blocks": [
        (_no_utilization, "gpu_memory_utilization"),
        (_no_activations, "activation peak"),
        (_no_weights, "You left the weights in"),
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
        (_paged_counts_by_index, "With no requests there is nothing to count"),
    ],
}

RULES = [
    Rule("Each layer stores a key and a value vector of ``head_dim`` elements for each KV head.",
         "kv_bytes_per_token", ("_without_factor_two",)),
    Rule("Bytes of KV cache one token occupies across all layers", "kv_bytes_per_token",
         ("_one_layer",)),
    Rule("bytes: ... x bytes_per_element (fp16/bf16: 2, fp8: 1, fp32: 4)", "kv_bytes_per_token",
         ("_elements_not_bytes", "_fp16_always")),
    Rule("There is no factor 2 and no head count", "mla_kv_bytes_per_token",
         ("_mla_with_factor_two",)),
    Rule("plus one small **decoupled RoPE key** of `qk_rope_head_dim` elements",
         "mla_kv_bytes_per_token", ("_mla_without_rope",)),
    Rule("Each layer caches one compressed **latent** vector", "mla_kv_bytes_per_token",
         ("_mla_one_layer",)),
    Rule("Bytes of cache one token occupies in a multi-head latent attention (MLA) model.",
         "mla_kv_bytes_per_token", ("_mla_elements_not_bytes",)),
    Rule("Read the KV head count from `config.num_kv_heads` (not `config.num_attention_heads`)",
         "kv_bytes_per_sequence", ("_query_heads",)),
    Rule("use your MLA function when `config.kv_lora_rank` is set", "kv_bytes_per_sequence",
         ("_mla_as_mha",)),
    Rule("A sequence of `n` tokens needs `n` times the per-token bytes.",
         "kv_bytes_per_sequence", ("_sequence_off_by_one",)),
    Rule("fp8 KV halves the bytes per block", "kv_bytes_per_sequence",
         ("_sequence_ignores_dtype",)),
    Rule("The engine may use ``gpu_memory_bytes x gpu_memory_utilization``", "num_gpu_blocks",
         ("_no_utilization",)),
    Rule("the weights and the activation peak of a forward pass come off first",
         "num_gpu_blocks", ("_no_activations", "_no_weights")),
    Rule("Round down to whole blocks", "num_gpu_blocks", ("_rounds_up",)),
    Rule("never return a negative count", "num_gpu_blocks", ("_negative_blocks",)),
    Rule("Return an `int`: a count of blocks is `7168`, not `7168.0`.", "num_gpu_blocks",
         ("_float_blocks",)),
    Rule("How many of ``lengths`` can be resident at once", "requests_fit_contiguous",
         ("_contiguous_uncapped",)),
    Rule("each request reserves `max_model_len` slots, whatever its length (0 tokens included)",
         "requests_fit_contiguous", ("_contiguous_real_lengths", "_contiguous_strict_pool")),
    Rule("a request of exactly `max_model_len` tokens is allowed", "requests_fit_contiguous",
         ("_contiguous_rejects_full_length",)),
    Rule("If `lengths` holds a request longer than `max_model_len`, wherever it stands, raise "
         "`ValueError` before counting anything.", "requests_fit_contiguous",
         ("_contiguous_no_length_check", "_contiguous_checks_admitted_only")),
    Rule("Return an `int` (no requests: 0).", "requests_fit_contiguous", ("_contiguous_float",)),
    Rule("a request of `n` tokens holds `ceil(n / block_size)` blocks", "requests_fit_paged",
         ("_paged_tokens_not_blocks", "_paged_floor", "_paged_plus_one_block")),
    Rule("admit requests in order (first come, first served) while their blocks fit, and stop "
         "at the first one that does not", "requests_fit_paged",
         ("_paged_overtaking", "_paged_off_by_one")),
    Rule("A request that takes exactly the blocks left fits", "requests_fit_paged",
         ("_paged_strict",)),
    Rule("Returns an ``int``; no requests, 0.", "requests_fit_paged", ("_paged_counts_by_index",)),
]
