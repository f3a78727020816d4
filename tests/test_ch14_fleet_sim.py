"""Chapter 14's in-process fleet: engines (chapter 9's scheduler over the fleet's KV cache)
publish msgspec-encoded KV events to a router's index, and the router places each request.
Properties, not figures: KV-aware routing finds at least round robin's hits, a weight of 0 is
least loaded, the index ends as the engines' caches are, a salt per tenant shares no block and
closes the timing side channel, and the same seed gives the same rows."""

from __future__ import annotations

import math
from itertools import combinations

import pytest

from course.experiments.fleet_sim import (
    POLICY_WORKLOADS,
    WORKLOADS,
    FleetConfig,
    main,
    policy_chart,
    policy_sweep,
    report_line,
    run_fleet,
    side_channel,
    side_channel_chart,
    side_channel_line,
    weight_chart,
    weight_sweep,
)
from course.v1.kv_router import POLICIES

SMALL = dict(requests_per_engine=8, rate_per_engine=4.0)


@pytest.fixture(scope="module")
def few_shot_sweep():
    """Round robin and KV-aware routing on few-shot at 2, 4 and 8 engines, at main's load."""
    return policy_sweep("few-shot", policies=("round_robin", "kv"))


@pytest.mark.parametrize("engines", [2, 4, 8], ids=lambda n: f"{n}-engines")
def test_kv_routing_hits_at_least_as_often_as_round_robin_on_few_shot(few_shot_sweep, engines):
    by = {r.policy: r for r in few_shot_sweep if r.engines == engines}
    assert by["kv"].hit_rate >= by["round_robin"].hit_rate


def test_kv_routing_hits_strictly_more_somewhere(few_shot_sweep):
    pairs = {(r.policy, r.engines): r.hit_rate for r in few_shot_sweep}
    assert any(pairs["kv", n] > pairs["round_robin", n] for n in (2, 4, 8))


def test_a_weight_of_zero_places_every_request_as_least_loaded_does():
    zero = run_fleet("multi-tenant", FleetConfig(policy="kv", overlap_score_weight=0), **SMALL)
    least = run_fleet("multi-tenant", FleetConfig(policy="least_loaded"), **SMALL)
    assert zero.assignments == least.assignments
    assert zero.report.hit_tokens == least.report.hit_tokens
    assert zero.report.tokens_per_engine == least.report.tokens_per_engine


@pytest.mark.parametrize("workload", list(WORKLOADS))
@pytest.mark.parametrize("policy", POLICIES)
def test_hit_rates_are_fractions_and_every_request_gets_its_first_token(workload, policy):
    run = run_fleet(workload, FleetConfig(num_engines=2, policy=policy), **SMALL)
    report = run.report
    assert 0.0 <= report.hit_rate <= 1.0
    assert sum(report.requests_per_engine) == report.requests == len(run.ttfts)
    assert all(t > 0 and not math.isnan(t) for t in run.ttfts)
    assert report.ttft_mean <= max(run.ttfts) and report.ttft_p90 <= max(run.ttfts)
    assert report.imbalance >= 1.0
    assert all(hit % 16 == 0 and hit >= 0 for hit in run.hits)


def test_the_index_ends_holding_exactly_what_each_engine_caches():
    run = run_fleet("few-shot", FleetConfig(num_engines=4, event_delay_s=0.0), **SMALL)
    for engine, cache in enumerate(run.caches):
        assert run.router.index.blocks[engine] == cache.cached_hashes()
    union = set().union(*(cache.cached_hashes() for cache in run.caches))
    assert set(run.router.index.engines) == union
    # the indexer's measurement replays the same batches: the same events, counted alike
    assert run.report.events_applied == run.router.index.events_applied > 0


def test_a_delayed_index_routes_on_a_stale_view():
    fresh = run_fleet("few-shot", FleetConfig(num_engines=4), **SMALL)
    stale = run_fleet("few-shot", FleetConfig(num_engines=4, event_delay_s=5.0), **SMALL)
    assert fresh.assignments != stale.assignments
    # every batch arrives in the end: the stale index catches up
    for engine, cache in enumerate(stale.caches):
        assert stale.router.index.blocks[engine] == cache.cached_hashes()


def _hashes_by_tenant(run) -> dict[str, set[bytes]]:
    tenants: dict[str, set[bytes]] = {}
    for request, hashes in zip(run.requests, run.hashes, strict=True):
        tenants.setdefault(request.tenant, set()).update(hashes)
    return tenants


def test_with_a_salt_per_tenant_no_block_hash_is_shared_between_tenants():
    salted = _hashes_by_tenant(run_fleet("multi-tenant", FleetConfig(salt=True), **SMALL))
    plain = _hashes_by_tenant(run_fleet("multi-tenant", FleetConfig(salt=False), **SMALL))
    assert len(salted) > 2
    assert all(not (salted[a] & salted[b]) for a, b in combinations(salted, 2))
    # without salts the tenants that share the public prompt share its blocks
    assert any(plain[a] & plain[b] for a, b in combinations(plain, 2))


def test_the_salt_closes_the_timing_side_channel():
    open_channel, closed = side_channel(False, trials=8), side_channel(True, trials=8)
    assert closed.sent == closed.not_sent
    assert closed.gap == 0 and closed.attacker_accuracy == 0.5
    assert max(open_channel.sent) < min(open_channel.not_sent)
    assert open_channel.attacker_accuracy == 1.0


def test_the_same_seed_gives_the_same_rows_and_another_seed_others():
    def rows(seed):
        return [r.simulated() for r in policy_sweep("multi-turn", engine_counts=(2, 4),
                                                      seed=seed, **SMALL)]

    assert rows(0) == rows(0)
    assert rows(0) != rows(1)


def test_main_prints_the_figures_the_functions_return(capsys):
    small = dict(engine_counts=(2,), weights=(0, 8), delays_s=(0.0, 2.0), trials=4, **SMALL)
    figures = main(**small)
    out = capsys.readouterr().out
    printed = [*(r for w in POLICY_WORKLOADS for r in figures.policies[w]), *figures.weights,
               *figures.delays, *figures.salted]
    for report in printed:
        assert report_line(report) in out
    for result in figures.side_channel:
        assert side_channel_line(result) in out
    # and what main returned is what the functions compute
    for workload in POLICY_WORKLOADS:
        assert [r.simulated() for r in figures.policies[workload]] == [
            r.simulated() for r in policy_sweep(workload, engine_counts=(2,), **SMALL)]
    assert [r.simulated() for r in figures.weights] == [
        r.simulated() for r in weight_sweep((0, 8), **SMALL)]
    assert [r.simulated() for r in figures.salted] == [
        run_fleet("multi-tenant", FleetConfig(salt=salt), **SMALL).report.simulated()
        for salt in (False, True)]
    assert figures.side_channel == [side_channel(False, 4), side_channel(True, 4)]


def test_the_charts_draw_the_rows_they_are_given():
    rows = policy_sweep("few-shot", engine_counts=(2, 4), **SMALL)
    figure = policy_chart(rows)
    kv_hits = [t for t in figure.data if t.name == "KV-aware" and t.xaxis == "x"][0]
    assert list(kv_hits.x) == [2, 4]
    assert list(kv_hits.y) == pytest.approx([100 * r.hit_rate for r in rows
                                             if r.policy == "kv"])
    weights = weight_sweep((0, 4), **SMALL)
    trade = weight_chart(weights).data[0]
    assert list(trade.x) == pytest.approx([r.imbalance for r in weights])
    assert list(trade.y) == pytest.approx([100 * r.hit_rate for r in weights])
    results = [side_channel(False, 3), side_channel(True, 3)]
    boxes = side_channel_chart(results).data
    assert len(boxes) == 4
    assert list(boxes[0].y) == pytest.approx([1000 * t for t in results[0].sent])
    assert list(boxes[3].y) == pytest.approx([1000 * t for t in results[1].not_sent])
