"""Chapter 11's model-free runs of the engine with a CPU tier: with room for everything, each
turn of a conversation finds its whole computed history (on the GPU or in the tier); without a
tier, nothing is loaded or saved; and LRU and ARC differ where the tier is tight."""

from __future__ import annotations

import pytest

from course.experiments.prefix_sim import multi_turn
from course.experiments.tier_sim import serve_tiered


@pytest.mark.parametrize("gpu_blocks", [40, 400], ids=["tight-gpu", "roomy-gpu"])
@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_a_tier_with_room_for_everything_finds_each_turns_history(gpu_blocks, policy):
    requests, size = multi_turn(6, turns=3, mean_message=30, mean_output=40, seed=3), 16
    report = serve_tiered(requests, size, gpu_blocks, cpu_blocks=10_000, policy=policy,
                          block_bytes=1)
    expected = 0
    for request in requests:
        if request.after is not None:  # the history's last token was never fed back
            before = requests[request.after]
            computed = len(before.prompt) + len(before.output) - 1
            expected += min(computed // size, (len(request.prompt) - 1) // size) * size
    assert report.gpu_hits + report.tier_hits == expected
    assert report.prompt_tokens == sum(len(r.prompt) for r in requests)
    assert report.bytes_loaded >= report.tier_hits // size


def test_without_a_tier_nothing_moves_and_the_gpu_alone_hits():
    requests = multi_turn(6, turns=3, mean_message=30, mean_output=40, seed=3)
    report = serve_tiered(requests, 16, 40, cpu_blocks=0, block_bytes=1)
    assert report.tier_hits == report.bytes_loaded == report.bytes_saved == 0
    roomy = serve_tiered(requests, 16, 40, cpu_blocks=10_000, block_bytes=1)
    assert roomy.tier_hits > 0 and roomy.computed_tokens < report.computed_tokens


def test_lru_and_arc_differ_on_chapter_4s_multi_turn_workload_in_a_tight_tier():
    requests = multi_turn(15)
    lru = serve_tiered(requests, 16, 200, 400, "lru")
    arc = serve_tiered(requests, 16, 200, 400, "arc")
    assert lru.tier_hits != arc.tier_hits
