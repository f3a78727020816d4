"""The tiny MLA model (``course.mla_model``) served from a paged latent cache
(``course.v1.mla_engine``): decodes absorbed, reading only latent records, prefill chunks
from keys and values up-projected from the records, token for token and logits within 1e-4 of
generation that computes every head's full keys and values, with blocks of 1 to 16, chunked
prefill, prefix hits and a pool small enough to preempt. Absorption is the same attention,
query by query; an absorption that drops the rotary part or a head's own up-projection is
caught by the same comparison. The FP8 record (``LatentRecord``) holds the bytes FlashMLA's
layout puts there, and an engine on FP8 records is bit for bit the float32 engine over
latents rounded through those bytes.
"""

from __future__ import annotations

import random

import pytest
import torch

from course.mla_model import MLAConfig, TinyMLAModel, generate_full_kv
from course.tiny_model import causal_attention
from course.v1.chunked_engine import engine_requests, serve_chunked
from course.v1.mla_engine import MLAEngine, absorbed_decode, latent_attention
from kernels.latent_record import LatentRecord, pack_latent_fp8, tile_scale, unpack_latent_fp8


def _specs(seed: int, count: int, shared: int = 0) -> list[tuple[list[int], int, int]]:
    rng = random.Random(seed)
    stem = [rng.randrange(128) for _ in range(shared)]
    return [(stem + [rng.randrange(128) for _ in range(rng.randint(1, 14))],
             rng.randint(2, 9), rng.randrange(4)) for _ in range(count)]


def _served(engine: MLAEngine, specs: list) -> list:
    return sorted(serve_chunked(engine, engine_requests(specs)), key=lambda r: r.id)


@pytest.mark.parametrize(("block_size", "budget", "blocks", "shared"), [
    (4, 16, 64, 0), (1, 3, 200, 0), (16, 64, 16, 0), (4, 8, 10, 0), (4, 16, 64, 8),
], ids=["blocks-of-4", "blocks-of-1-budget-3", "blocks-of-16", "preempting", "prefix-hits"])
def test_latent_cache_serves_what_full_keys_and_values_generate(block_size, budget, blocks,
                                                                shared):
    model = TinyMLAModel()
    engine = MLAEngine(model, blocks, block_size, budget)
    specs = _specs(block_size * 7 + budget + shared, 6, shared)
    for request in _served(engine, specs):
        tokens, logits = generate_full_kv(model, request.prompt, request.output_len)
        assert request.output == tokens
        assert torch.allclose(torch.stack(request.logits), torch.stack(logits), atol=1e-4)
    assert engine.kv_cache.num_free() == blocks - 1
    if shared:
        assert engine.prompt_hits > 0
    if blocks == 10:
        assert any(record.preempted for record in engine.records)


def test_decodes_go_through_the_absorbed_path_and_prefill_chunks_do_not():
    calls = []

    def counting(query, *args):
        calls.append(len(query))
        return absorbed_decode(query, *args)

    engine = MLAEngine(TinyMLAModel(), 64, 4, 16, decode=counting)
    _served(engine, [([1, 2, 3, 4, 5, 6, 7], 4, 0), ([9, 8], 3, 0)])
    # step 1 prefills both prompts (7 and 2 tokens: no decode); then the first request
    # decodes 3 tokens and the second 2, each step once per layer (2 layers)
    assert calls == [2, 2, 2, 2, 1, 1]


def _full_attention(model: TinyMLAModel, layer: int, query: torch.Tensor,
                    records: torch.Tensor) -> torch.Tensor:
    c = model.config
    keys, values = model.full_kv(layer, *records.split([c.kv_lora_rank,
                                                        c.qk_rope_head_dim], dim=1))
    return causal_attention(query[None], keys, values, model.scale, past=len(records) - 1)[0]


@pytest.mark.parametrize("context", [1, 5, 33])
def test_absorbed_decode_is_full_attention_query_by_query(context: int):
    model, gen = TinyMLAModel(MLAConfig(num_heads=8)), torch.Generator().manual_seed(context)
    c = model.config
    block_size, num_blocks = 4, 16
    cache = torch.randn(num_blocks, block_size, c.record_dim, generator=gen)
    table = torch.randperm(num_blocks, generator=gen)[:-(-context // block_size)]
    query = torch.randn(1, c.num_heads, c.qk_nope_head_dim + c.qk_rope_head_dim, generator=gen)
    w = model.layers[1]
    out = absorbed_decode(query, cache, torch.tensor([context], dtype=torch.int32),
                          table[None].to(torch.int32), w["w_uk"], w["w_uv"], model.scale)
    records = cache[table].reshape(-1, c.record_dim)[:context]
    want = _full_attention(model, 1, query[0], records)
    assert out.shape == (1, c.num_heads, c.v_head_dim)
    assert torch.allclose(out[0], want, atol=1e-5)


def _dropping_rope(query, cache, seq_lens, tables, w_uk, w_uv, scale, attention):
    query = query.clone()
    query[..., w_uk.shape[1]:] = 0
    return absorbed_decode(query, cache, seq_lens, tables, w_uk, w_uv, scale, attention)


def _one_heads_up_projection(query, cache, seq_lens, tables, w_uk, w_uv, scale, attention):
    same = w_uv[:1].expand_as(w_uv)
    return absorbed_decode(query, cache, seq_lens, tables, w_uk, same, scale, attention)


@pytest.mark.parametrize("wrong", [_dropping_rope, _one_heads_up_projection],
                         ids=["rope-dropped", "one-heads-up-projection"])
def test_a_wrong_absorption_is_caught_by_the_full_kv_comparison(wrong):
    model = TinyMLAModel()
    engine = MLAEngine(model, 64, 4, 16, decode=wrong)
    differs = False
    for request in _served(engine, _specs(3, 4)):
        tokens, logits = generate_full_kv(model, request.prompt, request.output_len)
        differs |= not torch.allclose(torch.stack(request.logits), torch.stack(logits),
                                      atol=1e-4)
    assert differs


def test_the_fp8_record_is_flashmlas_layout():
    record = LatentRecord(512, 64)
    assert (record.num_tiles, record.scales_at, record.rope_at, record.num_bytes) == (
        4, 512, 528, 656)
    gen = torch.Generator().manual_seed(0)
    latent, rope = torch.randn(3, 512, generator=gen), torch.randn(3, 64, generator=gen)
    packed = pack_latent_fp8(latent, rope, record)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 656)
    scales = packed[:, 512:528].contiguous().view(torch.float32)
    for tile in range(4):
        part = latent[:, tile * 128:(tile + 1) * 128]
        assert torch.equal(scales[:, tile], tile_scale(part.abs().amax(dim=1)))
        codes = (part / scales[:, tile:tile + 1]).to(torch.float8_e4m3fn).view(torch.uint8)
        assert torch.equal(packed[:, tile * 128:(tile + 1) * 128], codes)
    assert torch.equal(packed[:, 528:].contiguous().view(torch.bfloat16), rope.bfloat16())
    assert bool((torch.log2(scales) == torch.log2(scales).round()).all())  # powers of two
    back = unpack_latent_fp8(packed, record)
    half_step = torch.maximum(latent.abs() * 2**-4, scales.repeat_interleave(128, 1) * 2**-10)
    assert bool(((back[:, :512] - latent).abs() <= half_step).all())


class _RoundedLatents(TinyMLAModel):
    """The same weights, every latent and rotary key rounded through ``record``'s bytes."""

    def __init__(self, model: TinyMLAModel, record: LatentRecord) -> None:
        self.__dict__.update(model.__dict__)
        self.record = record

    def qkv(self, layer, x, positions):
        q, latent, k_pe = super().qkv(layer, x, positions)
        back = unpack_latent_fp8(pack_latent_fp8(latent, k_pe, self.record), self.record)
        return q, back[:, :latent.shape[1]], back[:, latent.shape[1]:]


@pytest.mark.parametrize("tile", [16, 32])
def test_fp8_records_are_the_float_engine_over_rounded_latents(tile: int):
    model = TinyMLAModel()
    record = LatentRecord(32, 8, tile)
    specs = _specs(tile, 6, shared=6)
    fp8 = MLAEngine(model, 64, 4, 16, record=record)
    ours = _served(fp8, specs)
    assert fp8.pool.k[0].dtype == torch.uint8 and fp8.pool.k[0].shape[-1] == record.num_bytes
    plain = _served(MLAEngine(_RoundedLatents(model, record), 64, 4, 16), specs)
    for a, b in zip(ours, plain, strict=True):
        assert a.output == b.output
        assert torch.allclose(torch.stack(a.logits), torch.stack(b.logits), atol=1e-5)


def test_the_latent_cache_is_smaller_than_full_keys_and_values():
    c = MLAConfig()
    full = c.num_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim)
    assert (c.record_dim, full) == (40, 160)
    assert LatentRecord(c.kv_lora_rank, c.qk_rope_head_dim, 16).num_bytes == 32 + 8 + 16


def test_latent_attention_reads_the_latent_as_its_values():
    gen = torch.Generator().manual_seed(4)
    cache = torch.randn(4, 2, 12, generator=gen)
    query = torch.randn(1, 3, 12, generator=gen)
    out = latent_attention(query, cache, torch.tensor([3], dtype=torch.int32),
                           torch.tensor([[2, 0]], dtype=torch.int32), 0.5, 8)
    records = torch.cat([cache[2], cache[0]])[:3]
    weights = (query[0] @ records.T * 0.5).softmax(-1)
    assert torch.allclose(out[0], weights @ records[:, :8], atol=1e-6)
