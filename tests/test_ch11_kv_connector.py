"""Chapter 11's connector engine: with a CPU tier behind it, or as a prefill/decode pair, every
request's tokens and logits are those of a contiguous run of the tiny model, whatever loads,
fails, waits or is preempted; and when the engines stop, every block is back in its pool and
every transfer is settled."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from course.notebook import connector_demo as demo
from course.notebook.connector_demo import conversations
from course.tiny_model import TinyModel, generate_contiguous
from course.v1.chunked_engine import serve_chunked
from course.v1.connector_engine import ConnectorEngine, ConnectorScheduler
from course.v1.disaggregated import (
    KVHandoff,
    PrefillConnectorScheduler,
    PrefillConnectorWorker,
    disaggregated_pair,
    serve_disaggregated,
)
from course.v1.offloading_connector import offloading_connector

MODEL = TinyModel()


def assert_contiguous(finished: list, count: int) -> None:
    assert len(finished) == count
    for request in finished:
        tokens, logits = generate_contiguous(MODEL, request.prompt, request.output_len)
        assert request.output == tokens, f"request {request.id}"
        for ours, theirs in zip(request.logits, logits, strict=True):
            torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def serve_offloading(*scenario, **options):
    return demo.serve_offloading(MODEL, *scenario, **options)


def assert_settled(engine: ConnectorEngine) -> None:
    """Every block back in the pool, no load in flight, nothing half stored."""
    assert not demo.unsettled(engine)


SCENARIOS = demo.OFFLOAD_SCENARIOS


@pytest.mark.parametrize("scenario", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_the_offloading_engine_generates_what_a_contiguous_run_does(scenario):
    engine, finished = serve_offloading(*scenario)
    assert_contiguous(finished, 12)
    assert_settled(engine)


def test_the_scenarios_reach_what_they_are_named_for():
    """Loads, failures and preemptions happen where the scenarios say (else the equality
    above would prove less than it claims)."""
    def reached(name):
        engine, _ = serve_offloading(*SCENARIOS[name])
        return (engine.worker.bytes_loaded, engine.scheduler.recomputed_tokens,
                sum(len(r.preempted) for r in engine.records),
                max(len(r.chunks) for r in engine.records))

    assert reached("loads of one step")[0] > 0
    assert reached("loads of four steps")[0] > 0
    assert reached("failed loads")[1] > 0
    loaded, recomputed, preempted, _ = reached("preemption and failures")
    assert loaded and recomputed and preempted
    assert reached("chunked prefill, budget 3")[3] >= 2


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.sampled_from([1, 2, 4]), st.integers(0, 12), st.integers(1, 24), st.integers(1, 48),
       st.integers(1, 4), st.sampled_from([0.0, 0.2, 0.6]), st.sampled_from(["lru", "arc"]),
       st.integers(0, 10_000))
def test_any_drawn_offloading_scenario_is_token_exact_and_settles(
        block_size, spare, budget, cpu_blocks, load_steps, fail, policy, seed):
    needed = max(-(-(len(r.prompt) + r.output_len) // block_size)
                 for r in conversations(8, seed))  # and the null block
    engine, finished = serve_offloading(needed + 1 + spare, block_size, budget, cpu_blocks,
                                        load_steps, fail, policy, seed, count=8)
    assert_contiguous(finished, 8)
    assert_settled(engine)


@pytest.mark.parametrize("load_steps", [1, 4])
def test_a_request_whose_kv_is_loading_waits_while_the_others_run(load_steps):
    """A load started at step s lands at the end of step s + load_steps - 1; its request is in
    no chunk until step s + load_steps (or the first step after it that admits: none does
    while it preempts), while other requests compute."""
    requests = conversations(12, 0)
    engine = ConnectorEngine(MODEL, 10, 4, 16, offloading_connector(64, 4, "lru", load_steps))
    pending, started, ran, overlapped = list(requests), {}, {}, 0
    for step in range(500):
        while pending and pending[0].arrival <= step:
            engine.scheduler.add(pending.pop(0))
        plan = engine.step()
        computing = {chunk.request.id for chunk in plan.chunks}
        for request_id in engine.scheduler.loading:
            started.setdefault(request_id, step)
            assert request_id not in computing
        for request_id in computing:
            ran.setdefault(request_id, step)
        overlapped += bool(engine.scheduler.loading and computing)
        for request in [r for r in engine.scheduler.running if r.done]:
            engine.scheduler.finish(request)
        if not pending and not engine.scheduler.busy():
            break
    assert started and overlapped
    for request_id, start in started.items():  # later only while preemptions bar admission
        assert ran[request_id] >= start + load_steps
        assert all(engine.records[step].preempted
                   for step in range(start + load_steps, ran[request_id]))


def test_a_failed_block_is_computed_again_from_its_first_token():
    requests = conversations(12, 0)
    every_key = demo.failing_keys(requests, 4, 1.0, 0)
    # 10 blocks for requests and the null block
    engine = ConnectorEngine(MODEL, 11, 4, 16, offloading_connector(64, 4, "lru", 2,
                                                                    every_key))
    finished = serve_chunked(engine, requests)
    assert_contiguous(finished, 12)
    assert engine.worker.bytes_loaded == 0
    # With every load failing, each request computes what the GPU did not hit: as without a
    # tier at all.
    plain = ConnectorEngine(MODEL, 11, 4, 16, offloading_connector(1, 4, "lru", 2, set()))
    plain.connector.tier.lookup = lambda keys: 0
    serve_chunked(plain, conversations(12, 0))
    computed = lambda e: sum(c[2] for r in e.records for c in r.chunks)  # noqa: E731
    assert computed(engine) == computed(plain)
    assert engine.scheduler.recomputed_tokens > 0


class EarlyFree(ConnectorScheduler):
    """Frees a finished request's blocks at once, whatever its connector says."""

    def finish(self, request):
        super().finish(request)
        if self.sending.pop(request.id, None):
            self.kv_cache.free(request)


class IgnoresFailures(ConnectorScheduler):
    def update_from_output(self, output):
        output.invalid_block_ids = set()
        super().update_from_output(output)


def test_the_equality_catches_an_engine_that_trusts_a_failed_load():
    requests = conversations(12, 0)
    engine = ConnectorEngine(MODEL, 10, 4, 16, offloading_connector(
        64, 4, "lru", 2, demo.failing_keys(requests, 4, 0.4, 0)))
    engine.scheduler.__class__ = IgnoresFailures
    finished = serve_chunked(engine, requests)
    with pytest.raises(AssertionError):
        assert_contiguous(finished, 12)


PAIRS = demo.PAIR_SCENARIOS


def serve_pair(prefill_blocks, decode_blocks, block_size, budget, load_steps, lease_steps,
               seed=0, count=12):
    pair = disaggregated_pair(MODEL, prefill_blocks, decode_blocks, block_size, budget,
                              load_steps, lease_steps)
    return pair, serve_disaggregated(pair, conversations(count, seed))


@pytest.mark.parametrize("config", PAIRS.values(), ids=PAIRS.keys())
def test_a_prefill_and_decode_pair_generates_what_one_engine_does(config):
    pair, finished = serve_pair(*config)
    assert_contiguous(finished, 12)
    for engine in (pair.prefill, pair.decode):
        assert engine.kv_cache.num_held() == 0
        assert not engine.scheduler.sending and not engine.scheduler.loading
    assert not pair.prefill.worker.leases and not pair.handoff.taken
    assert len(pair.handoff.released) == 12


def test_the_pair_hands_kv_over_unless_the_lease_runs_out():
    pair, _ = serve_pair(*PAIRS["loads of one step"])
    assert pair.decode.worker.bytes_loaded and not pair.decode.scheduler.recomputed_tokens
    pair, _ = serve_pair(*PAIRS["lease shorter than the load"])
    assert not pair.decode.worker.bytes_loaded and pair.decode.scheduler.recomputed_tokens


def test_a_decode_engine_that_never_reads_leaves_nothing_held():
    """The prefill engine alone: its requests' blocks are held for their lease, then freed."""
    handoff = KVHandoff()
    engine = ConnectorEngine(MODEL, 16, 4, 16, (PrefillConnectorScheduler(4),
                                                PrefillConnectorWorker(handoff, 5)))
    requests = conversations(6, 1)
    for request in requests:
        request.output_len = 1
    finished = serve_chunked(engine, requests)
    assert len(finished) == 6 and engine.scheduler.sending == {}
    assert engine.kv_cache.num_held() == 0 and len(handoff.released) == 6


def test_the_pair_is_caught_freeing_blocks_before_the_decode_engine_reads_them():
    pair = disaggregated_pair(MODEL, 12, 20, 2, 8, load_steps=4, lease_steps=64)
    pair.prefill.scheduler.__class__ = EarlyFree
    finished = serve_disaggregated(pair, conversations(12, 0))
    with pytest.raises(AssertionError):
        assert_contiguous(finished, 12)
