"""A tiny hybrid model served through one pool (``course.hybrid_engine``): token for token equal
to contiguous generation with each layer's window, its logits too, with blocks of 1 and more,
windows of 1 and more, and a pool small enough that requests are preempted and computed again;
once through the Triton kernels. A sliding group holds no more blocks than its window spans,
and an engine that lets sliding layers see every token is caught.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from course.chunked_scheduler import ChunkedRequest
from course.hybrid_cache import NULL_BLOCK, full_attention_hit
from course.hybrid_engine import HybridEngine, attend_in_pytorch, attend_in_triton, serve
from course.hybrid_prefix import HybridPrefixCache
from course.prefix_cache import prefix_keys
from course.tiny_model import TinyConfig, TinyModel, generate_contiguous


def _requests(seed: int, count: int) -> list[ChunkedRequest]:
    rng = random.Random(seed)
    return [ChunkedRequest(i, [rng.randrange(128) for _ in range(rng.randint(1, 12))],
                          rng.randint(1, 10)) for i in range(count)]


def _expected(model: TinyModel, requests: list[ChunkedRequest]):
    return [generate_contiguous(model, r.prompt, r.output_len) for r in requests]


def _assert_same(model: TinyModel, served: list[ChunkedRequest]) -> None:
    for request, (tokens, logits) in zip(served, _expected(model, served), strict=True):
        assert request.output == tokens, f"request {request.id} ({request.prompt})"
        torch.testing.assert_close(torch.stack(request.logits), torch.stack(logits),
                                   atol=1e-4, rtol=1e-4)


SCENARIOS = [
    # (windows per layer, block size, blocks in the pool, tokens per step)
    ((3, None, 3, None), 4, 64, 64),
    ((3, None, 3, None), 1, 200, 7),
    ((5, None, 5, None), 2, 20, 5),
    ((1, None, 1, None), 4, 10, 3),
    ((None, 2, None, 2), 2, 64, 1),
    ((4, 4), 4, 8, 16),
]


@pytest.mark.parametrize(("windows", "block_size", "num_blocks", "budget"), SCENARIOS,
                         ids=["window 3", "blocks of 1, chunks", "small pool", "window 1",
                              "full first, a token a step", "sliding only, tight"])
def test_a_hybrid_model_serves_what_contiguous_generation_gives(windows, block_size,
                                                                num_blocks, budget):
    model = TinyModel(TinyConfig(num_layers=len(windows), windows=windows), seed=4)
    engine = HybridEngine(model, num_blocks, block_size, max_num_batched_tokens=budget)
    served = serve(engine, _requests(seed=num_blocks, count=5))
    _assert_same(model, served)
    assert engine.manager.tables == {}
    assert sorted(engine.manager.free_blocks) == list(range(1, num_blocks))


def test_a_pool_too_small_for_every_request_preempts_and_still_gives_the_same_tokens():
    model = TinyModel(TinyConfig(num_layers=4, windows=(3, None, 3, None)), seed=5)
    engine = HybridEngine(model, num_blocks=16, block_size=2)
    served = serve(engine, _requests(seed=8, count=6))
    assert engine.preemptions > 0
    _assert_same(model, served)


@pytest.mark.parametrize("budget", [1, 3, 8])
def test_a_sliding_group_holds_no_more_blocks_than_its_window_and_a_step_span(budget):
    """At most cdiv(window - 1 + tokens per step, block_size) + 1 blocks, the bound vLLM sizes
    a sliding-window layer's memory by (``SlidingWindowSpec.max_memory_usage_bytes``); the
    full group holds every block."""
    model = TinyModel(TinyConfig(num_layers=2, windows=(4, None)), seed=6)
    engine = HybridEngine(model, num_blocks=64, block_size=2, max_num_batched_tokens=budget)
    request = ChunkedRequest(0, list(range(20)), 10)
    engine.add(request)
    while not request.done:
        engine.step()
        if request.done:
            break
        sliding, full = engine.manager.tables[0]
        held = [b for b in sliding if b != NULL_BLOCK]
        assert len(held) <= -(-(4 - 1 + budget) // 2) + 1, sliding
        assert NULL_BLOCK not in full and len(full) == len(sliding)


def test_the_comparison_catches_sliding_layers_that_see_every_token():
    def every_token(query, k_cache, v_cache, query_start_loc, seq_lens, block_tables, window,
                    scale):
        return attend_in_pytorch(query, k_cache, v_cache, query_start_loc, seq_lens,
                                 block_tables, None, scale)

    model = TinyModel(TinyConfig(num_layers=4, windows=(3, None, 3, None)), seed=4)
    engine = HybridEngine(model, num_blocks=64, block_size=4, attention=every_token)
    with pytest.raises(AssertionError):  # reads the null block, or differs where it cannot
        _assert_same(model, serve(engine, _requests(seed=64, count=5)))


def test_a_request_the_whole_pool_cannot_hold_is_refused():
    model = TinyModel(TinyConfig(num_layers=2, windows=(3, None)), seed=1)
    engine = HybridEngine(model, num_blocks=6, block_size=2)  # 5 blocks: 10 tokens at most
    engine.add(ChunkedRequest(0, list(range(9)), 4))
    with pytest.raises(ValueError, match="more blocks than the pool holds"):
        for _ in range(20):
            engine.step()


def test_groups_of_different_sizes_are_refused():
    with pytest.raises(ValueError, match="as many layers"):
        HybridEngine(TinyModel(TinyConfig(num_layers=3, windows=(3, None, None))), 8, 4)


def test_the_triton_kernels_serve_the_same_tokens():
    model = TinyModel(TinyConfig(num_layers=2, windows=(3, None)), seed=7)
    engine = HybridEngine(model, num_blocks=10, block_size=4, attention=attend_in_triton)
    served = serve(engine, _requests(seed=2, count=3))
    _assert_same(model, served)


# --- prefix hits across groups ---------------------------------------------------------------


def _sharing_a_prefix(seed: int, count: int) -> list[ChunkedRequest]:
    """Requests that begin with one system prompt, some with a few tokens of their own."""
    rng = random.Random(seed)
    system = [rng.randrange(128) for _ in range(rng.randint(6, 14))]
    return [ChunkedRequest(i, system + [rng.randrange(128) for _ in range(rng.randint(0, 5))],
                          rng.randint(1, 8)) for i in range(count)]


def _check_pool(manager: HybridPrefixCache) -> None:
    """A block is free exactly when no table holds it, as often as tables hold it; a cached
    block has one key of one group, and is found under it."""
    held = Counter(b for tables in manager.tables.values() for t in tables for b in t
                   if b != NULL_BLOCK)
    for block in range(1, len(manager.references)):
        assert manager.references[block] == held[block], (block, manager.tables)
        assert (block in manager.free_blocks) == (held[block] == 0), block
    assert all(manager.cached[key] == block for block, key in manager.key_of.items())
    assert len(manager.cached) == len(manager.key_of)


@pytest.mark.parametrize(("windows", "block_size", "num_blocks"), [
    ((3, None, 3, None), 2, 64),
    ((6, None, 6, None), 4, 40),
    ((None, 5, None, 5), 1, 120),
    ((3, None, 3, None), 2, 24),
], ids=["window 3", "window 6", "blocks of 1", "small pool"])
def test_prefix_hits_across_groups_serve_the_same_tokens(windows, block_size, num_blocks):
    model = TinyModel(TinyConfig(num_layers=len(windows), windows=windows), seed=9)
    engine = HybridEngine(model, num_blocks, block_size, prefix_caching=True)
    requests = _sharing_a_prefix(seed=num_blocks, count=6)
    for request in requests:  # one after another: each finds the prefix the others left
        engine.add(request)
        while not request.done:
            engine.step()
            _check_pool(engine.manager)
    assert engine.hit_tokens >= (len(requests) - 1) * block_size
    _assert_same(model, requests)
    assert engine.manager.tables == {} and engine.manager.num_free() == num_blocks - 1


def test_prefix_hits_and_preemption_together_serve_the_same_tokens():
    model = TinyModel(TinyConfig(num_layers=4, windows=(3, None, 3, None)), seed=10)
    engine = HybridEngine(model, num_blocks=20, block_size=2, prefix_caching=True)
    requests = _sharing_a_prefix(seed=3, count=6)
    for request in requests:
        engine.add(request)
    while not all(r.done for r in requests):
        engine.step()
        _check_pool(engine.manager)
    assert engine.preemptions > 0 and engine.hit_tokens > 0
    _assert_same(model, requests)


def test_without_the_prefix_cache_nothing_is_a_hit():
    model = TinyModel(TinyConfig(num_layers=2, windows=(3, None)), seed=9)
    engine = HybridEngine(model, 64, 2)
    serve(engine, _sharing_a_prefix(seed=5, count=4))
    assert engine.hit_tokens == 0


@pytest.mark.parametrize("num_blocks", [12, 14, 20])
def test_a_sliding_groups_evicted_blocks_shorten_the_hit(num_blocks):
    """A long prompt, computed a token a step, leaves its blocks cached; its sliding group's
    blocks were freed first (as the window left them), so another request's blocks evict them
    first. A request with the same prompt then hits only as far as both groups accept: the
    longest length whose window (the token before it, with a window of 2) and whose whole
    prefix are cached, tried one length at a time; in the smallest pool, shorter than the full
    group's hit alone."""
    model = TinyModel(TinyConfig(num_layers=2, windows=(2, None)), seed=9)
    engine = HybridEngine(model, num_blocks, 2, prefix_caching=True, max_num_batched_tokens=1)
    prompt = list(range(40, 52))
    first, other, again = (ChunkedRequest(0, prompt, 1), ChunkedRequest(1, list(range(60, 66)), 1),
                           ChunkedRequest(2, [*prompt, 7], 2))
    for request in (first, other):
        engine.add(request)
        while not request.done:
            engine.step()
    keys = prefix_keys(again.tokens, 2)
    sliding, full = ({i for i, key in enumerate(keys) if (group, key) in engine.manager.cached}
                     for group in (0, 1))
    longest = max(length for length in range(0, len(prompt) + 1, 2)
                  if all(i in full for i in range(length // 2))
                  and all(i in sliding for i in range(max(0, length - 1) // 2, length // 2)))
    engine.add(again)
    engine.step()
    assert engine.hit_tokens == longest
    if num_blocks == 12:
        assert longest < full_attention_hit(full, len(prompt), 2)
    while not again.done:
        engine.step()
    _assert_same(model, [first, other, again])
