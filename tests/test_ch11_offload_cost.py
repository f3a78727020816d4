"""Chapter 11's load-or-recompute model against figures worked out by hand."""

from __future__ import annotations

import pytest

from course.experiments.models import MODELS
from course.experiments.offload_cost import (
    PCIE5_BYTES_PER_S,
    TransferCost,
    speedup_chart,
    speedup_series,
)

OPT = TransferCost(MODELS["OPT-13B"], 25e9)


def test_a_load_moves_819200_bytes_a_token_and_pays_each_blocks_overhead():
    # OPT-13B: 2 (K and V) x 40 layers x 40 heads x 128 x 2 bytes = 819,200 bytes a token;
    # 1,000 tokens at 25 GB/s: 32.768 ms, and 63 blocks of 16 at 20 µs.
    assert OPT.load_seconds(1000, 16) == pytest.approx(0.032768 + 63 * 20e-6)


def test_recompute_counts_the_weights_and_the_causal_attention():
    # 2 x 13e9 x 1,000 + 4 x 40 x 40 x 128 x 1,000 x 1,001 / 2 FLOPs at 156 TFLOP/s.
    flops = 2 * 13e9 * 1000 + 4 * 40 * 40 * 128 * 1000 * 1001 / 2
    assert OPT.recompute_seconds(1000) == pytest.approx(flops / 156e12)


def test_loading_wins_by_more_as_the_prefix_grows_and_on_the_faster_link():
    lengths = [16, 128, 1024, 8192, 32768]
    series = speedup_series(lengths)
    for ratios in series.values():
        assert all(r > 1 for r in ratios) and ratios == sorted(ratios)
    assert series["Llama-3-8B, PCIe 5.0"][-1] > series["Llama-3-8B, 25 GB/s"][-1]
    assert series["Llama-3-8B, 25 GB/s"][0] > series["OPT-13B, 25 GB/s"][0]  # GQA moves less
    assert PCIE5_BYTES_PER_S == pytest.approx(63.0e9, rel=0.01)


def test_a_slow_enough_link_makes_recompute_the_better_choice():
    slow = TransferCost(MODELS["OPT-13B"], 1e9)
    assert not slow.should_load(16) and OPT.should_load(16)


@pytest.mark.parametrize("tokens", [0, -5])
def test_an_empty_prefix_is_refused(tokens):
    with pytest.raises(ValueError, match="at least one token"):
        OPT.load_seconds(tokens)
    with pytest.raises(ValueError, match="at least one token"):
        OPT.recompute_seconds(tokens)


def test_the_chart_draws_one_line_per_model_and_link():
    figure = speedup_chart([16, 1024])
    assert [trace.name for trace in figure.data] == list(speedup_series([16]))
    assert all(list(trace.x) == [16, 1024] for trace in figure.data)
