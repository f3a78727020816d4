"""A tiny hybrid model served through one pool (``course.hybrid_engine``): token for token equal
to contiguous generation with each layer's window, its logits too, with blocks of 1 and more,
windows of 1 and more, and a pool small enough that requests are preempted and computed again;
once through the Triton kernels. A sliding group holds no more blocks than its window spans,
and an engine that lets sliding layers see every token is caught.
"""

from __future__ import annotations

import random

import pytest
import torch

from course.hybrid_cache import NULL_BLOCK
from course.hybrid_engine import HybridEngine, HybridRequest, attend_in_pytorch, serve
from course.tiny_model import TinyConfig, TinyModel, generate_contiguous
from kernels.paged_attention import paged_attention
from kernels.sliding_window_attention import sliding_window_attention


def _requests(seed: int, count: int) -> list[HybridRequest]:
    rng = random.Random(seed)
    return [HybridRequest(i, [rng.randrange(128) for _ in range(rng.randint(1, 12))],
                          rng.randint(1, 10)) for i in range(count)]


def _expected(model: TinyModel, requests: list[HybridRequest]):
    return [generate_contiguous(model, r.prompt, r.max_new_tokens) for r in requests]


def _assert_same(model: TinyModel, served: list[HybridRequest]) -> None:
    for request, (tokens, logits) in zip(served, _expected(model, served), strict=True):
        assert request.output == tokens, f"request {request.id} ({request.prompt})"
        torch.testing.assert_close(torch.stack(request.logits), torch.stack(logits),
                                   atol=1e-4, rtol=1e-4)


SCENARIOS = [
    # (windows per layer, block size, blocks in the pool)
    ((3, None, 3, None), 4, 64),
    ((3, None, 3, None), 1, 200),
    ((5, None, 5, None), 2, 20),
    ((1, None, 1, None), 4, 10),
    ((None, 2, None, 2), 2, 64),
    ((4, 4), 4, 8),
]


@pytest.mark.parametrize(("windows", "block_size", "num_blocks"), SCENARIOS,
                         ids=["window 3", "blocks of 1", "small pool", "window 1",
                              "full first", "sliding only, tight"])
def test_a_hybrid_model_serves_what_contiguous_generation_gives(windows, block_size,
                                                                num_blocks):
    model = TinyModel(TinyConfig(num_layers=len(windows), windows=windows), seed=4)
    engine = HybridEngine(model, num_blocks, block_size)
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


def test_a_sliding_group_holds_no_more_blocks_than_its_window_spans():
    model = TinyModel(TinyConfig(num_layers=2, windows=(4, None)), seed=6)
    engine = HybridEngine(model, num_blocks=64, block_size=2)
    request = HybridRequest(0, list(range(20)), 10)
    engine.add(request)
    while not request.done:
        engine.step()
        if request.done:
            break
        sliding, full = engine.manager.tables[0]
        held = [b for b in sliding if b != NULL_BLOCK]
        assert len(held) <= -(-4 // 2) + 1, sliding  # the window's blocks, one partly
        assert NULL_BLOCK not in full and len(full) == len(sliding)


def test_the_comparison_catches_sliding_layers_that_see_every_token():
    def every_token(query, k_cache, v_cache, block_tables, seq_lens, window, scale):
        return attend_in_pytorch(query, k_cache, v_cache, block_tables, seq_lens, None, scale)

    model = TinyModel(TinyConfig(num_layers=4, windows=(3, None, 3, None)), seed=4)
    engine = HybridEngine(model, num_blocks=64, block_size=4, attend=every_token)
    with pytest.raises(AssertionError):  # reads the null block, or differs where it cannot
        _assert_same(model, serve(engine, _requests(seed=64, count=5)))


def test_a_request_the_whole_pool_cannot_hold_is_refused():
    model = TinyModel(TinyConfig(num_layers=2, windows=(3, None)), seed=1)
    engine = HybridEngine(model, num_blocks=6, block_size=2)  # 5 blocks: 10 tokens at most
    engine.add(HybridRequest(0, list(range(9)), 4))
    with pytest.raises(ValueError, match="more blocks than the pool holds"):
        for _ in range(20):
            engine.step()


def test_groups_of_different_sizes_are_refused():
    with pytest.raises(ValueError, match="as many layers"):
        HybridEngine(TinyModel(TinyConfig(num_layers=3, windows=(3, None, None))), 8, 4)


def _in_triton(query, k_cache, v_cache, block_tables, seq_lens, window, scale):
    if window is None:
        return paged_attention(query, k_cache, v_cache, block_tables, seq_lens, scale)
    return sliding_window_attention(query, k_cache, v_cache, block_tables, seq_lens, window,
                                    scale)


def test_the_triton_kernels_serve_the_same_tokens():
    model = TinyModel(TinyConfig(num_layers=2, windows=(3, None)), seed=7)
    engine = HybridEngine(model, num_blocks=10, block_size=4, attend=_in_triton)
    served = serve(engine, _requests(seed=2, count=3))
    _assert_same(model, served)
