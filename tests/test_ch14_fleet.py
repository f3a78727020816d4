"""Chapter 14's fleet beyond the checks: engines as processes (``course.v1.fleet``) serve every
request token for token as one engine does, the router's index stays what the engines hold
(through lost batches, a killed engine, a restarted one and a restarted router), and routing
by the index finds more of the fleet's cache than round robin, unless the seeds differ."""

from __future__ import annotations

import pytest

from course.tiny_model import TinyConfig, TinyModel, generate_contiguous
from course.v1.fleet import Fleet, Request, shared_prefix_waves
from course.v1.kv_events import BlockRemoved

BLOCK_SIZE = 8
# a small pool: blocks are evicted (and requests preempted), so the events remove blocks too
SIZES = dict(block_size=BLOCK_SIZE, num_blocks=16, max_num_batched_tokens=32)
MODEL = TinyModel(TinyConfig(), seed=0)


def make_waves(seed: int = 14, first_id: int = 0) -> list[list[Request]]:
    return shared_prefix_waves(BLOCK_SIZE, seed=seed, first_id=first_id)


WAVES = make_waves()
_EXPECTED: dict[tuple[tuple[int, ...], int], list[int]] = {}


def expected(request: Request) -> list[int]:
    """One engine's greedy output for ``request`` (the salt changes hashes, not tokens)."""
    key = (tuple(request.prompt), request.output_len)
    if key not in _EXPECTED:
        _EXPECTED[key] = generate_contiguous(MODEL, request.prompt, request.output_len)[0]
    return _EXPECTED[key]


def assert_exact(fleet: Fleet, requests: list[Request]) -> None:
    for request in requests:
        assert fleet.outputs[request.id] == expected(request), f"request {request.id}"


def assert_index_is_the_engines_caches(fleet: Fleet) -> None:
    """Each live engine's blocks in the index are exactly what it reports holding, up to the
    same batch; the index's hashes are the union of theirs (a dead engine holds none)."""
    index, union = fleet.router.index, set()
    for engine in fleet.live_engines():
        state = fleet.query_state(engine)
        assert index.last_seq[engine] == state.seq, f"engine {engine}"
        assert index.blocks[engine] == set(state.hashes), f"engine {engine}"
        union |= set(state.hashes)
    assert set(index.engines) == union


def blocks_removed(fleet: Fleet, engine: int) -> int:
    """The blocks ``engine``'s events removed, from its replay buffer (every batch kept)."""
    return sum(len(event.block_hashes) for _, batch in fleet.handles[engine].subscriber.replay(0)
               for event in batch.events if isinstance(event, BlockRemoved))


def serve_checked(fleet: Fleet, waves: list[list[Request]]) -> None:
    for wave in waves:
        fleet.serve_wave(wave)
        assert_exact(fleet, wave)
        assert_index_is_the_engines_caches(fleet)


@pytest.mark.parametrize("num_engines, policy", [
    pytest.param(n, p, id=f"{n}-engines-{p}")
    for n in (2, 3) for p in ("round_robin", "least_loaded", "kv")])
def test_the_fleet_serves_every_request_token_exact_and_its_index_is_the_engines_caches(
        num_engines, policy):
    with Fleet(num_engines, policy, **SIZES) as fleet:
        serve_checked(fleet, WAVES)
        assert set(fleet.served_by.values()) == set(range(num_engines))
        assert sum(blocks_removed(fleet, e) for e in range(num_engines)) > 0


def test_kv_routing_finds_more_of_the_fleet_s_cache_than_round_robin():
    hits = {}
    for policy in ("round_robin", "kv"):
        with Fleet(3, policy, **SIZES) as fleet:
            stats = fleet.serve(WAVES)
            hits[policy] = sum(s.hit_tokens for s in stats)
            assert_exact(fleet, [r for wave in WAVES for r in wave])
    assert hits["kv"] > hits["round_robin"], hits


def test_engines_seeded_apart_from_the_router_get_no_routed_hits_and_stay_exact():
    with Fleet(2, "kv", **SIZES) as fleet:
        assert sum(s.routed_hit_tokens for s in fleet.serve(WAVES)) > 0
    with Fleet(2, "kv", hash_seeds=["seed-of-0", "seed-of-1"], **SIZES) as fleet:
        serve_checked(fleet, WAVES)
        assert [s.routed_hit_tokens for s in fleet.waves] == [0, 0, 0]


def test_lost_batches_are_found_as_gaps_and_replayed():
    # engine 0 loses three batches, found when a later one arrives; engine 1 loses every
    # batch after its first, found only when a wave ends short of the batch it reported
    with Fleet(2, "kv", lose_batches={0: {1, 2, 4}, 1: set(range(1, 1000))}, **SIZES) as fleet:
        serve_checked(fleet, WAVES)
        assert fleet.gaps[0] >= 1 and fleet.late[1] == len(WAVES), (fleet.gaps, fleet.late)


def hanging_wave() -> list[Request]:
    """Six requests; under round robin over three engines, engine 1 gets the second (2 tokens
    to generate) and the fifth (8 tokens): with ``hang_after_finished={1: 1}`` it finishes
    the first and hangs with the other half-generated, request 104 in flight."""
    return [Request(100 + i, r.prompt, 2 if i < 3 else 8, r.cache_salt)
            for i, r in enumerate(WAVES[0])]


def test_a_killed_engine_s_requests_finish_elsewhere_and_a_restarted_one_starts_empty():
    wave = hanging_wave()
    with Fleet(3, "round_robin", hang_after_finished={1: 1}, **SIZES) as fleet:
        fleet.submit(wave)
        fleet.wait(until=lambda: 1 in fleet.served_by.values())
        in_flight = list(fleet.handles[1].in_flight)
        assert in_flight == [104]
        fleet.kill(1)
        fleet.wait()
        assert_exact(fleet, wave)
        assert fleet.served_by[104] != 1 and fleet.routes[-1] == (104, fleet.served_by[104])
        assert fleet.router.index.blocks[1] == set()
        assert_index_is_the_engines_caches(fleet)
        snapshot = fleet.snapshot()  # engine 1 dead, in its first life

        routed = len(fleet.routes)
        serve_checked(fleet, WAVES[1:2])
        assert all(engine != 1 for _, engine in fleet.routes[routed:])

        fleet.restart(1)
        assert fleet.router.index.blocks[1] == set() and fleet.router.index.last_seq[1] == 0
        assert fleet.query_state(1).hashes == []
        routed = len(fleet.routes)
        serve_checked(fleet, WAVES[2:])
        assert 1 in {engine for _, engine in fleet.routes[routed:]}
        fleet.restart_router(snapshot)  # engine 1's second life: replayed from its batch 0
        assert_index_is_the_engines_caches(fleet)


def test_an_engine_silent_past_its_timeout_is_declared_hung_and_its_requests_finish_elsewhere():
    # 3 s of silence with a request in flight: a healthy engine here is silent for at most
    # tens of milliseconds between its batches and results
    wave = hanging_wave()
    with Fleet(3, "round_robin", hang_after_finished={1: 1}, answer_timeout_s=3,
               **SIZES) as fleet:
        fleet.serve_wave(wave)
        assert_exact(fleet, wave)
        assert fleet.served_by[101] == 1 and fleet.served_by[104] != 1
        assert not fleet.handles[1].alive and fleet.router.index.blocks[1] == set()
        assert_index_is_the_engines_caches(fleet)


def test_a_restarted_router_replays_what_it_missed():
    with Fleet(2, "kv", **SIZES) as fleet:
        serve_checked(fleet, WAVES[:1])
        snapshot = fleet.snapshot()
        serve_checked(fleet, WAVES[1:])
        fleet.restart_router(snapshot)
        assert all(fleet.router.index.last_seq[e] > snapshot.index[e][0] for e in range(2))
        assert_index_is_the_engines_caches(fleet)
        serve_checked(fleet, make_waves(seed=15, first_id=1000)[:1])


def test_a_router_restarted_past_the_replay_buffer_claims_no_block_an_engine_lacks():
    # a buffer of two batches: a gap older than that (here, the batches since the snapshot;
    # at a start, those a subscriber still connecting missed) cannot be replayed, and the
    # index forgets the engine's blocks rather than keep ones it may have evicted
    def assert_index_within_the_engines_caches() -> dict[int, set[bytes]]:
        held = {e: set(fleet.query_state(e).hashes) for e in range(2)}
        assert all(fleet.router.index.blocks[e] <= held[e] for e in range(2))
        return held

    later = make_waves(seed=15, first_id=1000)[0]
    with Fleet(2, "kv", buffer_steps=2, **SIZES) as fleet:
        fleet.serve_wave(WAVES[0])
        assert_index_within_the_engines_caches()
        snapshot = fleet.snapshot()
        for wave in WAVES[1:]:
            fleet.serve_wave(wave)
            assert_index_within_the_engines_caches()
        fleet.restart_router(snapshot)
        held = assert_index_within_the_engines_caches()
        assert any(fleet.router.index.blocks[e] < held[e] for e in range(2))  # forgotten
        fleet.serve_wave(later)
        assert_index_within_the_engines_caches()
        assert_exact(fleet, [r for wave in WAVES for r in wave] + later)
