"""Chapter 1's reference solutions: how many bytes the KV cache needs, and what fits on a GPU.

Answers are the bodies between ``### BEGIN SOLUTION`` and ``### END SOLUTION``: chapter 1's
notebook renders its cells from them, and a learner edition replaces them with stubs.

A KV cache stores, for every token, layer and KV head, one key and one value vector::

    bytes per token = 2 (K and V) x layers x kv_heads x head_dim x bytes_per_element

A paged cache hands this memory out in blocks of ``block_size`` tokens across all layers.
"""

from __future__ import annotations

from course.experiments.models import ModelConfig


def kv_bytes_per_token(
    num_layers: int, num_kv_heads: int, head_dim: int, bytes_per_element: float
) -> float:
    """Bytes of KV cache one token occupies across all layers (MHA, GQA or MQA).

    Each layer stores a key and a value vector of ``head_dim`` elements for each KV head.
    """
    ### BEGIN SOLUTION
    return 2 * num_layers * num_kv_heads * head_dim * bytes_per_element
    ### END SOLUTION


def mla_kv_bytes_per_token(
    num_layers: int, kv_lora_rank: int, qk_rope_head_dim: int, bytes_per_element: float
) -> float:
    """Bytes of cache one token occupies in a multi-head latent attention (MLA) model.

    Each layer stores one compressed latent vector (``kv_lora_rank`` elements) and one
    decoupled RoPE key (``qk_rope_head_dim`` elements), shared by all heads: no factor 2,
    no head count.
    """
    ### BEGIN SOLUTION
    return num_layers * (kv_lora_rank + qk_rope_head_dim) * bytes_per_element
    ### END SOLUTION


def kv_bytes_per_sequence(
    config: ModelConfig, num_tokens: int, bytes_per_element: float = 2
) -> float:
    """Bytes of KV cache a sequence of ``num_tokens`` tokens occupies in model ``config``.

    Uses the latent cache when ``config.kv_lora_rank`` is set, the per-KV-head cache otherwise.
    """
    ### BEGIN SOLUTION
    if config.kv_lora_rank is not None:
        per_token = mla_kv_bytes_per_token(
            config.num_layers, config.kv_lora_rank, config.qk_rope_head_dim, bytes_per_element
        )
    else:
        per_token = kv_bytes_per_token(
            config.num_layers, config.num_kv_heads, config.head_dim, bytes_per_element
        )
    return per_token * num_tokens
    ### END SOLUTION


def num_gpu_blocks(
    gpu_memory_bytes: int,
    gpu_memory_utilization: float,
    weight_bytes: int,
    activation_peak_bytes: int,
    bytes_per_block: int,
) -> int:
    """How many KV blocks fit on the GPU, the way vLLM sizes its pool.

    The engine may use ``gpu_memory_bytes x gpu_memory_utilization``; the weights and the
    activation peak of a forward pass come off first, and what is left is cut into whole
    blocks of ``bytes_per_block`` (one block's K and V across all layers). Returns an ``int``
    (a count: ``7168``, not ``7168.0``): 0 when less than one block is left, or nothing at all.
    """
    ### BEGIN SOLUTION
    budget = gpu_memory_bytes * gpu_memory_utilization - weight_bytes - activation_peak_bytes
    return max(0, int(budget // bytes_per_block))
    ### END SOLUTION


def requests_fit_contiguous(lengths: list[int], capacity_tokens: int, max_model_len: int) -> int:
    """How many of ``lengths`` can be resident at once when each reserves ``max_model_len``.

    A contiguous cache cannot know how long a request will grow, so each one reserves room for
    the longest sequence allowed, whatever its real length (0 tokens included). Returns an
    ``int``; no requests, 0. No request is longer than ``max_model_len`` (an engine refuses it
    on arrival): if one in ``lengths`` is, wherever it stands, raise ``ValueError`` before
    counting anything. A request of exactly ``max_model_len`` tokens is allowed.
    """
    ### BEGIN SOLUTION
    too_long = [n for n in lengths if n > max_model_len]
    if too_long:
        raise ValueError(f"a request of {too_long[0]} tokens is longer than max_model_len "
                         f"{max_model_len}: an engine refuses it on arrival")
    return min(len(lengths), capacity_tokens // max_model_len)
    ### END SOLUTION


def requests_fit_paged(lengths: list[int], capacity_tokens: int, block_size: int) -> int:
    """How many of ``lengths`` are admitted, first come first served, when paged in blocks.

    The pool holds ``capacity_tokens // block_size`` blocks; a request of n tokens takes
    ceil(n / block_size) of them (0 tokens: none). Requests are admitted in order until the
    first one that does not fit (no later request overtakes it); one that takes exactly the
    blocks left fits. Returns an ``int``; no requests, 0.
    """
    ### BEGIN SOLUTION
    free_blocks = capacity_tokens // block_size
    admitted = 0
    for length in lengths:
        needed = -(-length // block_size)
        if needed > free_blocks:
            break
        free_blocks -= needed
        admitted += 1
    return admitted
    ### END SOLUTION
