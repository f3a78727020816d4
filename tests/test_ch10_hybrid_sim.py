"""What a sliding window costs prefix caching (``course.experiments.hybrid_sim``), on chapter 4's
seeded workloads: with room to spare, the hybrid cache hits as the all-full one does while holding
fewer blocks; under pressure the window's blocks, freed first, are evicted first and chat's hits
shorten; a window longer than any request is full attention in every figure, in any pool; a KV cache
of chapter 10's functions written another way (``learners_kv_cache``) measures the same; a pool
smaller than one prompt is refused."""

from __future__ import annotations

import pytest
from alternatives import ch10 as alternative

from course.experiments.hybrid_sim import main, serve_hybrid
from course.experiments.prefix_sim import chat, few_shot, multi_turn
from course.v1.hybrid_coordinator import learners_kv_cache

WORKLOADS = {
    "chat": chat(24, system_prompt=120, mean_user=30, mean_output=30),
    "few-shot": few_shot(24, mean_example=30, mean_output=20),
    "multi-turn": multi_turn(6, turns=3, mean_message=30, mean_output=40),
}


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_with_room_to_spare_a_window_loses_no_hit_and_holds_fewer_blocks(workload):
    requests = WORKLOADS[workload]
    full = serve_hybrid(requests, [None, None], 16, 4000)
    hybrid = serve_hybrid(requests, [32, None], 16, 4000)
    assert full.preemptions == hybrid.preemptions == 0
    assert (hybrid.prompt_tokens, hybrid.hit_tokens) == (full.prompt_tokens, full.hit_tokens)
    assert hybrid.hit_tokens > 0
    assert hybrid.mean_blocks_held < full.mean_blocks_held


@pytest.mark.parametrize("workload", list(WORKLOADS))
@pytest.mark.parametrize("num_blocks", [60, 90, 400])
def test_a_window_longer_than_any_request_is_full_attention(workload, num_blocks):
    requests = WORKLOADS[workload]
    longest = max(len(r.prompt) + len(r.output) for r in requests)
    assert serve_hybrid(requests, [longest + 1, None], 16, num_blocks) == \
        serve_hybrid(requests, [None, None], 16, num_blocks)


def test_under_pressure_the_windows_evicted_blocks_shorten_chats_hits():
    requests = WORKLOADS["chat"]
    full = serve_hybrid(requests, [None, None], 16, 60)
    hybrid = serve_hybrid(requests, [32, None], 16, 60)
    assert full.prompt_tokens == hybrid.prompt_tokens
    assert 0 < hybrid.hit_tokens < full.hit_tokens


@pytest.mark.parametrize("workload", list(WORKLOADS))
@pytest.mark.parametrize("num_blocks", [60, 4000])
def test_a_kv_cache_of_the_functions_written_another_way_measures_the_same(workload,
                                                                        num_blocks):
    learners = learners_kv_cache(free_skipped_blocks=alternative.free_skipped_blocks,
                                 sliding_window_hit=alternative.sliding_window_hit,
                                 hybrid_hit=alternative.hybrid_hit)
    for windows in ([32, None], [None, 8], [5, 40]):
        assert serve_hybrid(WORKLOADS[workload], windows, 16, num_blocks, kv_cache=learners) \
            == serve_hybrid(WORKLOADS[workload], windows, 16, num_blocks)


def test_a_pool_smaller_than_one_prompt_is_refused():
    with pytest.raises(ValueError, match="more blocks than the pool holds"):
        serve_hybrid(WORKLOADS["chat"], [8, None], 16, 10)


def test_the_printed_table_is_what_serve_hybrid_measures(capsys):
    main(window=32, block_size=16, pools=(300,), count=8)
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [row.split()[:2] for row in rows] == [[n, "300"] for n in
                                                 ("chat", "few-shot", "multi-turn")]
    chat_full = serve_hybrid(chat(8), [None, None], 16, 300)
    chat_hybrid = serve_hybrid(chat(8), [32, None], 16, 300)
    assert rows[0].split()[2:] == [f"{chat_full.hit_rate:.1%}",
                                   f"{chat_full.mean_blocks_held:.0f}",
                                   f"{chat_hybrid.hit_rate:.1%}",
                                   f"{chat_hybrid.mean_blocks_held:.0f}"]
