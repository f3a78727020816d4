"""Visible checks for chapter 1, KV cache sizing: the small, readable cases of each TODO's
test cell. Expected values, and the values known mistakes give, come from the chapter's
hidden module (``autograder.private``); the thorough checks are there too.

A hint says which input broke, what was expected, what came back and which idea was missed
(the known mistake that gives this value, else the TODO's idea); it never recites the fix.
"""

from __future__ import annotations

from collections.abc import Callable

from autograder.checks._contract import INT, Earlier, expect_cases
from autograder.private import private, visible
from course.experiments.models import MODELS, ModelConfig

KiB, MiB, GiB = 2**10, 2**20, 2**30

KV_TOKEN_IDEA = ("One token's cache holds, in every layer, a key and a value for each KV head, "
                 "counted in bytes.")
MLA_IDEA = ("MLA caches, per token and layer, one latent vector and one decoupled RoPE key "
            "shared by all heads, counted in bytes.")
SEQ_IDEA = ("A sequence's cache is one token's cache for each of its tokens; one token's cache "
            "counts the model's KV heads, or its latent when kv_lora_rank is set.")
BLOCKS_IDEA = ("The engine's share of the GPU, less the weights and the activation peak, is "
               "cut into whole blocks; less than one block left is no block at all.")
CONTIGUOUS_IDEA = ("A contiguous cache reserves max_model_len slots for every request, "
                   "whatever its real length.")
FULL_LENGTH_IDEA = ("A request of exactly max_model_len tokens is allowed: it fills its "
                    "reservation, and a pool of exactly k reservations holds k requests.")
TOO_LONG_IDEA = ("No request may be longer than max_model_len (an engine refuses it on "
                 "arrival): such a request in lengths is an error wherever it stands, even "
                 "after the requests that fit.")
NO_REQUESTS_IDEA = "With no requests there is nothing to count: the answer is 0."
PAGED_IDEA = ("Paged, a request holds whole blocks of the pool, and requests are admitted "
              "first come, first served until the first one that does not fit.")


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


def _contiguous(lengths: list[int], capacity: int, max_len: int) -> dict:
    return dict(lengths=lengths, capacity_tokens=capacity, max_model_len=max_len)


def _paged(lengths: list[int], capacity: int, block_size: int) -> dict:
    return dict(lengths=lengths, capacity_tokens=capacity, block_size=block_size)


def per_token_todo(case: dict, hidden) -> list[Earlier]:
    """The per-token TODO a sequence's size builds on, for ``case``'s model, and what it must
    give (asked of ``hidden``: the chapter's hidden module, or what stands in for it)."""
    config, bpe = case["config"], case["bytes_per_element"]
    if config.kv_lora_rank is not None:
        kwargs = _mla(config.num_layers, config.kv_lora_rank, config.qk_rope_head_dim, bpe)
        return [Earlier("mla_kv_bytes_per_token", kwargs, hidden.mla_case(**kwargs)[0])]
    kwargs = _kv_token(config.num_layers, config.num_kv_heads, config.head_dim, bpe)
    return [Earlier("kv_bytes_per_token", kwargs, hidden.kv_token_case(**kwargs)[0])]


def contiguous_idea(case: dict) -> str:
    """The idea a contiguous case tests: no requests, the length limit, a full-length
    request, or the reservation itself."""
    if not case["lengths"]:
        return NO_REQUESTS_IDEA
    if any(n > case["max_model_len"] for n in case["lengths"]):
        return TOO_LONG_IDEA
    if case["max_model_len"] in case["lengths"]:
        return FULL_LENGTH_IDEA
    return CONTIGUOUS_IDEA


def paged_idea(case: dict) -> str:
    """The idea a paged case tests: no requests, or admission in blocks."""
    return PAGED_IDEA if case["lengths"] else NO_REQUESTS_IDEA


@visible
def check_kv_bytes_per_token(fn: Callable) -> None:
    """Llama-3-8B in fp8 (64 KiB), one tiny layer in fp32 (32 bytes), Llama-2-7B in fp16
    (512 KiB): each known mistake gives a value of its own on the first case it fails."""
    expect_cases(fn, [_kv_token(32, 8, 128, 1), _kv_token(1, 1, 4, 4), _kv_token(32, 32, 128, 2)],
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
                 private("01").sequence_case, SEQ_IDEA,
                 earlier=lambda case: per_token_todo(case, private("01")))


@visible
def check_num_gpu_blocks(fn: Callable) -> None:
    """A GPU of 80 GiB at 0.9 with 14 GiB of weights and a 2 GiB activation peak, 8 MiB
    blocks (56 GiB left: 7168 blocks); Llama-3-8B's 16.06 GB of weights and 2 MiB blocks on
    the same GPU (28,181.995 blocks' worth: 28,181 whole blocks); and a 16 GiB GPU that leaves
    no room at all. The answer is an int."""
    expect_cases(fn, [_blocks(80 * GiB, "0.9", 14 * GiB, 2 * GiB, 8 * MiB),
                      _blocks(80 * GiB, "0.9", 16_060_000_000, 2 * GiB, 2 * MiB),
                      _blocks(16 * GiB, "0.9", 14 * GiB, 1 * GiB, 8 * MiB)],
                 private("01").blocks_case, BLOCKS_IDEA, rel_tol=0, promise=INT)


@visible
def check_requests_fit_contiguous(fn: Callable) -> None:
    """Four requests in 8192 and in 6000 slots at max_model_len 2048; ten 10-token requests
    in 4096; two requests with room for four; two full-length requests in exactly two
    reservations; a request longer than max_model_len behind two that fit. The answer is an
    int."""
    cases = [([100, 300, 2000, 50], 8192, 2048), ([100, 300, 2000, 50], 6000, 2048),
             ([10] * 10, 4096, 2048), ([100, 300], 8192, 2048), ([2048, 2048], 4096, 2048),
             ([100, 300, 2049], 4096, 2048)]
    expect_cases(fn, [_contiguous(*case) for case in cases], private("01").contiguous_case,
                 contiguous_idea, rel_tol=0, promise=INT)


@visible
def check_requests_fit_paged(fn: Callable) -> None:
    """Three blocks of 16: 10, 20 and 0 tokens take 1 + 2 + 0 blocks, the whole pool; three
    requests of exactly one block; a 33-token request that needs 3 blocks where 2 are left,
    holding up the small ones behind it. Four blocks: 10, 16 and 17 tokens take 1 + 1 + 2
    blocks, so the fourth waits. The answer is an int."""
    cases = [([10, 20, 0], 48, 16), ([16, 16, 16], 48, 16), ([10, 33, 1, 1, 10], 48, 16),
             ([10, 16, 17, 1], 64, 16)]
    expect_cases(fn, [_paged(*case) for case in cases], private("01").paged_case, paged_idea,
                 rel_tol=0, promise=INT)

