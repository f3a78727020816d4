"""Chapter 10's demonstrations, each run on the learner's own functions: a request's bytes as
it grows, the prefix hits a sliding window keeps, and a tiny hybrid model served through the
learner's ``allocate_slots`` and ``hybrid_hit``, token for token against contiguous
generation. (The requests a pool fits: ``course.hybrid_sizing.fit_table``.)
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import torch

from course.chunked_scheduler import ChunkedRequest
from course.hybrid_engine import HybridEngine, serve
from course.hybrid_manager import HybridBlockManager
from course.hybrid_models import HybridModel
from course.hybrid_prefix import HybridPrefixCache
from course.hybrid_sim import serve_hybrid
from course.hybrid_sizing import Sizing
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


def hit_rate_rows(workloads: dict[str, list], window: int, block_size: int,
                  pools: Sequence[int], allocate_slots: Callable | None = None,
                  hybrid_hit: Callable | None = None) -> list[tuple[str, int, float, float]]:
    """(workload, blocks in the pool, hit rate all full attention, hit rate with a sliding
    window of ``window`` tokens in half the layers) for each workload and pool size, through
    a prefix cache that allocates with ``allocate_slots`` and finds each hit with
    ``hybrid_hit`` (the course's where not given)."""
    cache = learners_manager(HybridPrefixCache, allocate_slots, hybrid_hit)
    rows = []
    for name, requests in workloads.items():
        for pool in pools:
            full = serve_hybrid(requests, [None, None], block_size, pool, manager_class=cache)
            hybrid = serve_hybrid(requests, [window, None], block_size, pool,
                                  manager_class=cache)
            rows.append((name, pool, full.hit_rate, hybrid.hit_rate))
    return rows


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
