"""The chapter charts draw what the course computes."""

from __future__ import annotations

import pytest

from course.experiments.kv_sizing import kv_bytes_per_sequence
from course.experiments.models import GPUS, MODELS
from course.notebook.charts import kv_memory_chart


def test_kv_chart_plots_each_models_cache_and_each_gpus_memory():
    lengths = [1024, 4096]
    figure = kv_memory_chart(MODELS.values(), GPUS.values(), kv_bytes_per_sequence, lengths)
    by_name = {trace.name: trace for trace in figure.data if trace.showlegend is not False}
    assert len(by_name) == len(MODELS)
    llama = by_name["Llama-2-7B (MHA)"]
    assert list(llama.x) == lengths
    assert list(llama.y) == pytest.approx([1024 * 2**19 / 1e9, 4096 * 2**19 / 1e9])
    capacities = sorted(t.y[0] for t in figure.data if t.showlegend is False)
    assert capacities == sorted(g.memory_gb for g in GPUS.values())
    assert figure.layout.yaxis.type == "log" and figure.layout.xaxis.type == "log"


def test_memory_breakdown_stacks_every_category_and_marks_the_papers_share():
    from course.experiments.memory_sim import (
        CATEGORIES,
        MAX,
        PAPER_TOKEN_STATE_SHARE,
        paged,
        simulate,
    )
    from course.experiments.workloads import SHAREGPT, sample_requests
    from course.notebook.charts import memory_breakdown_chart

    requests = sample_requests(SHAREGPT, 40, seed=1)
    shares = {s.name: simulate(requests, s, 8192).shares() for s in [MAX, paged(16)]}
    figure = memory_breakdown_chart(shares, PAPER_TOKEN_STATE_SHARE, "test")
    bars = [t for t in figure.data if t.type == "bar"]
    assert len(bars) == len(CATEGORIES) and figure.layout.barmode == "stack"
    for strategy_index in range(len(shares)):  # each bar stacks to the whole pool
        assert sum(b.y[strategy_index] for b in bars) == pytest.approx(100)
    paper = next(t for t in figure.data if t.type == "scatter")
    assert list(paper.x) == ["Max", "Paged (B=16)"]
    assert list(paper.y) == pytest.approx([20.4, 96.3])


def test_sweep_chart_plots_share_and_table_length_for_each_mix():
    from course.experiments.memory_sim import SweepPoint
    from course.notebook.charts import block_size_sweep_chart

    points = [SweepPoint(1, 0.99, 100.0), SweepPoint(16, 0.9, 7.0)]
    figure = block_size_sweep_chart({"a": points, "b": points})
    assert len(figure.data) == 4
    assert list(figure.data[0].y) == pytest.approx([99, 90])
    assert list(figure.data[1].y) == [100.0, 7.0]
