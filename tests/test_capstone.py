"""Chapter 8 beyond its checks: sixteen concurrent requests really are preempted and still
equal their contiguous runs; the reservation baseline is counted right."""

from __future__ import annotations

from course.capstone import equality_report, reservation_trace, workload
from course.paged_engine import PagedEngine, make_request, serve
from course.tiny_model import TinyModel


def test_sixteen_concurrent_requests_are_preempted_and_equal_their_contiguous_runs():
    model = TinyModel()
    engine = PagedEngine(model, 30, 4, "recompute")
    finished = serve(engine, workload(16, seed=6, spread=0))
    report = equality_report(model, finished)
    preemptions = sum(r.event.count("preempted") for r in engine.records)
    assert report["finished"] == report["identical"] == 16
    assert report["largest_logit_difference"] < 1e-4
    assert preemptions >= 5 and max(r.running for r in engine.records) >= 6
    assert engine.blocks.num_free_blocks() == 30 and not any(engine.blocks.ref_counts)


def test_swap_returns_every_cpu_block_and_branches_share_then_copy():
    model = TinyModel()
    engine = PagedEngine(model, 40, 4, "swap", cpu_blocks=160)
    finished = serve(engine, workload(16, seed=5, branches_every=4))
    events = " ".join(r.event for r in engine.records)
    assert "preempted" in events and "swapped in" in events and "copy-on-write" in events
    report = equality_report(model, finished)
    assert report["identical"] == report["finished"] == 24 and report["branches"] == 8
    assert engine.scheduler.cpu.num_free_blocks() == 160


def test_reservation_holds_max_len_per_request_until_its_last_token():
    # capacity for two reservations of 10: requests 0 and 1 start at step 0; request 2 waits
    # for request 0 (3 output tokens, emitted at steps 0, 1, 2), whose slots free at step 2
    requests = [make_request(0, [1, 2], 3), make_request(1, [1, 2, 3], 5),
                make_request(2, [4], 2)]
    resident, stored = reservation_trace(requests, capacity_tokens=20, max_len=10)
    assert resident == [2, 2, 2, 1, 0]
    # step 0: prompts 2 + 3; step 1: one more each; step 2: request 0 left, request 2 in
    assert stored == [5, 7, 5 + 1, 6, 0]
