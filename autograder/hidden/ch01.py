"""Chapter 1's hidden checks: edge cases and seeded random cases, checked against independent
formulas (per layer, per head, in exact fractions: a mistake shared with the course's own
answer cannot hide), and the known mistakes that a hint names. The visible checks ask their
expected values of the ``*_case`` functions here.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from fractions import Fraction

from autograder.checks._contract import INT, Raises, expect_cases
from autograder.checks._helpers import mistakes
from autograder.checks._lending import one_bug_one_todo_of_function
from autograder.checks.ch01 import (
    BLOCKS_IDEA,
    KV_TOKEN_IDEA,
    MLA_IDEA,
    SEQ_IDEA,
    GiB,
    KiB,
    MiB,
    _blocks,
    _contiguous,
    _kv_token,
    _mla,
    _paged,
    _sequence,
    contiguous_idea,
    paged_idea,
    per_token_todo,
)
from autograder.private import thorough
from course.experiments import kv_sizing
from course.experiments.models import MODELS, ModelConfig

SEED = 2023  # random cases are seeded: grading a notebook twice gives the same score

# --- kv_bytes_per_token --------------------------------------------------------------------

_KV_TOKEN_MISTAKES = [
    (lambda num_layers, num_kv_heads, head_dim, bytes_per_element:
        num_layers * num_kv_heads * head_dim * bytes_per_element,
     "That counts keys only (or values only): the cache holds both."),
    (lambda num_layers, num_kv_heads, head_dim, bytes_per_element:
        2 * num_kv_heads * head_dim * bytes_per_element,
     "That is one layer's share: every layer keeps its own keys and values."),
    (lambda num_layers, num_kv_heads, head_dim, bytes_per_element:
        2 * num_layers * num_kv_heads * head_dim,
     "That counts elements, not bytes: an element takes bytes_per_element bytes."),
    (lambda num_layers, num_kv_heads, head_dim, bytes_per_element:
        16 * num_layers * num_kv_heads * head_dim * bytes_per_element,
     "That is in bits: bytes_per_element is already a number of bytes."),
    (lambda num_layers, num_kv_heads, head_dim, bytes_per_element:
        4 * num_layers * num_kv_heads * head_dim if bytes_per_element != 2 else None,
     "That is the fp16 size, whatever bytes_per_element says."),
]


def kv_token_case(**case) -> tuple[float, list]:
    per_layer = sum(case["head_dim"] * case["bytes_per_element"]
                    for _tensor in ("K", "V") for _head in range(case["num_kv_heads"]))
    return per_layer * case["num_layers"], mistakes(_KV_TOKEN_MISTAKES, case)


@thorough
def check_kv_bytes_per_token_thoroughly(fn: Callable) -> None:
    """One layer, MQA, fp8 and fp32, and seeded random shapes."""
    rng = random.Random(SEED)
    cases = [(1, 32, 128, 2), (32, 1, 64, 2), (80, 8, 128, 1), (40, 40, 128, 4), (3, 5, 7, 1)]
    cases += [(rng.randint(1, 128), rng.randint(1, 64), rng.choice([32, 64, 80, 96, 128, 256]),
               rng.choice([1, 2, 4])) for _ in range(40)]
    expect_cases(fn, [_kv_token(*c) for c in cases], kv_token_case, KV_TOKEN_IDEA)


# --- mla_kv_bytes_per_token ----------------------------------------------------------------

_MLA_MISTAKES = [
    (lambda num_layers, kv_lora_rank, qk_rope_head_dim, bytes_per_element:
        2 * num_layers * (kv_lora_rank + qk_rope_head_dim) * bytes_per_element,
     "MLA keeps no separate keys and values: both are rebuilt from the one cached latent."),
    (lambda num_layers, kv_lora_rank, qk_rope_head_dim, bytes_per_element:
        num_layers * kv_lora_rank * bytes_per_element,
     "The decoupled RoPE key (qk_rope_head_dim elements) is cached too."),
    (lambda num_layers, kv_lora_rank, qk_rope_head_dim, bytes_per_element:
        (kv_lora_rank + qk_rope_head_dim) * bytes_per_element,
     "That is one layer's share: every layer caches its own latent and RoPE key."),
]


def mla_case(**case) -> tuple[float, list]:
    latent = case["kv_lora_rank"] * case["bytes_per_element"] * case["num_layers"]
    rope_key = case["qk_rope_head_dim"] * case["bytes_per_element"] * case["num_layers"]
    return latent + rope_key, mistakes(_MLA_MISTAKES, case)


@thorough
def check_mla_kv_bytes_per_token_thoroughly(fn: Callable) -> None:
    """One layer, no RoPE part, fp8 and fp32, and seeded random shapes."""
    rng = random.Random(SEED + 1)
    cases = [(1, 512, 64, 2), (27, 512, 64, 1), (4, 16, 0, 4)]
    cases += [(rng.randint(1, 96), rng.choice([128, 256, 512, 1024]), rng.choice([0, 32, 64]),
               rng.choice([1, 2, 4])) for _ in range(30)]
    expect_cases(fn, [_mla(*c) for c in cases], mla_case, MLA_IDEA)


# --- kv_bytes_per_sequence -----------------------------------------------------------------


def _sequence_oracle(config: ModelConfig, num_tokens: int, bpe: float) -> float:
    if config.kv_lora_rank is not None:
        per_layer = (config.kv_lora_rank + config.qk_rope_head_dim) * bpe
    else:
        per_layer = 2 * config.num_kv_heads * config.head_dim * bpe
    return sum(per_layer * num_tokens for _layer in range(config.num_layers))


_SEQ_MISTAKES = [
    (lambda config, num_tokens, bytes_per_element=2:
        2 * config.num_layers * config.num_attention_heads * config.head_dim
        * bytes_per_element * num_tokens if config.kv_lora_rank is None else None,
     "You counted query heads (num_attention_heads): in GQA and MQA several query heads share "
     "one KV head, and the cache stores only the KV heads."),
    (lambda config, num_tokens, bytes_per_element=2:
        2 * config.num_layers * config.num_kv_heads * config.head_dim * bytes_per_element
        * num_tokens if config.kv_lora_rank is not None else None,
     "This model uses MLA (kv_lora_rank is set): it caches the compressed latent, not per-head "
     "keys and values."),
    (lambda config, num_tokens, bytes_per_element=2:
        2 * config.num_layers * config.num_kv_heads * config.head_dim * bytes_per_element,
     "That is one token's cache, not the whole sequence's."),
    (lambda config, num_tokens, bytes_per_element=2:
        _sequence_oracle(config, num_tokens, 2),
     "That is the fp16 size, whatever bytes_per_element says."),
]


def sequence_case(**case) -> tuple[float, list]:
    expected = _sequence_oracle(case["config"], case["num_tokens"], case["bytes_per_element"])
    return expected, mistakes(_SEQ_MISTAKES, case)


def _random_config(rng: random.Random, index: int) -> ModelConfig:
    kv_heads = rng.choice([1, 2, 4, 8])
    return ModelConfig(f"random-{index}", num_layers=rng.randint(1, 64),
                       num_attention_heads=kv_heads * rng.choice([1, 2, 4, 8]),
                       num_kv_heads=kv_heads, head_dim=rng.choice([64, 128]),
                       num_params=1e9, source="random test model")


@thorough
def check_kv_bytes_per_sequence_thoroughly(fn: Callable) -> None:
    """Zero tokens, one layer, MQA, fp8, every published model, random GQA models. A wrong
    per-token TODO costs its own points alone: where ``fn`` fails, it runs again with the
    course's per-token functions lent, and fails only where that fails too."""
    rng = random.Random(SEED + 2)
    one_layer = ModelConfig("one-layer", 1, 4, 2, 16, 1e6, "test model")
    cases = [(MODELS["Llama-3-8B"], 0, 2), (one_layer, 5, 2), (MODELS["Falcon-7B"], 2048, 2),
             (MODELS["Llama-2-70B"], 4096, 1), (MODELS["DeepSeek-V2"], 4096, 1)]
    cases += [(model, rng.randint(1, 32768), rng.choice([1, 2])) for model in MODELS.values()]
    cases += [(_random_config(rng, i), rng.randint(0, 8192), rng.choice([1, 2, 4]))
              for i in range(20)]
    one_bug_one_todo_of_function(
        lambda subject: expect_cases(
            subject, [_sequence(*c) for c in cases], sequence_case, SEQ_IDEA,
            earlier=lambda case: per_token_todo(case, sys.modules[__name__])),
        fn, {name: getattr(kv_sizing, name)
             for name in ("kv_bytes_per_token", "mla_kv_bytes_per_token")})


# --- num_gpu_blocks ------------------------------------------------------------------------


def _budget(gpu, util, weights, activations):
    return gpu * util - weights - activations


_BLOCKS_MISTAKES = [
    (lambda gpu_memory_bytes, gpu_memory_utilization, weight_bytes, activation_peak_bytes,
     bytes_per_block: (gpu_memory_bytes - weight_bytes - activation_peak_bytes)
        // bytes_per_block,
     "You used all of the GPU's memory: the engine may use only gpu_memory_utilization of it."),
    (lambda gpu_memory_bytes, gpu_memory_utilization, weight_bytes, activation_peak_bytes,
     bytes_per_block: (gpu_memory_bytes * gpu_memory_utilization - weight_bytes)
        // bytes_per_block,
     "The activation peak of a forward pass needs its room too."),
    (lambda gpu_memory_bytes, gpu_memory_utilization, weight_bytes, activation_peak_bytes,
     bytes_per_block: gpu_memory_bytes * gpu_memory_utilization // bytes_per_block,
     "The weights and the activation peak share the engine's memory with the cache."),
    (lambda gpu_memory_bytes, gpu_memory_utilization, weight_bytes, activation_peak_bytes,
     bytes_per_block: (gpu_memory_bytes * gpu_memory_utilization - activation_peak_bytes)
        // bytes_per_block,
     "You left the weights in: they are loaded before the pool is sized, and take their "
     "share first."),
    (lambda gpu_memory_bytes, gpu_memory_utilization, weight_bytes, activation_peak_bytes,
     bytes_per_block: -(-_budget(gpu_memory_bytes, gpu_memory_utilization, weight_bytes,
                                 activation_peak_bytes) // bytes_per_block),
     "That counts a partly filled block: only whole blocks fit, so a fraction left over is "
     "no block."),
    (lambda gpu_memory_bytes, gpu_memory_utilization, weight_bytes, activation_peak_bytes,
     bytes_per_block: _budget(gpu_memory_bytes, gpu_memory_utilization, weight_bytes,
                              activation_peak_bytes) // bytes_per_block,
     "A budget below zero means no room at all: a count of blocks is never negative."),
]


def _blocks_oracle(gpu: int, util: Fraction, weights: int, activations: int, block: int) -> int:
    leftover = gpu * util - weights - activations
    return leftover // block if leftover > 0 else 0


def blocks_case(**case) -> tuple[int, list]:
    util = Fraction(repr(case["gpu_memory_utilization"]))  # "0.9" exactly, not its binary float
    expected = int(_blocks_oracle(case["gpu_memory_bytes"], util, case["weight_bytes"],
                                  case["activation_peak_bytes"], case["bytes_per_block"]))
    return expected, mistakes(_BLOCKS_MISTAKES, case)


@thorough
def check_num_gpu_blocks_thoroughly(fn: Callable) -> None:
    """Exactly one block, one byte short of one block, a budget of exactly k blocks and of
    exactly nothing, utilisation 1, random budgets; always an int."""
    rng = random.Random(SEED + 3)
    block = 16 * 128 * KiB  # 16 tokens of Llama-3-8B
    cases = [(10 * GiB, "1", 8 * GiB, 2 * GiB - block, block),
             (10 * GiB, "1", 8 * GiB, 2 * GiB - block + 1, block),
             (24 * GiB, "0.5", 0, 0, block), (40 * GiB, "0.9", 40 * GiB, 0, block),
             (16 * GiB, "0.5", 4 * GiB, 0, GiB), (16 * GiB, "0.5", 4 * GiB, 1, GiB),
             (16 * GiB, "0.5", 4 * GiB, 4 * GiB, block), (8 * GiB, "1", 8 * GiB, 0, block),
             (8 * GiB, "1", 8 * GiB, 1, block), (80 * GiB, "0.75", 0, 0, 3 * MiB)]
    while len(cases) < 50:
        gpu = rng.choice([16, 24, 40, 48, 80, 141]) * GiB
        util = rng.choice(["0.5", "0.8", "0.85", "0.9", "0.92", "0.95", "1"])
        weights = rng.randint(0, gpu)
        activations = rng.randint(0, 4 * GiB)
        block_bytes = rng.choice([1, 8, 16, 32]) * rng.choice([32, 64, 128, 512, 800]) * KiB
        exact = _blocks_oracle(gpu, Fraction(util), weights, activations, block_bytes)
        in_float = max(0, int((gpu * float(util) - weights - activations) // block_bytes))
        if exact == in_float:  # skip the rare case that float rounding puts on a block boundary
            cases.append((gpu, util, weights, activations, block_bytes))
    expect_cases(fn, [_blocks(*c) for c in cases], blocks_case, BLOCKS_IDEA, rel_tol=0,
                 promise=INT)


# --- requests_fit_contiguous and requests_fit_paged ----------------------------------------


def _paged_oracle(lengths: list[int], capacity_tokens: int, block_size: int) -> int:
    pool = capacity_tokens // block_size
    used = 0
    for admitted, length in enumerate(lengths):
        used += (length + block_size - 1) // block_size
        if used > pool:
            return admitted
    return len(lengths)


_CONTIGUOUS_MISTAKES = [
    (lambda lengths, capacity_tokens, max_model_len: capacity_tokens // max_model_len,
     "There are only len(lengths) requests: no more than that can be resident."),
    (lambda lengths, capacity_tokens, max_model_len:
        _paged_oracle(lengths, capacity_tokens, 1),
     "You reserved each request's real length: a contiguous cache cannot know it in advance "
     "and reserves max_model_len."),
    (lambda lengths, capacity_tokens, max_model_len:
        min(len(lengths), (capacity_tokens - 1) // max_model_len) if capacity_tokens else None,
     "A pool of exactly k reservations' slots holds k requests: the last reservation fits "
     "exactly."),
]


def contiguous_case(**case) -> tuple:
    if any(length > case["max_model_len"] for length in case["lengths"]):
        return Raises(ValueError), []
    fits = 0
    while fits < len(case["lengths"]) and (fits + 1) * case["max_model_len"] <= \
            case["capacity_tokens"]:
        fits += 1
    return fits, mistakes(_CONTIGUOUS_MISTAKES, case)


@thorough
def check_requests_fit_contiguous_thoroughly(fn: Callable) -> None:
    """No requests, a pool smaller than one reservation or empty, pools of exactly k
    reservations, requests of 0 and of exactly max_model_len tokens, a request longer than
    max_model_len before, among and after the ones that fit; random mixes; always an int."""
    rng = random.Random(SEED + 4)
    cases = [([], 8192, 2048), ([], 0, 2048), ([5], 1000, 2048), ([2048] * 4, 8192, 2048),
             ([1] * 3, 8191, 2048), ([0, 0, 0], 4096, 2048), ([2048], 2048, 2048),
             ([0], 0, 16), ([2049], 1 << 20, 2048), ([2049, 1], 1 << 20, 2048),
             ([1, 2, 3, 2049], 2048, 2048), ([1, 4097], 0, 4096), ([3], 4, 1), ([1, 2], 3, 2)]
    for _ in range(60):
        max_len = rng.choice([1, 7, 512, 1024, 2048, 4096])
        lengths = [rng.choice([0, max_len, rng.randint(0, max_len)])
                   for _ in range(rng.randint(0, 64))]
        if rng.random() < 0.3:  # one too long, anywhere: first, among, or after those that fit
            lengths.insert(rng.randint(0, len(lengths)), max_len + rng.randint(1, 3))
        k = rng.randint(0, 70)
        capacity = rng.choice([k * max_len, k * max_len - 1 if k else 0, k * max_len + 1,
                               rng.randint(0, 64 * max_len)])
        cases.append((lengths, capacity, max_len))
    expect_cases(fn, [_contiguous(*c) for c in cases], contiguous_case, contiguous_idea,
                 rel_tol=0, promise=INT)


def _overtaking(lengths, capacity_tokens, block_size):
    pool, admitted = capacity_tokens // block_size, 0
    for length in lengths:
        needed = (length + block_size - 1) // block_size
        if needed <= pool:
            pool, admitted = pool - needed, admitted + 1
    return admitted


def _strict(lengths, capacity_tokens, block_size):
    pool, admitted = capacity_tokens // block_size, 0
    for length in lengths:
        needed = (length + block_size - 1) // block_size
        if needed >= pool:
            break
        pool, admitted = pool - needed, admitted + 1
    return admitted


_PAGED_MISTAKES = [
    (lambda lengths, capacity_tokens, block_size: _paged_oracle(lengths, capacity_tokens, 1),
     "You counted tokens, not blocks: a request takes whole blocks, and its last block's "
     "empty slots are taken too."),
    (lambda lengths, capacity_tokens, block_size:
        _paged_oracle([n // block_size * block_size for n in lengths], capacity_tokens,
                      block_size),
     "You rounded down: a request's partly filled last block is a block it holds."),
    (lambda lengths, capacity_tokens, block_size:
        _paged_oracle([(n // block_size + 1) * block_size for n in lengths], capacity_tokens,
                      block_size),
     "A request of k x block_size tokens fills exactly k blocks (and one of 0 tokens takes "
     "none)."),
    (lambda lengths, capacity_tokens, block_size: _overtaking(lengths, capacity_tokens,
                                                              block_size),
     "A later, smaller request overtook one that did not fit: first come, first served stops "
     "at the first request that does not fit."),
    (lambda lengths, capacity_tokens, block_size:
        min(len(lengths), _paged_oracle(lengths, capacity_tokens, block_size) + 1),
     "You counted the first request that does not fit: first come, first served, it waits, "
     "and so does every request behind it."),
    (lambda lengths, capacity_tokens, block_size: _strict(lengths, capacity_tokens,
                                                          block_size),
     "A request that takes exactly the blocks left fits: the pool may be filled to its last "
     "block."),
]


def paged_case(**case) -> tuple[int, list]:
    expected = _paged_oracle(case["lengths"], case["capacity_tokens"], case["block_size"])
    return expected, mistakes(_PAGED_MISTAKES, case)


def _filled_exactly(rng: random.Random, block_size: int) -> tuple[list[int], int, int]:
    """Requests whose first few take exactly the pool's blocks (0-token ones among them), and
    maybe a remainder of less than one block."""
    lengths = [rng.choice([0, block_size, rng.randint(1, 4 * block_size)])
               for _ in range(rng.randint(1, 20))]
    fitting = rng.randint(0, len(lengths))
    blocks = sum(-(-n // block_size) for n in lengths[:fitting])
    return lengths, blocks * block_size + rng.randint(0, block_size - 1), block_size


@thorough
def check_requests_fit_paged_thoroughly(fn: Callable) -> None:
    """Block size 1, a pool that is not a whole number of blocks, lengths on block boundaries,
    empty requests, no requests, pools filled exactly, and seeded random mixes; always an
    int."""
    rng = random.Random(SEED + 5)
    cases = [([3, 3, 3], 8, 1), ([16, 16, 16, 1], 50, 16), ([15, 16, 17, 32, 33], 160, 16),
             ([0, 5], 16, 16), ([], 64, 16), ([], 0, 16), ([100], 64, 16), ([0, 0], 0, 16),
             ([16, 16], 32, 16), ([17], 32, 16), ([32, 1], 32, 16), ([1, 0, 0, 1], 1, 1)]
    for _ in range(40):
        block_size = rng.choice([1, 2, 3, 8, 16, 32, 128])
        lengths = [rng.randint(0, 2048) for _ in range(rng.randint(0, 40))]
        cases.append((lengths, rng.randint(0, 40 * 1024), block_size))
    cases += [_filled_exactly(rng, rng.choice([1, 3, 16, 32])) for _ in range(30)]
    expect_cases(fn, [_paged(*c) for c in cases], paged_case, paged_idea, rel_tol=0,
                 promise=INT)
