"""Chapter 11's timed comparison of one engine, two engines and a prefill/decode pair on
chapter 9's mixed load: every prompt's KV crosses the link once, loads land when their bytes
have, and the pair's decode steps, free of prefill chunks, keep the time between tokens flat."""

from __future__ import annotations

import pytest

from course.experiments.disagg_sim import (
    TimedLoads,
    latency_chart,
    one_or_two_engines,
    prefill_decode_pair,
)
from course.experiments.serving_sim import opt13b_a100_40gb
from course.notebook.chunked_demo import latency_workload


def test_a_timed_load_lands_once_the_clock_reaches_its_bytes():
    now = [0.0]
    loads = TimedLoads(lambda: now[0], lambda job: job)
    loads.start(1, 0.5)
    loads.start(2, 0.2)
    now[0] = 0.3
    assert loads.advance() == [(2, 0.2)]
    now[0] = 0.5
    assert loads.advance() == [(1, 0.5)] and not loads.jobs


def test_each_prompt_crosses_the_link_once_all_but_its_last_token():
    cost, size = opt13b_a100_40gb(), 16
    prompts = [p for _, p, _ in latency_workload(seed=0)]
    blocks = sum(-(-(p - 1) // size) for p in prompts)
    report = prefill_decode_pair(512, block_size=size, cost=cost)
    assert report.bytes_per_request == pytest.approx(
        blocks * size * cost.kv_bytes_per_token / len(prompts))


def test_every_setup_serves_every_token_and_the_pair_keeps_decodes_apart():
    outputs = sum(o for _, _, o in latency_workload(seed=0))
    reports = [one_or_two_engines(1, 512), one_or_two_engines(2, 512),
               prefill_decode_pair(512)]
    for report in reports:
        assert report.output_tokens == outputs and report.ttft_p50 <= report.ttft_p99
    one, two, pair = reports
    assert pair.tbt_p99 < one.tbt_p99 / 2 and pair.tbt_p99 < two.tbt_p99 / 2


def test_the_latency_chart_draws_each_setups_four_figures_in_milliseconds():
    reports = [one_or_two_engines(1, 512), prefill_decode_pair(512)]
    figure = latency_chart(reports)
    assert [trace.name for trace in figure.data] == [
        "time to first token, P50", "time to first token, P99", "time between tokens, P50",
        "time between tokens, P99"]
    for trace, field in zip(figure.data, ("ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99"),
                            strict=True):
        assert list(trace.x) == [r.setup for r in reports]
        assert list(trace.y) == pytest.approx([1000 * getattr(r, field) for r in reports])
    # each pair on its own scale: the time between tokens is not a sliver under the first
    assert [trace.yaxis for trace in figure.data] == ["y", "y", "y2", "y2"]
