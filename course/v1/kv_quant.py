"""Chapter 13: the KV cache in FP8, with scales.

An e4m3 number is one byte: a sign bit, 4 exponent bits (bias 7) and 3 mantissa bits, so
about two significant decimal digits and a largest value of 448 (``E4M3_MAX``; the pattern
0x7F, all ones, is NaN, and there is no infinity). K and V hold values of any size, so an
engine stores ``x / scale`` and multiplies by ``scale`` when it reads the byte back::

    write   byte = e4m3( clamp(x / scale, -448, 448) )      through the slot mapping
    read    x'   = float(byte) * scale                      inside attention

Two ways of choosing the scale are in use:

* **Static, per tensor or per KV head** (vLLM's ``kv_cache_dtype="fp8"``): one ``k_scale``
  and one ``v_scale`` per layer (or one per KV head), computed once from the first batch the
  layer sees and kept for the engine's life (``calc_kv_scales`` in ``vllm/attention/layer.py``:
  ``abs(key).max() / K_SCALE_CONSTANT``). The constants of ``vllm/envs.py`` are 200 for keys
  and 100 for values, not 448: the calibration batch's largest key lands at 200, leaving
  448 / 200 = 2.24x headroom for later keys larger than any it saw. A later value past the
  headroom saturates at 448 x scale: the clamp keeps it finite, but wrong.
* **Dynamic, per token and tile** (FlashMLA's FP8 latent record, ``kernels.latent_record``):
  every token's latent is cut into tiles of 128 values, each with its own scale computed as
  the token is written, so nothing saturates; the scales cost 4 bytes per tile.

Answers are the bodies between ``### BEGIN SOLUTION`` and ``### END SOLUTION``: chapter 13's
notebook renders its cells from them, and a learner edition replaces them with stubs.
"""

from __future__ import annotations

import torch

from kernels.latent_record import E4M3_MAX

K_SCALE_CONSTANT = 200.0  # vllm/envs.py: the calibration's largest |key| lands here
V_SCALE_CONSTANT = 100.0  # vllm/envs.py: ... and its largest |value| here


def kv_scale(x: torch.Tensor, range_constant: float, per_head: bool = False) -> torch.Tensor:
    """The scale a calibration batch ``x`` [tokens, num_kv_heads, head_dim] gives: its largest
    absolute value divided by ``range_constant``, over the whole tensor (a 0-d float32
    tensor) or, ``per_head``, over each KV head apart (float32, shape [num_kv_heads]). A
    scale is never 0: where every value is 0 it is 1.0."""
    ### BEGIN SOLUTION
    magnitude = x.detach().abs().float()
    amax = magnitude.amax(dim=(0, 2)) if per_head else magnitude.max()
    return torch.where(amax > 0, amax / range_constant, torch.ones_like(amax))
    ### END SOLUTION


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x`` [..., num_kv_heads, head_dim] as e4m3 bytes (uint8, same shape): each value
    divided by its head's scale (``scale`` 0-d, or [num_kv_heads]), saturated to
    [-448, 448], rounded to the nearest e4m3 number (ties to even, as PyTorch's cast to
    ``torch.float8_e4m3fn`` does). NaN stays NaN."""
    ### BEGIN SOLUTION
    scaled = x.float() / scale.float().reshape(-1, 1)
    return scaled.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    ### END SOLUTION


def dequantize_fp8(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float32 values the e4m3 bytes ``codes`` [..., num_kv_heads, head_dim] stand for,
    each times its head's scale."""
    return codes.view(torch.float8_e4m3fn).float() * scale.float().reshape(-1, 1)


def fp8_error_bound(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """How far ``dequantize_fp8(quantize_fp8(x, scale), scale)`` may be from ``x``, value by
    value, for values within range (``|x| <= 448 x scale``): half the e4m3 spacing there. A
    normal number has 3 mantissa bits, so half its spacing is at most 2^-4 of it; below the
    smallest normal (2^-6) the spacing is the smallest subnormal, 2^-9."""
    scale = scale.float().reshape(-1, 1)
    return torch.maximum(x.float().abs() * 2.0**-4, scale * 2.0**-10)


def attention_error_bound(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                          k_scale: torch.Tensor, v_scale: torch.Tensor,
                          scale: float) -> torch.Tensor:
    """How far one query's attention output may move, per head, when its keys and values
    (within range of their scales) are read back from FP8: ``query`` [heads, dim] over
    ``keys`` and ``values`` [tokens, heads, dim] (heads already expanded to the query's).

    Each key is off by at most ``fp8_error_bound`` per value, so each score by at most
    ``d = scale x sum |q| x bound(k)``, and every softmax weight by a factor within
    ``exp(+-2 d_max)``; the weights stay a distribution, so the output moves by at most the
    largest value error plus ``(exp(2 d_max) - 1)`` times the largest value::

        |out' - out| <= max_t |v'_t - v_t| + (exp(2 max_t d_t) - 1) x max_t |v_t|

    The bound does not grow with the context: attention averages its values, so FP8 errors
    do not pile up over a long context as they would in a sum. Returned per head, [heads]."""
    k_scale = k_scale.float().reshape(-1)
    v_scale = v_scale.float().reshape(-1)
    group = query.shape[0] // k_scale.numel() if k_scale.numel() > 1 else 1
    k_error = fp8_error_bound(keys, k_scale.repeat_interleave(group))  # [t, heads, dim]
    v_error = fp8_error_bound(values, v_scale.repeat_interleave(group))
    score_error = scale * (query.float().abs()[None] * k_error).sum(-1)  # [t, heads]
    drift = torch.expm1(2 * score_error.amax(0))
    return v_error.amax(dim=(0, 2)) + drift * values.float().abs().amax(dim=(0, 2))
