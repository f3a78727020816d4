"""A tiny hybrid model served by chapter 9's engine (``course.v1.chunked_engine.ChunkedEngine``)
over chapter 10's KV cache (``course.v1.hybrid_coordinator.HybridKVCacheCoordinator``): token for
token equal to contiguous generation with each layer's window, its logits too, with blocks of
1 and more, windows of 1 and more, and a pool small enough that requests are preempted and
computed again; once through the Triton kernels. Every attention call is watched: no query
reads the null block or a block no request holds (one its window left behind and the pool
took back). A sliding group holds no more blocks than its window spans; prefix hits hold in
every group, their blocks held by the new request in each; every block comes back at the end;
an engine that lets sliding layers see every token, and a sliding group that frees a block
its window still sees, are caught.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from alternatives import ch10 as alternative
from mutants.ch10 import _frees_partial_blocks

from course.tiny_model import TinyConfig, TinyModel, generate_contiguous
from course.v0.prefix_cache import prefix_keys
from course.v1.chunked_engine import ChunkedEngine, engine_requests, serve_chunked
from course.v1.chunked_scheduler import ChunkedRequest
from course.v1.hybrid_coordinator import HybridKVCacheCoordinator, learners_kv_cache
from course.v1.kv_coordinator import NULL_BLOCK, KVCacheCoordinator, full_attention_hit
from kernels.sliding_window_attention import window_attention, window_attention_reference
from kernels.varlen_attention import varlen_attention
from kernels.varlen_attention_ref import varlen_paged_attention


def _engine(model: TinyModel, num_blocks: int, block_size: int, budget: int = 64,
            caching: bool = False, kv_cache: type[KVCacheCoordinator] = HybridKVCacheCoordinator,
            **attention: Callable) -> ChunkedEngine:
    """The one engine, the window's attention in PyTorch unless given; every attention call
    watched (``_watch``)."""
    attention.setdefault("window_attention", window_attention_reference)
    engine = ChunkedEngine(model, num_blocks, block_size, budget, kv_cache=kv_cache,
                           enable_caching=caching, **attention)
    _watch(engine)
    return engine


def _watch(engine: ChunkedEngine) -> None:
    """Wrap the engine's attentions: before each call, every block a query reads (every key
    up to its own under full attention, its window's under a sliding window) is no null block
    and is held by some request, so it is no block the pool took back (its K/V another
    request's once taken again)."""
    kv, reads = engine.kv_cache, Counter()
    engine.reads = reads  # how many keys were checked, per kind of layer

    def check(query_start_loc, seq_lens, block_tables, window):
        starts, lengths = query_start_loc.tolist(), seq_lens.tolist()
        for seq, length in enumerate(lengths):
            table = block_tables[seq].tolist()
            for position in range(length - (starts[seq + 1] - starts[seq]), length):
                first = 0 if window is None else max(0, position + 1 - window)
                for key in range(first, position + 1):
                    block = table[key // kv.block_size]
                    assert block != NULL_BLOCK, (position, key, window, table)
                    assert kv.pool.ref_counts[block] > 0, (position, key, window, table)
                    reads["full" if window is None else "sliding"] += 1

    full, sliding = engine.attention, engine.window_attention

    def watched_full(q, k, v, query_start_loc, seq_lens, block_tables, scale):
        check(query_start_loc, seq_lens, block_tables, None)
        return full(q, k, v, query_start_loc, seq_lens, block_tables, scale)

    def watched_sliding(q, k, v, query_start_loc, seq_lens, block_tables, window, scale):
        check(query_start_loc, seq_lens, block_tables, window)
        return sliding(q, k, v, query_start_loc, seq_lens, block_tables, window, scale)

    engine.attention, engine.window_attention = watched_full, watched_sliding


def _requests(seed: int, count: int) -> list[ChunkedRequest]:
    rng = random.Random(seed)
    return engine_requests([([rng.randrange(128) for _ in range(rng.randint(1, 12))],
                             rng.randint(1, 10), 0) for _ in range(count)])


def _assert_same(model: TinyModel, served: list[ChunkedRequest]) -> None:
    for request in served:
        tokens, logits = generate_contiguous(model, request.prompt, request.output_len)
        assert request.output == tokens, f"request {request.id} ({request.prompt})"
        torch.testing.assert_close(torch.stack(request.logits), torch.stack(logits),
                                   atol=1e-4, rtol=1e-4)


def _preemptions(engine: ChunkedEngine) -> int:
    return sum(len(record.preempted) for record in engine.records)


def _check_pool(kv: KVCacheCoordinator) -> None:
    """A block's ref count is how many tables hold it; it is in the free queue exactly when
    none does; the null block is never free, never counted, never cached; a held block is in
    one group's tables; a cached block has one key of one group, and is found under it."""
    pool = kv.pool
    held = Counter(b for m in kv.managers for t in m.tables.values() for b in t
                   if b != NULL_BLOCK)
    groups = {b: {m.group for m in kv.managers for t in m.tables.values() if b in t}
              for b in held}
    assert NULL_BLOCK not in pool.free_queue and pool.ref_counts[NULL_BLOCK] == 0
    assert NULL_BLOCK not in pool.key_of
    for block in range(1, pool.num_blocks):
        assert pool.ref_counts[block] == held[block], (block, pool.ref_counts)
        assert (block in pool.free_queue) == (held[block] == 0), block
    assert all(len(owners) == 1 for owners in groups.values()), groups
    assert all(pool.key_of[b][0] in groups[b] for b in held if b in pool.key_of)
    assert all(pool.cached[key] == block for block, key in pool.key_of.items())
    assert len(pool.cached) == len(pool.key_of)


def _all_back(engine: ChunkedEngine, num_blocks: int) -> None:
    kv = engine.kv_cache
    assert all(m.tables == {} for m in kv.managers)
    assert sorted(kv.pool.free_queue) == list(range(1, num_blocks))
    assert kv.num_held() == 0 and not any(kv.pool.ref_counts)


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
    engine = _engine(model, num_blocks, block_size, budget)
    served = serve_chunked(engine, _requests(seed=num_blocks, count=5))
    assert len(served) == 5
    _assert_same(model, served)
    _all_back(engine, num_blocks)
    assert engine.reads["sliding"] > 0 and (engine.reads["full"] > 0) == (None in windows)


def test_a_pool_too_small_for_every_request_preempts_and_still_gives_the_same_tokens():
    model = TinyModel(TinyConfig(num_layers=4, windows=(3, None, 3, None)), seed=5)
    engine = _engine(model, num_blocks=14, block_size=2)
    served = serve_chunked(engine, _requests(seed=11, count=6))
    assert _preemptions(engine) > 1
    _assert_same(model, served)
    _all_back(engine, 14)


@pytest.mark.parametrize("budget", [1, 3, 8])
def test_a_sliding_group_holds_no_more_blocks_than_its_window_and_a_step_span(budget):
    """At most cdiv(window - 1 + tokens per step, block_size) + 1 blocks, the bound vLLM sizes
    a sliding-window layer's memory by (``SlidingWindowSpec.max_memory_usage_bytes``); the
    full group holds every block."""
    model = TinyModel(TinyConfig(num_layers=2, windows=(4, None)), seed=6)
    engine = _engine(model, num_blocks=64, block_size=2, budget=budget)
    request = ChunkedRequest(0, list(range(20)), 10)
    engine.scheduler.add(request)
    nulls = 0
    while not request.done:
        engine.step()
        sliding, full = (engine.kv_cache.block_table(0, group) for group in (0, 1))
        held = [b for b in sliding if b != NULL_BLOCK]
        assert len(held) <= -(-(4 - 1 + budget) // 2) + 1, sliding
        assert NULL_BLOCK not in full and len(full) == len(sliding)
        nulls = len(sliding) - len(held)
    assert nulls > 0
    _assert_same(model, [request])


def test_the_comparison_catches_sliding_layers_that_see_every_token():
    def every_token(query, k_cache, v_cache, query_start_loc, seq_lens, block_tables, window,
                    scale):
        return varlen_paged_attention(query, k_cache, v_cache, query_start_loc, seq_lens,
                                      block_tables, scale)

    model = TinyModel(TinyConfig(num_layers=4, windows=(3, None, 3, None)), seed=4)
    engine = ChunkedEngine(model, 64, 4, 64, kv_cache=HybridKVCacheCoordinator,
                           window_attention=every_token, enable_caching=False)
    with pytest.raises(AssertionError):  # reads the null block, or differs where it cannot
        _assert_same(model, serve_chunked(engine, _requests(seed=64, count=5)))


def test_the_watch_catches_a_sliding_group_that_frees_a_block_its_window_still_sees():
    """A window's blocks freed one block early (a learner's ``free_skipped_blocks`` through
    ``learners_kv_cache``): the null block stands where the window still reads."""
    model = TinyModel(TinyConfig(num_layers=2, windows=(3, None)), seed=4)
    engine = _engine(model, 64, 2, 64,
                     kv_cache=learners_kv_cache(free_skipped_blocks=_frees_partial_blocks))
    with pytest.raises(AssertionError, match=r"\(\d+, \d+, 3, \["):
        serve_chunked(engine, _requests(seed=64, count=5))


def test_a_kv_cache_of_the_alternative_functions_serves_the_same_tokens_and_hits():
    """``learners_kv_cache`` with chapter 10's functions written another way: the same tokens,
    the same hits, the same preemptions as the course's coordinator."""
    model = TinyModel(TinyConfig(num_layers=4, windows=(3, None, 3, None)), seed=10)
    learners = learners_kv_cache(free_skipped_blocks=alternative.free_skipped_blocks,
                                 sliding_window_hit=alternative.sliding_window_hit,
                                 hybrid_hit=alternative.hybrid_hit)
    runs = []
    for kv_cache in (HybridKVCacheCoordinator, learners):
        engine = _engine(model, 20, 2, 64, caching=True, kv_cache=kv_cache)
        served = serve_chunked(engine, _sharing_a_prefix(seed=3, count=6))
        _assert_same(model, served)
        _all_back(engine, 20)
        runs.append(([r.output for r in served], engine.prompt_hits, _preemptions(engine)))
    assert runs[0] == runs[1] and runs[0][1] > 0


def test_a_request_the_whole_pool_cannot_hold_is_refused():
    model = TinyModel(TinyConfig(num_layers=2, windows=(3, None)), seed=1)
    engine = _engine(model, num_blocks=6, block_size=2)  # 5 blocks: 10 tokens at most
    with pytest.raises(ValueError, match="needs 10 blocks at once; the pool has 5"):
        engine.scheduler.add(ChunkedRequest(0, list(range(9)), 4))


def test_a_request_whose_groups_together_the_whole_pool_cannot_hold_is_refused():
    """7 blocks hold the 13 tokens' full-attention blocks, not the 12-token prompt's blocks
    in both groups (6 and 6: a window frees nothing before its tokens are computed)."""
    model = TinyModel(TinyConfig(num_layers=2, windows=(3, None)), seed=1)
    engine = _engine(model, num_blocks=8, block_size=2)
    with pytest.raises(ValueError):
        serve_chunked(engine, [ChunkedRequest(0, list(range(12)), 1)])


def test_groups_of_different_sizes_are_refused():
    with pytest.raises(ValueError, match="as many layers"):
        ChunkedEngine(TinyModel(TinyConfig(num_layers=3, windows=(3, None, None))), 8, 4, 16,
                      kv_cache=HybridKVCacheCoordinator,
                      window_attention=window_attention_reference)


def test_a_sliding_layer_without_a_window_attention_is_refused():
    model = TinyModel(TinyConfig(num_layers=2, windows=(3, None)), seed=1)
    engine = ChunkedEngine(model, 8, 4, 16, kv_cache=HybridKVCacheCoordinator)
    with pytest.raises(ValueError, match="window_attention"):
        serve_chunked(engine, _requests(seed=1, count=1))


def test_chapter_9s_coordinator_refuses_a_sliding_group():
    model = TinyModel(TinyConfig(num_layers=2, windows=(3, None)), seed=1)
    with pytest.raises(ValueError, match="HybridKVCacheCoordinator"):
        ChunkedEngine(model, 8, 4, 16, window_attention=window_attention_reference)


def test_the_triton_kernels_serve_the_same_tokens():
    model = TinyModel(TinyConfig(num_layers=2, windows=(3, None)), seed=7)
    engine = _engine(model, num_blocks=10, block_size=4, attention=varlen_attention,
                     window_attention=window_attention)
    served = serve_chunked(engine, _requests(seed=2, count=3))
    _assert_same(model, served)
    _all_back(engine, 10)


# --- prefix hits across groups ---------------------------------------------------------------


def _sharing_a_prefix(seed: int, count: int) -> list[ChunkedRequest]:
    """Requests that begin with one system prompt, some with a few tokens of their own."""
    rng = random.Random(seed)
    system = [rng.randrange(128) for _ in range(rng.randint(6, 14))]
    return engine_requests([(system + [rng.randrange(128) for _ in range(rng.randint(0, 5))],
                             rng.randint(1, 8), 0) for _ in range(count)])


def _check_hits_held(engine: ChunkedEngine, plan, seen: set[int]) -> None:
    """A request admitted for the first time with a hit of ``h`` tokens holds, in every group,
    the blocks cached for its first ``h`` tokens (one more holder each): all of them under full
    attention, the null block before those the window of token ``h`` sees under a sliding
    window; and every group accepts the hit."""
    kv = engine.kv_cache
    for chunk in plan.chunks:
        request = chunk.request
        if request.id in seen:
            continue
        seen.add(request.id)
        hit = chunk.start
        assert hit % kv.block_size == 0 and hit < request.num_tokens
        keys = prefix_keys(request.tokens[:hit], kv.block_size)
        for manager in kv.managers:
            table = manager.tables[request.id][:hit // kv.block_size]
            window = manager.window
            first = 0 if window is None else max(0, hit - window + 1) // kv.block_size
            assert table[:first] == [NULL_BLOCK] * first, (manager.group, table)
            assert table[first:] == [kv.pool.cached[manager.group, key]
                                     for key in keys[first:]], (manager.group, table)
            assert all(kv.pool.ref_counts[b] >= 1 for b in table[first:])


def _serve_one_by_one(engine: ChunkedEngine, requests: list[ChunkedRequest]) -> None:
    """Each request alone, after the one before finished: each finds the prefix the others
    left; the pool checked after every step."""
    seen: set[int] = set()
    for request in requests:
        engine.scheduler.add(request)
        while not request.done:
            _check_hits_held(engine, engine.step(), seen)
            _check_pool(engine.kv_cache)
        engine.scheduler.finish(request)
        _check_pool(engine.kv_cache)


@pytest.mark.parametrize(("windows", "block_size", "num_blocks"), [
    ((3, None, 3, None), 2, 64),
    ((6, None, 6, None), 4, 40),
    ((None, 5, None, 5), 1, 120),
    ((3, None, 3, None), 2, 24),
    ((2, 5, 2, 5), 2, 64),
], ids=["window 3", "window 6", "blocks of 1", "small pool", "two windows"])
def test_prefix_hits_across_groups_serve_the_same_tokens(windows, block_size, num_blocks):
    model = TinyModel(TinyConfig(num_layers=len(windows), windows=windows), seed=9)
    engine = _engine(model, num_blocks, block_size, caching=True)
    requests = _sharing_a_prefix(seed=num_blocks, count=6)
    _serve_one_by_one(engine, requests)
    assert engine.prompt_hits >= (len(requests) - 1) * block_size
    _assert_same(model, requests)
    assert all(m.tables == {} for m in engine.kv_cache.managers)
    assert engine.kv_cache.num_free() == num_blocks - 1


def test_prefix_hits_and_preemption_together_serve_the_same_tokens():
    model = TinyModel(TinyConfig(num_layers=4, windows=(3, None, 3, None)), seed=10)
    engine = _engine(model, num_blocks=20, block_size=2, caching=True)
    requests = _sharing_a_prefix(seed=3, count=6)
    for request in requests:
        engine.scheduler.add(request)
    seen: set[int] = set()
    while engine.scheduler.busy():
        _check_hits_held(engine, engine.step(), seen)
        _check_pool(engine.kv_cache)
        for request in [r for r in engine.scheduler.running if r.done]:
            engine.scheduler.finish(request)
    assert _preemptions(engine) > 0 and engine.prompt_hits > 0
    _assert_same(model, requests)
    _all_back(engine, 20)


def test_without_the_prefix_cache_nothing_is_a_hit():
    model = TinyModel(TinyConfig(num_layers=2, windows=(3, None)), seed=9)
    engine = _engine(model, 64, 2)
    serve_chunked(engine, _sharing_a_prefix(seed=5, count=4))
    assert engine.prompt_hits == 0 and not engine.kv_cache.pool.cached


@pytest.mark.parametrize("num_blocks", [12, 14, 20])
def test_a_sliding_groups_evicted_blocks_shorten_the_hit(num_blocks):
    """A long prompt, computed a token a step, leaves its blocks cached; its sliding group's
    blocks were freed first (as the window left them), so another request's blocks evict them
    first. A request with the same prompt then hits only as far as both groups accept: the
    longest length whose window (the token before it, with a window of 2) and whose whole
    prefix are cached, tried one length at a time; in the smallest pool, shorter than the full
    group's hit alone."""
    model = TinyModel(TinyConfig(num_layers=2, windows=(2, None)), seed=9)
    engine = _engine(model, num_blocks, 2, budget=1, caching=True)
    prompt = list(range(40, 52))
    first, other, again = (ChunkedRequest(0, prompt, 1), ChunkedRequest(1, list(range(60, 66)), 1),
                           ChunkedRequest(2, [*prompt, 7], 2))
    _serve_one_by_one(engine, [first, other])
    keys = prefix_keys(again.tokens, 2)
    cached = engine.kv_cache.pool.cached
    sliding, full = ({i for i, key in enumerate(keys) if (group, key) in cached}
                     for group in (0, 1))
    longest = max(length for length in range(0, len(prompt) + 1, 2)
                  if all(i in full for i in range(length // 2))
                  and all(i in sliding for i in range(max(0, length - 1) // 2, length // 2)))
    assert engine.kv_cache.get_computed_tokens(again) == longest
    hits_before = engine.prompt_hits
    _serve_one_by_one(engine, [again])
    assert engine.prompt_hits - hits_before == longest
    if num_blocks == 12:
        assert longest < full_attention_hit(full, len(prompt), 2)
    _assert_same(model, [first, other, again])


@pytest.mark.parametrize("budget", [64, 5, 1])
def test_a_request_that_fits_the_pool_exactly_is_served_and_one_block_less_refused(budget):
    """``most_blocks`` is the peak the request reaches, run alone: not an overestimate."""
    model = TinyModel(TinyConfig(num_layers=2, windows=(3, None)), seed=1)
    request = ChunkedRequest(0, list(range(12)), 3)
    peak = _engine(model, num_blocks=64, block_size=2, budget=budget).kv_cache.most_blocks(
        12, 15, budget)
    engine = _engine(model, num_blocks=peak + 1, block_size=2, budget=budget)
    _assert_same(model, serve_chunked(engine, [request]))
    with pytest.raises(ValueError, match="blocks at once"):
        _engine(model, num_blocks=peak, block_size=2, budget=budget).scheduler.add(
            ChunkedRequest(1, list(range(12)), 3))
