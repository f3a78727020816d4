"""Chapter 10's demonstrations, each run on the learner's own functions: a request's bytes as
it grows, the prefix hits a sliding window keeps, and a tiny hybrid model served through the
learner's ``allocate_slots`` and ``hybrid_hit``, token for token against contiguous
generation. (The requests a pool fits: ``course.hybrid_sizing.fit_table``.)
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import plotly.graph_objects as go
import torch

from course.charts import lines_chart
from course.chunked_scheduler import ChunkedRequest
from course.hybrid_engine import HybridEngine, serve
from course.hybrid_manager import HybridBlockManager
from course.hybrid_models import HybridModel
from course.hybrid_prefix import HybridPrefixCache
from course.hybrid_sim import HybridCacheReport, serve_hybrid
from course.hybrid_sizing import Sizing
from course.language import tr
from course.prefix_sim import PrefixRequest, chat, few_shot, multi_turn
from course.tiny_model import TinyModel, generate_contiguous

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
                  pools: Sequence[int], allocate_slots: Callable | None = None,
                  hybrid_hit: Callable | None = None) -> list[HitRateRow]:
    """Each workload in each pool, all full attention and with a sliding window of ``window``
    tokens in half the layers, through a prefix cache that allocates with ``allocate_slots``
    and finds each hit with ``hybrid_hit`` (the course's where not given)."""
    cache = learners_manager(HybridPrefixCache, allocate_slots, hybrid_hit)
    return [HitRateRow(name, pool,
                       serve_hybrid(requests, [None, None], block_size, pool,
                                    manager_class=cache),
                       serve_hybrid(requests, [window, None], block_size, pool,
                                    manager_class=cache))
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


def learners_manager(manager_class: type[HybridBlockManager], allocate_slots: Callable | None
                     = None, hybrid_hit: Callable | None = None) -> type[HybridBlockManager]:
    """``manager_class`` with a learner's ``allocate_slots`` as its method and, for a prefix
    cache, a learner's ``hybrid_hit`` finding its hits (each only where given)."""
    own: dict = {}
    if allocate_slots is not None:
        own["allocate_slots"] = allocate_slots
    if hybrid_hit is not None:
        own["find_hit"] = staticmethod(hybrid_hit)
    return type(manager_class.__name__, (manager_class,), own)


def shared_prefix_requests(seed: int, count: int, prefix: int = 12) -> list[ChunkedRequest]:
    """``count`` requests; every other one starts with the same ``prefix`` tokens."""
    rng = random.Random(seed)
    shared = [rng.randrange(128) for _ in range(prefix)]
    return [ChunkedRequest(i, (shared if i % 2 == 0 else []) +
                          [rng.randrange(128) for _ in range(rng.randint(1, 10))],
                          rng.randint(1, 8)) for i in range(count)]


def equality_row(model: TinyModel, allocate_slots: Callable, hybrid_hit: Callable,
                 block_size: int, num_blocks: int, budget: int, prefix_caching: bool,
                 count: int = 8) -> dict:
    """Serve ``count`` requests (half of them sharing a prefix) through a ``HybridEngine``
    whose manager allocates with ``allocate_slots`` (and, caching prefixes, finds its hits
    with ``hybrid_hit``); compare each with contiguous generation under the same windows:
    requests identical, preemptions, hit tokens, and the largest logit difference."""
    base = HybridPrefixCache if prefix_caching else HybridBlockManager
    engine = HybridEngine(model, num_blocks, block_size, prefix_caching=prefix_caching,
                          max_num_batched_tokens=budget,
                          manager_class=learners_manager(base, allocate_slots, hybrid_hit))
    served = serve(engine, shared_prefix_requests(seed=num_blocks, count=count))
    identical, largest = 0, 0.0
    for request in served:
        tokens, logits = generate_contiguous(model, request.prompt, request.output_len)
        identical += request.output == tokens
        difference = (torch.stack(request.logits) - torch.stack(logits)).abs().max()
        largest = max(largest, float(difference))
    return {"requests": len(served), "identical": identical,
            "preemptions": engine.preemptions, "hit_tokens": engine.hit_tokens,
            "largest_logit_difference": largest,
            "all_blocks_back": engine.manager.num_free() == num_blocks - 1}
