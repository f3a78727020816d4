"""The hybrid block tables' animation: its frames are what the KV cache it is given did
(``course.v1.hybrid_coordinator.HybridKVCacheCoordinator``, or one with a learner's functions:
null blocks where a sliding window left tokens behind, every block accounted for), and its
HTML carries the counts the browser tests read."""

from __future__ import annotations

import re

import pytest

from course.notebook.hybrid_animation import frame_html, window_animation, window_frames
from course.v1.hybrid_coordinator import HybridKVCacheCoordinator, learners_kv_cache
from course.v1.kv_coordinator import NULL_BLOCK

WINDOWS = (None, 6)
BLOCK_SIZE = 4
NUM_BLOCKS = 12


def frames_of(kv: HybridKVCacheCoordinator, prompt_len: int = 9, output_len: int = 8):
    return window_frames(kv, prompt_len, output_len)


def holds_nothing(kv: HybridKVCacheCoordinator) -> bool:
    return all(m.tables == {} for m in kv.managers)


def nulls(table) -> int:
    return sum(block == NULL_BLOCK for block in table)


def held(frame) -> int:
    return sum(block != NULL_BLOCK for table in frame.tables for block in table)


def test_sliding_tables_null_the_blocks_the_window_left_behind():
    frames = frames_of(HybridKVCacheCoordinator(NUM_BLOCKS, BLOCK_SIZE, WINDOWS))
    assert len(frames) == 1 + 8 + 1  # the prompt, 8 decodes, the request freed
    assert all(frame.allocated for frame in frames)
    window = WINDOWS[1]
    for frame in frames[:-1]:
        full, sliding = frame.tables
        tokens = frame.num_computed + frame.num_new
        assert len(full) == len(sliding) == -(-tokens // BLOCK_SIZE)
        assert nulls(full) == 0
        # freed before the step: the blocks all of whose tokens the next token no longer sees
        skipped = max(0, frame.num_computed - window + 1)
        assert sliding[:skipped // BLOCK_SIZE] == (NULL_BLOCK,) * (skipped // BLOCK_SIZE)
        assert nulls(sliding) == skipped // BLOCK_SIZE
    assert [f.freed for f in frames[:-1]] == [
        nulls(b.tables[1]) - nulls(a.tables[1])
        for a, b in zip([frames[0]] + frames[:-2], frames[:-1], strict=True)]
    assert sum(f.freed for f in frames) == nulls(frames[-2].tables[1]) > 0
    assert frames[-1].tables == ((), ()) and frames[-1].num_new == 0


def test_every_block_is_free_or_held_and_all_come_back():
    frames = frames_of(HybridKVCacheCoordinator(NUM_BLOCKS, BLOCK_SIZE, WINDOWS))
    for frame in frames:
        assert frame.free + held(frame) == NUM_BLOCKS - 1  # block 0 is never handed out
    assert frames[-1].free == NUM_BLOCKS - 1


def test_frames_are_copies_of_the_managers_tables():
    kv = HybridKVCacheCoordinator(NUM_BLOCKS, BLOCK_SIZE, WINDOWS)
    frames = window_frames(kv, 9, 2)
    # the sliding manager nulls its first slot in place at step 1; step 0 kept its own
    assert frames[0].tables[1][0] != NULL_BLOCK == frames[1].tables[1][0]
    assert len(frames[0].tables[0]) == 3 and holds_nothing(kv)  # freed at the end


def test_a_pool_too_small_ends_with_the_refused_step_taking_nothing():
    # 7 usable blocks: the prompt takes 6, the 13th and 17th tokens need one more in each
    # group, and by the 17th the window has freed only 2 of the sliding group's blocks
    frames = frames_of(HybridKVCacheCoordinator(8, BLOCK_SIZE, WINDOWS))
    *done, refused = frames
    assert not refused.allocated and all(frame.allocated for frame in done)
    assert refused.num_computed + refused.num_new == 17
    before = done[-1]
    assert [len(t) for t in refused.tables] == [len(t) for t in before.tables]
    assert held(refused) <= held(before) and refused.free >= before.free
    assert refused.free + held(refused) == 8 - 1


def test_a_new_request_refused_has_no_tables():
    frames = window_frames(HybridKVCacheCoordinator(6, BLOCK_SIZE, WINDOWS), 9, 3)
    assert len(frames) == 1 and not frames[0].allocated
    assert frames[0].tables == ((), ()) and frames[0].free == 5


def test_the_html_carries_the_frames_counts():
    frames = frames_of(HybridKVCacheCoordinator(NUM_BLOCKS, BLOCK_SIZE, WINDOWS))
    step = 6
    frame, html = frames[step], frame_html(frames, step, WINDOWS, BLOCK_SIZE)

    def attribute(name: str) -> int:
        return int(re.search(rf'class="kv-window-animation"[^>]* data-{name}="(\d+)"',
                             html).group(1))

    assert attribute("step") == step and attribute("steps") == len(frames)
    assert attribute("tokens") == frame.num_computed + frame.num_new
    assert attribute("free") == frame.free
    assert attribute("null-blocks") == nulls(frame.tables[1]) > 0
    assert attribute("held") == held(frame)
    slots = re.findall(r'<div class="slot( null)?" data-group="(\d)" data-logical="(\d+)" '
                       r'data-block="(\d+)">([^<]*)</div>', html)
    assert len(slots) == sum(len(t) for t in frame.tables)
    for null, group, logical, block, text in slots:
        assert int(block) == frame.tables[int(group)][int(logical)]
        assert (null == " null") == (int(block) == NULL_BLOCK)
        assert text == ("null" if null else block)
    assert "full attention" in html and "sliding window of 6" in html
    assert f"step {step} / {len(frames) - 1}" in html
    assert 'data-held="0"' in frame_html(frames, len(frames) - 1, WINDOWS, BLOCK_SIZE)


def test_the_animation_shows_the_kv_cache_it_is_given():
    def never_frees(table, num_computed, window, block_size):
        """free_skipped_blocks left undone: a sliding window keeps every block."""
        return []

    never_frees_skipped_blocks = learners_kv_cache(free_skipped_blocks=never_frees)
    right = frames_of(HybridKVCacheCoordinator(NUM_BLOCKS, BLOCK_SIZE, WINDOWS))
    wrong = frames_of(never_frees_skipped_blocks(NUM_BLOCKS, BLOCK_SIZE, WINDOWS))
    assert all(nulls(t) == 0 for frame in wrong for t in frame.tables)
    assert all(frame.freed == 0 for frame in wrong)
    assert nulls(right[-2].tables[1]) == 2
    assert wrong[-2].free == right[-2].free - 2  # the 2 blocks the window left behind
    last = len(wrong) - 2
    assert 'data-null-blocks="0"' in frame_html(wrong, last, WINDOWS, BLOCK_SIZE)
    assert 'data-null-blocks="2"' in frame_html(right, last, WINDOWS, BLOCK_SIZE)


def test_the_widget_plays_the_frames():
    frames = frames_of(HybridKVCacheCoordinator(NUM_BLOCKS, BLOCK_SIZE, WINDOWS))
    view = window_animation(frames, WINDOWS, BLOCK_SIZE).children[1]
    assert 'data-step="0"' in view.value
    assert "kv-window-animation-view" in view._dom_classes


@pytest.mark.parametrize(("prompt_len", "output_len"), [(0, 3), (-1, 3), (4, -1)])
def test_bad_inputs_are_refused(prompt_len, output_len):
    kv = HybridKVCacheCoordinator(NUM_BLOCKS, BLOCK_SIZE, WINDOWS)
    with pytest.raises(ValueError, match="prompt of at least one token"):
        window_frames(kv, prompt_len, output_len)
    assert kv.num_free() == NUM_BLOCKS - 1 and holds_nothing(kv)
