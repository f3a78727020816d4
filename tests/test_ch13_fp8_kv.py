"""The KV cache in FP8 (``course.v1.kv_quant``, ``course.v1.fp8_engine``).

Quantisation gives the bytes PyTorch's own e4m3 cast gives, saturates instead of overflowing,
and stays within half an e4m3 step of every value in range; the scales are vLLM's (largest
value over 200 for keys, 100 for values, per tensor or per head). Attention over FP8 K/V
stays within ``attention_error_bound`` at every context length tried, up to 4096 tokens,
while a stale scale (keys grown past the calibration's headroom) breaks it. The FP8 engine is
token for token, logits too, what contiguous generation gives when every K/V is rounded
through the same bytes and scales, with chunked prefill, prefix hits and a pool small enough
to preempt; its scales are fixed after the first step.
"""

from __future__ import annotations

import random

import pytest
import torch

from course.tiny_model import TinyConfig, TinyModel, causal_attention, generate_contiguous
from course.v1.chunked_engine import ChunkedEngine, engine_requests, serve_chunked
from course.v1.fp8_engine import Fp8Engine, KVScales
from course.v1.kv_quant import (
    E4M3_MAX,
    K_SCALE_CONSTANT,
    V_SCALE_CONSTANT,
    attention_error_bound,
    dequantize_fp8,
    fp8_error_bound,
    kv_scale,
    quantize_fp8,
)


def _values(seed: int, shape: tuple[int, ...], spread: float = 3.0) -> torch.Tensor:
    """Values over many orders of magnitude (down into e4m3's subnormals once scaled)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen) * torch.exp(spread * torch.randn(shape,
                                                                               generator=gen))


def test_scale_is_the_largest_value_over_the_range_constant_per_tensor_and_per_head():
    x = _values(0, (20, 3, 8))
    assert torch.equal(kv_scale(x, K_SCALE_CONSTANT), x.abs().max() / 200)
    per_head = kv_scale(x, V_SCALE_CONSTANT, per_head=True)
    assert per_head.shape == (3,) and per_head.dtype == torch.float32
    for head in range(3):
        assert per_head[head] == x[:, head].abs().max() / 100


def test_a_head_of_zeros_gets_scale_one():
    x = torch.zeros(4, 2, 8)
    x[:, 1] = 5.0
    assert kv_scale(x, 200, per_head=True).tolist() == pytest.approx([1.0, 5.0 / 200])
    assert kv_scale(torch.zeros(3, 1, 4), 200).item() == 1.0


@pytest.mark.parametrize("per_head", [False, True], ids=["per-tensor", "per-head"])
def test_quantised_bytes_are_pytorchs_e4m3_cast_of_the_scaled_values(per_head: bool):
    x = _values(1, (50, 2, 16))
    scale = kv_scale(x, K_SCALE_CONSTANT, per_head)
    codes = quantize_fp8(x, scale)
    assert codes.dtype == torch.uint8 and codes.shape == x.shape
    by_head = scale.reshape(-1, 1)
    want = (x / by_head).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(codes, want)
    back = dequantize_fp8(codes, scale)
    assert bool(((back - x).abs() <= fp8_error_bound(x, scale)).all())


def test_values_past_the_range_saturate_at_448_times_the_scale():
    scale = torch.tensor(0.5)
    x = torch.tensor([[[1000.0, -1000.0, 224.0, 1e30]]])
    back = dequantize_fp8(quantize_fp8(x, scale), scale)
    assert back.flatten().tolist() == [E4M3_MAX * 0.5, -E4M3_MAX * 0.5, 224.0, E4M3_MAX * 0.5]


def test_the_calibrations_largest_key_lands_near_200_leaving_headroom():
    x = _values(2, (64, 2, 16))
    scale = kv_scale(x, K_SCALE_CONSTANT)
    largest = dequantize_fp8(quantize_fp8(x, scale), scale).abs().max() / scale
    assert 192 <= largest <= 208  # 200 rounded to e4m3 (steps of 16 there)
    assert E4M3_MAX / K_SCALE_CONSTANT == pytest.approx(2.24)


def _attention_cases(seed: int, context: int, heads: int = 4, kv_heads: int = 2,
                     dim: int = 16) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(heads, dim, generator=gen)
    k = torch.randn(context, kv_heads, dim, generator=gen) * 2
    v = torch.randn(context, kv_heads, dim, generator=gen)
    return q, k, v


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    return causal_attention(q[None], k, v, scale, past=len(k) - 1)[0]  # [heads, dim]


@pytest.mark.parametrize("context", [1, 16, 256, 4096])
@pytest.mark.parametrize("per_head", [False, True], ids=["per-tensor", "per-head"])
def test_fp8_attention_stays_within_the_bound_at_every_context_length(context: int,
                                                                       per_head: bool):
    q, k, v = _attention_cases(context, context)
    scale = 0.25
    k_scale, v_scale = kv_scale(k, 200, per_head), kv_scale(v, 100, per_head)
    exact = _attend(q, k, v, scale)
    read = _attend(q, dequantize_fp8(quantize_fp8(k, k_scale), k_scale),
                   dequantize_fp8(quantize_fp8(v, v_scale), v_scale), scale)
    group = q.shape[0] // k.shape[1]
    bound = attention_error_bound(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                  k_scale, v_scale, scale)
    error = (read - exact).abs().amax(dim=1)
    assert bool((error <= bound + 1e-6).all()), (error, bound)
    assert bool((error > 0).any())  # FP8 did change something


def test_a_stale_scale_saturates_and_breaks_the_bound():
    q, k, v = _attention_cases(7, 64)
    k_scale = kv_scale(k, 200)
    grown = k * 8  # keys 8x the calibration's: past its 2.24x headroom
    codes = quantize_fp8(grown, k_scale)
    assert int((codes & 0x7F).eq(0x7E).sum()) > 0  # 0x7E / 0xFE: +-448, saturated
    scale = 0.25
    exact = _attend(q, grown, v, scale)
    stale = _attend(q, dequantize_fp8(codes, k_scale), v, scale)
    fresh_scale = kv_scale(grown, 200)
    fresh = _attend(q, dequantize_fp8(quantize_fp8(grown, fresh_scale), fresh_scale), v, scale)
    assert (stale - exact).abs().max() > 10 * (fresh - exact).abs().max()


def _specs(seed: int, count: int, shared: int = 0) -> list[tuple[list[int], int, int]]:
    rng = random.Random(seed)
    stem = [rng.randrange(128) for _ in range(shared)]
    return [(stem + [rng.randrange(128) for _ in range(rng.randint(1, 14))],
             rng.randint(2, 8), rng.randrange(4)) for _ in range(count)]


class _RoundedModel(TinyModel):
    """The same weights, every K/V rounded through FP8 with ``scales`` as it is computed."""

    def __init__(self, model: TinyModel, scales: KVScales) -> None:
        self.__dict__.update(model.__dict__)
        self.scales = scales

    def qkv(self, layer, x, positions):
        q, k, v = super().qkv(layer, x, positions)
        k_scale, v_scale = self.scales.layers[layer]
        return (q, dequantize_fp8(quantize_fp8(k, k_scale), k_scale),
                dequantize_fp8(quantize_fp8(v, v_scale), v_scale))


@pytest.mark.parametrize(("block_size", "budget", "blocks", "shared", "per_head"), [
    (4, 16, 64, 0, False), (1, 3, 64, 0, True), (4, 8, 12, 0, False), (4, 16, 64, 8, True),
], ids=["blocks-of-4", "blocks-of-1-budget-3", "preempting", "prefix-hits"])
def test_fp8_engine_serves_what_chapter_9s_engine_serves_over_rounded_kv(
        block_size, budget, blocks, shared, per_head):
    """Bit for bit: the same schedule, and every K/V read back as the rounded values (a
    contiguous baseline would differ where fp32 noise from other batch shapes tips a value
    over an e4m3 rounding boundary)."""
    model = TinyModel()
    engine = Fp8Engine(model, blocks, block_size, budget, per_head=per_head)
    specs = _specs(block_size + budget + shared, 6, shared)
    done = sorted(serve_chunked(engine, engine_requests(specs)), key=lambda r: r.id)
    assert engine.pool.k[0].dtype == torch.uint8
    assert engine.kv_cache.num_free() == blocks - 1
    rounded = ChunkedEngine(_RoundedModel(model, engine.scales), blocks, block_size, budget)
    plain = sorted(serve_chunked(rounded, engine_requests(specs)), key=lambda r: r.id)
    assert engine.records == rounded.records
    for ours, theirs in zip(done, plain, strict=True):
        assert ours.output == theirs.output
        assert torch.equal(torch.stack(ours.logits), torch.stack(theirs.logits))
    if shared:
        assert engine.prompt_hits > 0


def test_fp8_engine_is_contiguous_generation_over_rounded_kv_without_batching():
    """One request at a time, blocks of 16, no prefix hits: the same batch shapes as
    contiguous generation, token for token with it over the rounded K/V."""
    model = TinyModel()
    for prompt, output_len, _ in _specs(11, 4):
        engine = Fp8Engine(model, 16, 16, 64, enable_caching=False)
        (request,) = serve_chunked(engine, engine_requests([(prompt, output_len, 0)]))
        tokens, logits = generate_contiguous(_RoundedModel(model, engine.scales), prompt,
                                             output_len)
        assert request.output == tokens
        assert torch.allclose(torch.stack(request.logits), torch.stack(logits), atol=1e-4)


def test_fp8_engine_keeps_the_first_steps_scales():
    model = TinyModel(TinyConfig())
    engine = Fp8Engine(model, 64, 4, 16)
    requests = engine_requests(_specs(3, 4))
    engine.scheduler.add(requests[0])
    engine.step()
    first = {layer: tuple(s.clone() for s in pair) for layer, pair in engine.scales.layers.items()}
    assert sorted(first) == [0, 1]
    serve_chunked(engine, requests[1:])
    for layer, (k_scale, v_scale) in engine.scales.layers.items():
        assert torch.equal(k_scale, first[layer][0]) and torch.equal(v_scale, first[layer][1])


def test_fp8_pool_is_a_quarter_of_float32s_and_differs_from_it_a_little():
    model = TinyModel()
    fp8, plain = Fp8Engine(model, 32, 4, 16), ChunkedEngine(model, 32, 4, 16)
    assert fp8.pool.k[0].nbytes * 4 == plain.pool.k[0].nbytes
    specs = _specs(5, 4)
    ours = sorted(serve_chunked(fp8, engine_requests(specs)), key=lambda r: r.id)
    theirs = sorted(serve_chunked(plain, engine_requests(specs)), key=lambda r: r.id)
    first = [(a.logits[0] - b.logits[0]).abs().max().item() for a, b in zip(ours, theirs,
                                                                             strict=True)]
    assert 0 < max(first) < 1.0
