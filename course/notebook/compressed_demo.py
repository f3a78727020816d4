"""Chapter 13's demonstrations: FP8 attention's error over context lengths against its bound,
a stale scale, the tiny models served from FP8 and latent caches, and the Triton kernel over
FP8 records, each run with the functions a learner wrote (or the course's).

Queries, keys and values here are drawn from unit normal distributions, and the attention
scale is 1/sqrt(head_dim), so a query's scores spread over about one unit, as a trained
model's do; ``small_head_rows`` makes one head smaller than another.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import plotly.graph_objects as go
import torch

from course.language import tr_later
from course.mla_model import TinyMLAModel, generate_full_kv
from course.notebook.charts import lines_chart
from course.tiny_model import TinyModel, causal_attention
from course.v1.chunked_engine import ChunkedEngine, engine_requests, serve_chunked
from course.v1.fp8_engine import Fp8Engine, KVScales
from course.v1.kv_quant import (
    K_SCALE_CONSTANT,
    V_SCALE_CONSTANT,
    attention_error_bound,
    dequantize_fp8,
)
from course.v1.mla_engine import MLAEngine
from kernels.latent_record import LatentRecord

HEAD_DIM, QUERY_HEADS, KV_HEADS = 64, 8, 2
CONTEXTS = (16, 64, 256, 1024, 4096)


def attention_case(context: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """One decode query [QUERY_HEADS, HEAD_DIM] and ``context`` keys and values [context,
    KV_HEADS, HEAD_DIM]."""
    gen = torch.Generator().manual_seed(seed * 100_003 + context)
    return (torch.randn(QUERY_HEADS, HEAD_DIM, generator=gen),
            torch.randn(context, KV_HEADS, HEAD_DIM, generator=gen),
            torch.randn(context, KV_HEADS, HEAD_DIM, generator=gen))


def _attend(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return causal_attention(query[None], keys, values, 1 / math.sqrt(HEAD_DIM),
                            past=len(keys) - 1)[0]


def _read_back(x: torch.Tensor, scale: torch.Tensor, quantize: Callable) -> torch.Tensor:
    return dequantize_fp8(quantize(x, scale), scale)


def error_rows(quantize: Callable, kv_scale: Callable,
               contexts: tuple[int, ...] = CONTEXTS) -> list[dict]:
    """Per context length: the largest error of one query's attention output against
    float32's, with K/V stored in bf16 and in FP8 (one scale per tensor, from the keys and
    values themselves, as a calibration would set it), and FP8's bound
    (``attention_error_bound``, the largest over heads)."""
    rows = []
    group = QUERY_HEADS // KV_HEADS
    for context in contexts:
        query, keys, values = attention_case(context)
        exact = _attend(query, keys, values)
        k_scale = kv_scale(keys, K_SCALE_CONSTANT, False)
        v_scale = kv_scale(values, V_SCALE_CONSTANT, False)
        bf16 = _attend(query, keys.bfloat16().float(), values.bfloat16().float())
        fp8 = _attend(query, _read_back(keys, k_scale, quantize),
                      _read_back(values, v_scale, quantize))
        bound = attention_error_bound(query, keys.repeat_interleave(group, 1),
                                      values.repeat_interleave(group, 1), k_scale, v_scale,
                                      1 / math.sqrt(HEAD_DIM))
        rows.append({"context": context, "bf16": (bf16 - exact).abs().max().item(),
                     "fp8": (fp8 - exact).abs().max().item(), "bound": bound.max().item()})
    return rows


def small_head_rows(quantize: Callable, kv_scale: Callable,
                    ratios: tuple[float, ...] = (1, 100, 1e4, 1e5, 1e6)) -> list[dict]:
    """Two KV heads, the second ``ratio`` times smaller than the first: the second head's
    largest error after an FP8 round trip relative to its largest value, with a scale per
    tensor and with a scale per head. e4m3 is a floating-point format, so a shared scale costs
    nothing until the small head's values fall below its smallest normal number (2^-6 of the
    scale)."""
    gen = torch.Generator().manual_seed(13)
    rows = []
    for ratio in ratios:
        x = torch.randn(256, 2, HEAD_DIM, generator=gen)
        x[:, 1] /= ratio
        row = {"ratio": ratio}
        for name, per_head in (("per tensor", False), ("per head", True)):
            scale = kv_scale(x, K_SCALE_CONSTANT, per_head)
            error = (_read_back(x, scale, quantize) - x)[:, 1].abs().max()
            row[name] = (error / x[:, 1].abs().max()).item()
        rows.append(row)
    return rows


def error_chart(rows: list[dict]) -> go.Figure:
    """The rows of ``error_rows``, one line per storage, the bound dotted."""
    names = {"bf16": tr_later("K/V in bf16"), "fp8": tr_later("K/V in FP8"),
             "bound": tr_later("FP8's bound")}
    figure = lines_chart([row["context"] for row in rows],
                         {label: [row[key] for row in rows] for key, label in names.items()},
                         title="Attention's error against float32, by context length",
                         x_title="context (tokens)", y_title="largest error of the output",
                         log_x=True)
    figure.update_yaxes(type="log")
    figure.data[-1].line.dash = "dot"
    return figure


def stale_rows(quantize: Callable, kv_scale: Callable,
               growths: tuple[float, ...] = (1, 2, 3, 4, 8, 16)) -> list[dict]:
    """Keys calibrated once, then grown ``growth`` times (a later prompt unlike the
    calibration's): the attention error with the stale key scale, the share of key values
    saturated, and the error with a scale computed afresh."""
    query, keys, values = attention_case(256, seed=1)
    k_scale = kv_scale(keys, K_SCALE_CONSTANT, False)
    v_scale = kv_scale(values, V_SCALE_CONSTANT, False)
    stored_values = _read_back(values, v_scale, quantize)
    rows = []
    for growth in growths:
        grown = keys * growth
        exact = _attend(query, grown, values)
        codes = quantize(grown, k_scale)
        fresh = kv_scale(grown, K_SCALE_CONSTANT, False)
        rows.append({
            "growth": growth,
            "saturated": (codes & 0x7F).eq(0x7E).float().mean().item(),
            "stale": (_attend(query, dequantize_fp8(codes, k_scale), stored_values) - exact
                      ).abs().max().item(),
            "fresh": (_attend(query, _read_back(grown, fresh, quantize), stored_values) - exact
                      ).abs().max().item()})
    return rows


def _requests(seed: int, count: int = 6, shared: int = 0) -> list:
    rng = random.Random(seed)
    prefix = [rng.randrange(128) for _ in range(shared)]
    return [((prefix if rng.random() < 0.6 else []) +
             [rng.randrange(128) for _ in range(rng.randint(1, 14))],
             rng.randint(4, 16), rng.randrange(4)) for _ in range(count)]


# scenarios served from compressed caches: blocks in the pool, block size, token budget, tokens
# the prompts share
SERVING_SCENARIOS = {
    tr_later("blocks of 4"): dict(num_blocks=64, block_size=4, budget=16),
    tr_later("blocks of 1, budget 3"): dict(num_blocks=300, block_size=1, budget=3),
    tr_later("a small pool: preemption"): dict(num_blocks=12, block_size=4, budget=8),
    tr_later("shared prefixes: hits"): dict(num_blocks=64, block_size=4, budget=16, shared=8),
}


def _served(engine: ChunkedEngine, specs: list) -> list:
    return sorted(serve_chunked(engine, engine_requests(specs)), key=lambda r: r.id)


def _largest_gap(ours: list, theirs: list) -> float:
    """The largest logit difference over the steps where both requests had generated the
    same tokens so far (after a different token the contexts differ)."""
    gaps = []
    for x, y in zip(ours, theirs, strict=True):
        for step, (a, b) in enumerate(zip(x.logits, y.logits, strict=True)):
            gaps.append((a - b).abs().max().item())
            if x.output[step] != y.output[step]:
                break
    return max(gaps, default=0.0)


def fp8_serving_row(scenario: dict, quantize: Callable, kv_scale: Callable,
                    per_head: bool = False, seed: int = 0) -> dict:
    """The tiny model served from an FP8 pool and from a float32 one: requests, how many
    generated the same tokens, the largest logit difference, and each pool's bytes."""
    model, specs = TinyModel(), _requests(seed, shared=scenario.get("shared", 0))
    shape = dict(num_blocks=scenario["num_blocks"], block_size=scenario["block_size"],
                 max_num_batched_tokens=scenario["budget"])
    fp8 = Fp8Engine(model, **shape, scales=KVScales(per_head, scale=kv_scale),
                    quantize=quantize)
    plain = ChunkedEngine(model, **shape)
    ours, theirs = _served(fp8, specs), _served(plain, specs)
    return {"requests": len(ours),
            "identical": sum(a.output == b.output for a, b in zip(ours, theirs, strict=True)),
            "largest_gap": _largest_gap(ours, theirs),
            "fp8_bytes": sum(t.nbytes for t in fp8.pool.k + fp8.pool.v),
            "fp32_bytes": sum(t.nbytes for t in plain.pool.k + plain.pool.v)}


def mla_serving_row(scenario: dict, decode: Callable, pack: Callable | None = None,
                    seed: int = 0) -> dict:
    """The tiny MLA model served from its latent cache (float32 records, or FP8 ones written
    by ``pack``) against generation that computes every head's keys and values: requests, how
    many generated the same tokens, the largest logit difference, and the pool's bytes per
    token per layer."""
    model, specs = TinyMLAModel(), _requests(seed, shared=scenario.get("shared", 0))
    c = model.config
    record = LatentRecord(c.kv_lora_rank, c.qk_rope_head_dim, 16) if pack else None
    engine = MLAEngine(model, scenario["num_blocks"], scenario["block_size"],
                       scenario["budget"], record=record, decode=decode,
                       **({"pack": pack} if pack else {}))
    finished = _served(engine, specs)
    full = [generate_full_kv(model, r.prompt, r.output_len) for r in finished]
    identical = sum(r.output == tokens for r, (tokens, _) in zip(finished, full, strict=True))
    gap = max(((torch.stack(r.logits) - torch.stack(logits)).abs().max().item()
               for r, (tokens, logits) in zip(finished, full, strict=True)
               if r.output == tokens), default=0.0)
    pool = engine.pool.k[0]
    return {"requests": len(finished), "identical": identical, "largest_gap": gap,
            "bytes_per_token": pool[0, 0].nbytes}


# --- probes: a learner's function is used once it gives the course's result here ------------


def absorbed_probe(fn: Callable) -> torch.Tensor:
    """``fn`` as ``absorbed_decode`` on two sequences (3 and 6 tokens, blocks of 4) over
    random records, with the tiny MLA model's first layer's up-projections."""
    model, gen = TinyMLAModel(), torch.Generator().manual_seed(5)
    c, weights = model.config, model.layers[0]
    cache = torch.randn(8, 4, c.record_dim, generator=gen)
    query = torch.randn(2, c.num_heads, c.qk_nope_head_dim + c.qk_rope_head_dim, generator=gen)
    return fn(query, cache, torch.tensor([3, 6], dtype=torch.int32),
              torch.tensor([[5, 0], [2, 7]], dtype=torch.int32), weights["w_uk"],
              weights["w_uv"], model.scale)


def byte_probe(fn: Callable) -> torch.Tensor:
    """Every e4m3 byte, 0 to 255, turned into a float by ``fn`` inside a Triton kernel."""
    from kernels.mla_decode import decode_bytes

    return decode_bytes(torch.arange(256, dtype=torch.int32).to(torch.uint8), fn)


def kernel_rows(decode: Callable, pack: Callable, seed: int = 0) -> list[dict]:
    """The decode kernel over FP8 records written by ``pack`` (the tiny model's shapes: a
    latent of 32 in tiles of 16, a rotary key of 8), its bytes turned into floats by
    ``decode``, against PyTorch over the same records: the largest difference, per shape."""
    from kernels.mla_decode import mla_decode, mla_decode_reference

    record, gen, rows = LatentRecord(32, 8, 16), torch.Generator().manual_seed(seed), []
    for sequences, heads, block_size in ((1, 4, 4), (3, 4, 4), (2, 16, 8), (2, 20, 16)):
        lengths = torch.randint(1, 3 * block_size, (sequences,), generator=gen)
        per_seq = -(-int(lengths.max()) // block_size)
        num_blocks = sequences * per_seq + 1
        latent = torch.randn(num_blocks * block_size, 32, generator=gen)
        rope = torch.randn(num_blocks * block_size, 8, generator=gen)
        cache = pack(latent, rope, record).reshape(num_blocks, block_size, -1)
        tables = (torch.randperm(num_blocks - 1, generator=gen)[:sequences * per_seq] + 1
                  ).reshape(sequences, per_seq).to(torch.int32)
        query = torch.randn(sequences, heads, 40, generator=gen)
        seq_lens = lengths.to(torch.int32)
        ours = mla_decode(query, cache, seq_lens, tables, 0.2, 32, record, decode=decode)
        want = mla_decode_reference(query, cache, seq_lens, tables, 0.2, 32, record)
        rows.append({"sequences": sequences, "heads": heads, "block_size": block_size,
                     "gap": (ours - want).abs().max().item()})
    return rows
