"""Visible checks for chapter 1, KV cache sizing: the small, readable cases of each TODO's
test cell. Expected values, and the values known mistakes give, come from the chapter's
hidden module (``autograder.private``); the thorough checks are there too.
"""

from __future__ import annotations

from collections.abc import Callable

from autograder.checks._helpers import expect_equal
from autograder.private import private, visible
from course.models import MODELS, ModelConfig

KiB, MiB, GiB = 2**10, 2**20, 2**30

KV_TOKEN_IDEA = (
    "Per token, every layer stores one key and one value vector of head_dim elements for each "
    "KV head: 2 x num_layers x num_kv_heads x head_dim x bytes_per_element."
)
MLA_IDEA = (
    "MLA caches, per token and layer, one latent vector of kv_lora_rank elements plus one "
    "decoupled RoPE key of qk_rope_head_dim elements, shared by all heads: "
    "num_layers x (kv_lora_rank + qk_rope_head_dim) x bytes_per_element."
)
SEQ_IDEA = (
    "A sequence's cache is its per-token bytes times its number of tokens, and the per-token "
    "bytes count KV heads (config.num_kv_heads), not query heads; an MLA model "
    "(config.kv_lora_rank set) caches its latent instead. If kv_bytes_per_token or "
    "mla_kv_bytes_per_token fails its own test, fix that first."
)
BLOCKS_IDEA = (
    "The engine may use gpu_memory_bytes x gpu_memory_utilization; the weights and the "
    "activation peak come off that, and what is left is cut into whole blocks of "
    "bytes_per_block (rounded down). A budget too small for one block, or below zero, gives 0."
)
CONTIGUOUS_IDEA = (
    "A contiguous cache reserves max_model_len slots for every request, whatever its real "
    "length, so capacity_tokens // max_model_len requests fit (and never more than there are)."
)
PAGED_IDEA = (
    "Paged, a request of n tokens takes ceil(n / block_size) blocks out of "
    "capacity_tokens // block_size, and requests are admitted first come, first served: stop "
    "at the first one that does not fit."
)


def expect_cases(fn: Callable, cases: list[dict], ask: Callable, idea: str,
                rel_tol: float = 1e-9) -> None:
    """``fn`` on each case (its keyword arguments); ``ask(**case)`` gives the expected value
    and the values known mistakes give."""
    for case in cases:
        expected, known = ask(**case)
        expect_equal(fn, case, expected, idea, known, rel_tol=rel_tol)


def _kv_token(layers: int, kv_heads: int, head_dim: int, bpe: float) -> dict:
    return dict(num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim,
                bytes_per_element=bpe)


def _mla(layers: int, rank: int, rope: int, bpe: float) -> dict:
    return dict(num_layers=layers, kv_lora_rank=rank, qk_rope_head_dim=rope,
                bytes_per_element=bpe)


def _sequence(config: ModelConfig, tokens: int, bpe: float) -> dict:
    return dict(config=config, num_tokens=tokens, bytes_per_element=bpe)


def _blocks(gpu: int, util: str, weights: int, activations: int, block: int) -> dict:
    return dict(gpu_memory_bytes=gpu, gpu_memory_utilization=float(util), weight_bytes=weights,
                activation_peak_bytes=activations, bytes_per_block=block)


@visible
def check_kv_bytes_per_token(fn: Callable) -> None:
    """Llama-2-7B in fp16 (512 KiB), Llama-3-8B in fp16 (128 KiB), one tiny layer in fp8."""
    expect_cases(fn, [_kv_token(32, 32, 128, 2), _kv_token(32, 8, 128, 2), _kv_token(1, 1, 4, 1)],
                private("01").kv_token_case, KV_TOKEN_IDEA)


@visible
def check_mla_kv_bytes_per_token(fn: Callable) -> None:
    """DeepSeek-V2 in bf16 (67.5 KiB per token) and one tiny layer in fp8."""
    expect_cases(fn, [_mla(60, 512, 64, 2), _mla(1, 4, 2, 1)], private("01").mla_case, MLA_IDEA)


@visible
def check_kv_bytes_per_sequence(fn: Callable) -> None:
    """Llama-2-7B (MHA), Llama-3-8B (GQA, fp16 and fp8) and DeepSeek-V2 (MLA)."""
    expect_cases(fn, [_sequence(MODELS["Llama-2-7B"], 1, 2),
                     _sequence(MODELS["Llama-3-8B"], 1000, 2),
                     _sequence(MODELS["Llama-3-8B"], 1000, 1),
                     _sequence(MODELS["DeepSeek-V2"], 10, 2)],
                private("01").sequence_case, SEQ_IDEA)


@visible
def check_num_gpu_blocks(fn: Callable) -> None:
    """An 80 GiB GPU at 0.9 with 14 GiB of weights and a 2 GiB activation peak, 8 MiB blocks
    (56 GiB left: 7168 blocks); Llama-3-8B's 16.06 GB of weights and 2 MiB blocks on the same
    GPU (28,182 whole blocks and a bit); and a 16 GiB GPU that leaves no room at all."""
    expect_cases(fn, [_blocks(80 * GiB, "0.9", 14 * GiB, 2 * GiB, 8 * MiB),
                     _blocks(80 * GiB, "0.9", 16_060_000_000, 2 * GiB, 2 * MiB),
                     _blocks(16 * GiB, "0.9", 14 * GiB, 1 * GiB, 8 * MiB)],
                private("01").blocks_case, BLOCKS_IDEA, rel_tol=0)


@visible
def check_requests_fit_contiguous(fn: Callable) -> None:
    """Four requests in 8192 and in 6000 slots at max_model_len 2048; ten 10-token requests
    in 4096; two requests with room for four."""
    cases = [([100, 300, 2000, 50], 8192, 2048), ([100, 300, 2000, 50], 6000, 2048),
             ([10] * 10, 4096, 2048), ([100, 300], 8192, 2048)]
    expect_cases(fn, [dict(lengths=lengths, capacity_tokens=capacity, max_model_len=max_len)
                     for lengths, capacity, max_len in cases],
                private("01").contiguous_case, CONTIGUOUS_IDEA, rel_tol=0)


@visible
def check_requests_fit_paged(fn: Callable) -> None:
    """Four blocks of 16: 10, 16 and 17 tokens take 1 + 1 + 2 blocks, so the fourth waits;
    and a 40-token request that blocks the queue behind it."""
    cases = [([10, 16, 17, 1], 64, 16), ([16, 40, 16], 48, 16)]
    expect_cases(fn, [dict(lengths=lengths, capacity_tokens=capacity, block_size=block_size)
                     for lengths, capacity, block_size in cases],
                private("01").paged_case, PAGED_IDEA, rel_tol=0)
