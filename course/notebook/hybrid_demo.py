"""Chapter 10's demonstrations, each run on the learner's own functions: a request's bytes as
it grows, the prefix hits a sliding window keeps, and a tiny hybrid model served by chapter
9's engine through a KV cache with the learner's sliding group and hybrid hit
(``course.v1.hybrid_coordinator.learners_kv_cache``), token for token against contiguous
generation. (The requests a pool fits: ``course.experiments.hybrid_sizing.fit_table``.)
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import plotly.graph_objects as go
import torch

from course.experiments.hybrid_models import HybridModel
from course.experiments.hybrid_sim import HybridCacheReport, serve_hybrid
from course.experiments.hybrid_sizing import Sizing
from course.experiments.prefix_sim import PrefixRequest, chat, few_shot, multi_turn
from course.language import tr
from course.notebook.charts import lines_chart
from course.tiny_model import TinyModel, generate_contiguous
from course.v1.chunked_engine import ChunkedEngine, serve_chunked
from course.v1.chunked_scheduler import ChunkedRequest
from course.v1.hybrid_coordinator import HybridKVCacheCoordinator
from course.v1.kv_coordinator import KVCacheCoordinator
from kernels.sliding_window_attention import default_window_attention

GiB = 2**30


def bytes_series(request_bytes: Sizing, models: Sequence[HybridModel],
                 lengths: Sequence[int]) -> dict[str, list[float]]:
    """GiB a request holds at each of ``lengths``, per model: as it is, and all full
    attention (the series' names are the models', and ``<model>, all full attention``)."""
    series = {}
    for model in models:
        for shape in (model, model.all_full_attention()):
            series[shape.name] = [request_bytes(shape, n) / GiB for n in lengths]
    return series


def hit_rate_workloads() -> dict[str, list[PrefixRequest]]:
    """Chapter 4's three workloads, smaller (32 chat and few-shot requests, 8 conversations of
    4 turns), by name in the learner's language."""
    return {tr("chat"): chat(32), tr("few-shot"): few_shot(32), tr("multi-turn"): multi_turn(8)}


@dataclass(frozen=True)
class HitRateRow:
    """One workload in one pool, served all full attention and with a sliding window."""

    workload: str
    blocks: int
    full: HybridCacheReport
    hybrid: HybridCacheReport


def hit_rate_rows(workloads: dict[str, list[PrefixRequest]], window: int, block_size: int,
                  pools: Sequence[int],
                  kv_cache: type[KVCacheCoordinator] = HybridKVCacheCoordinator
                  ) -> list[HitRateRow]:
    """Each workload in each pool, all full attention and with a sliding window of ``window``
    tokens in half the layers, through the KV cache ``kv_cache`` (one with a learner's
    functions: ``learners_kv_cache``)."""
    return [HitRateRow(name, pool,
                       serve_hybrid(requests, [None, None], block_size, pool, kv_cache=kv_cache),
                       serve_hybrid(requests, [window, None], block_size, pool,
                                    kv_cache=kv_cache))
            for name, requests in workloads.items() for pool in pools]


def hit_rate_chart(rows: list[HitRateRow]) -> go.Figure:
    """Hit rate against pool size: a line per workload and kind of model."""
    pools = list(dict.fromkeys(row.blocks for row in rows))
    kinds = {tr("all full"): lambda row: row.full, tr("hybrid"): lambda row: row.hybrid}
    series = {f"{name}, {kind}": [report(row).hit_rate for row in rows if row.workload == name]
              for name in dict.fromkeys(row.workload for row in rows)
              for kind, report in kinds.items()}
    return lines_chart(pools, series, title=tr("Prefix hit rate against pool size"),
                       x_title=tr("blocks in the pool"), y_title=tr("hit rate"))


def shared_prefix_requests(seed: int, count: int, prefix: int = 12) -> list[ChunkedRequest]:
    """``count`` requests; every other one starts with the same ``prefix`` tokens."""
    rng = random.Random(seed)
    shared = [rng.randrange(128) for _ in range(prefix)]
    return [ChunkedRequest(i, (shared if i % 2 == 0 else []) +
                          [rng.randrange(128) for _ in range(rng.randint(1, 10))],
                          rng.randint(1, 8)) for i in range(count)]


def equality_row(model: TinyModel, kv_cache: type[KVCacheCoordinator], block_size: int,
                 num_blocks: int, budget: int, prefix_caching: bool,
                 window_attention: Callable | None = None,
                 count: int = 8) -> dict:
    """Serve ``count`` requests (half of them sharing a prefix) through chapter 9's engine
    with the KV cache ``kv_cache`` (caching prefixes or not) and ``window_attention`` for the
    sliding layers (chapter 9's kernel on a GPU, else PyTorch); compare each with contiguous
    generation under the same windows: requests identical, preemptions, hit tokens, and the
    largest logit difference."""
    window_attention = window_attention or default_window_attention(model.embedding.device)
    engine = ChunkedEngine(model, num_blocks, block_size, budget, kv_cache=kv_cache,
                           window_attention=window_attention, enable_caching=prefix_caching)
    requests = shared_prefix_requests(seed=num_blocks, count=count)
    serve_chunked(engine, requests)
    identical, largest = 0, 0.0
    for request in requests:
        tokens, logits = generate_contiguous(model, request.prompt, request.output_len)
        identical += request.output == tokens
        difference = (torch.stack(request.logits) - torch.stack(logits)).abs().max()
        largest = max(largest, float(difference))
    return {"requests": len(requests), "identical": identical,
            "preemptions": sum(len(record.preempted) for record in engine.records),
            "hit_tokens": engine.prompt_hits, "largest_logit_difference": largest,
            "all_blocks_back": not engine.kv_cache.num_held()}
