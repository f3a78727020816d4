"""The chapter charts draw what the course computes."""

from __future__ import annotations

import pytest

from course.charts import kv_memory_chart
from course.kv_sizing import kv_bytes_per_sequence
from course.models import GPUS, MODELS


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
