"""The serving-memory simulation: every slot accounted for, every request served."""

from __future__ import annotations

import statistics

import pytest

from course.experiments.memory_sim import CATEGORIES, MAX, ORACLE, POW2, _Holes, paged, simulate
from course.experiments.workloads import ALPACA, MIXES, SHAREGPT, Request, sample_requests

POOL = 6000
STRATEGIES = [MAX, POW2, ORACLE, paged(1), paged(7), paged(16), paged(256)]


@pytest.fixture(scope="module", params=list(MIXES.values()), ids=lambda m: m.name)
def requests(request):
    return sample_requests(request.param, 300, seed=3)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
def test_every_slot_is_in_exactly_one_category_at_every_step(requests, strategy):
    result = simulate(requests, strategy, POOL)
    for step in result.steps:
        assert step.total == POOL
        assert all(getattr(step, c) >= 0 for c in CATEGORIES)
    assert result.completed == len(requests)
    assert result.steps[-1].resident == 0 and result.steps[-1].waiting == 0


@pytest.mark.parametrize("block_size", [1, 3, 16, 100])
def test_paging_wastes_at_most_block_size_minus_one_slots_per_request(requests, block_size):
    result = simulate(requests, paged(block_size), POOL)
    for step in result.steps:
        assert step.internal <= (block_size - 1) * step.resident
        assert step.reserved == 0
        assert step.external == POOL % block_size
        assert step.table_entries * block_size == step.token_states + step.internal


def test_contiguous_accounting_follows_the_reservation_rule():
    requests = [Request(3, 2), Request(10, 20), Request(1, 1)]
    max_steps = simulate(requests, MAX, 64, max_model_len=32).steps
    # Max: 64 slots hold two 32-slot reservations; the third request waits for one to finish
    assert (max_steps[0].resident, max_steps[0].waiting) == (2, 1)
    assert max_steps[0].token_states == 3 + 10
    assert max_steps[0].reserved == 2 + 20
    assert max_steps[0].internal == (32 - 5) + (32 - 30)
    assert max_steps[0].external == 0  # nothing free at all
    oracle = simulate(requests, ORACLE, 64, max_model_len=32).steps
    assert all(step.internal == 0 for step in oracle)
    pow2 = simulate(requests, POW2, 64, max_model_len=32).steps
    assert pow2[0].internal == (8 - 5) + (32 - 30) + (2 - 2)


def test_contiguous_free_space_that_the_next_request_cannot_use_is_external():
    # 10 slots: a 4-slot request, then a 5-slot one; 1 slot left, and the 6-slot request waits
    requests = [Request(4, 0), Request(5, 0), Request(6, 0)]
    step = simulate(requests, ORACLE, 10, max_model_len=8).steps[0]
    assert (step.resident, step.waiting, step.external, step.free) == (2, 1, 1, 0)


def test_freed_ranges_merge_so_a_large_request_fits_again():
    holes = _Holes([0], [12])
    a, b, c = holes.allocate(4), holes.allocate(4), holes.allocate(4)
    assert (a, b, c) == (0, 4, 8) and holes.allocate(1) is None
    holes.release(a, 4)
    holes.release(c, 4)
    assert holes.allocate(8) is None  # 8 slots free, but in two holes of 4
    holes.release(b, 4)
    assert holes.starts == [0] and holes.sizes == [12] and holes.allocate(12) == 0


def test_preempted_requests_are_recomputed_and_still_finish():
    requests = [Request(1, 30) for _ in range(6)]  # 31 tokens each, 48 slots: must preempt
    result = simulate(requests, paged(4), 48, max_model_len=64)
    assert result.preemptions > 0
    assert result.completed == len(requests)


def test_a_request_larger_than_the_pool_is_refused():
    with pytest.raises(ValueError, match="larger than the whole pool"):
        simulate([Request(10, 10)], MAX, 100, max_model_len=128)
    with pytest.raises(ValueError, match="does not fit"):
        simulate([Request(90, 10)], paged(16), 96, max_model_len=128)


@pytest.mark.parametrize("mix", [SHAREGPT, ALPACA], ids=lambda m: m.name)
def test_workload_means_match_the_paper(mix):
    requests = sample_requests(mix, 50_000, seed=11)
    assert statistics.mean(r.prompt_len for r in requests) == pytest.approx(mix.mean_input,
                                                                           rel=0.01)
    assert statistics.mean(r.output_len for r in requests) == pytest.approx(mix.mean_output,
                                                                           rel=0.01)
    assert max(r.final_len for r in requests) <= 2048 and min(r.prompt_len for r in requests) >= 1


def test_workloads_are_seeded():
    assert sample_requests(SHAREGPT, 50, seed=5) == sample_requests(SHAREGPT, 50, seed=5)
    assert sample_requests(SHAREGPT, 50, seed=5) != sample_requests(SHAREGPT, 50, seed=6)


def test_the_chapter_2_figure_shows_paging_far_above_contiguous_reservation():
    """The notebook's own set-up: OPT-13B on a 40 GB A100, 400 ShareGPT-like requests."""
    from course.experiments import kv_sizing
    from course.experiments.models import MODELS

    opt = MODELS["OPT-13B"]
    blocks = kv_sizing.num_gpu_blocks(40 * 10**9, 0.9, opt.weight_bytes(2), 2**30,
                                      kv_sizing.kv_bytes_per_sequence(opt, 16))
    requests = sample_requests(SHAREGPT, 400, seed=0)
    share = {s.name: simulate(requests, s, blocks * 16).shares()["token_states"]
             for s in [MAX, POW2, ORACLE, paged(16)]}
    assert share["Paged (B=16)"] > 0.9
    assert share["Max"] < share["Pow2"] < share["Oracle"] < 0.6
