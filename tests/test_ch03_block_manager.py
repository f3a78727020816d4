"""Chapter 3's scenarios, animation, sharing figures and benchmark: on the course's own
BlockManager, and on a learner's class where the notebook runs the learner's."""

from __future__ import annotations

import re
from collections import deque

import pytest
from alternatives.ch03 import ALTERNATIVES
from mutants.ch03 import MUTANTS, ONLY_SLOWER, UNSEEN_BY_THE_PROBE, PrematureFree
from one_wrong_todo import looked_up, reaches

from course.experiments import bench
from course.experiments.bench import NaiveFreeListManager, naive, paired_runs, trace_ops_per_second
from course.experiments.sharing import beam_search as beam_saving
from course.experiments.sharing import parallel_sampling
from course.experiments.workloads import ALPACA, sample_requests
from course.language import tr
from course.notebook import NotReady, learner_or_course_class, needs
from course.notebook.block_animation import allocation_animation, animate
from course.notebook.block_scenarios import (
    beam_search,
    interleaved_growth,
    probe,
    record,
    running_out,
)
from course.v0.block_manager import BlockManager


def _hooks(html: str) -> dict[str, str]:
    root = re.search(r'<div class="kv-block-animation"([^>]*)>', html).group(1)
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', root))


def test_interleaved_requests_never_share_a_block():
    frames = record(BlockManager(12, 4), 12, interleaved_growth())
    assert not any(f.failed for f in frames)
    for frame in frames:
        if {0, 1} <= set(frame.tables):
            assert not set(frame.tables[0]) & set(frame.tables[1])
    both = [f for f in frames if {0, 1} <= set(f.tables)][-1]
    assert sorted(both.tables[0] + both.tables[1]) != both.tables[0] + both.tables[1]  # interleaved
    assert frames[-1].used_blocks == 0


def test_beam_search_shares_its_prompt_and_copies_on_divergence():
    frames = record(BlockManager(16, 4), 16, beam_search(width=3))
    assert any(f.copy for f in frames), "diverging beams never copied a shared block"
    forked = frames[3]  # allocate, fork, fork: three beams on the prompt's two blocks
    assert forked.used_blocks == 2 and set(forked.ref_counts[:2]) == {3}
    assert frames[-1].used_blocks == 0


def test_running_out_raises_and_changes_nothing():
    frames = record(BlockManager(5, 4), 5, running_out())
    failed = [i for i, f in enumerate(frames) if f.failed]
    assert len(failed) == 2
    for i in failed:
        before, after = frames[i - 1], frames[i]
        assert (before.tables, before.ref_counts, before.free_blocks) == (
            after.tables, after.ref_counts, after.free_blocks)
    assert "allocate(2, 6)" in frames[-1].event and not frames[-1].failed


def test_the_animation_steps_through_the_trace_with_its_hooks():
    frames = record(BlockManager(16, 4), 16, beam_search(width=3))
    widget = allocation_animation(frames)
    (play, back, forward, slider), view = widget.children[0].children, widget.children[1]
    assert (play.max, slider.max) == (len(frames) - 1, len(frames) - 1)
    cow = next(i for i, f in enumerate(frames) if f.copy)
    slider.value = cow
    hooks = _hooks(view.value)
    assert hooks["step"] == str(cow) and hooks["cow"] == "1"
    assert hooks["used-blocks"] == str(frames[cow].used_blocks)
    assert view.value.count("cow-src") == 2 and view.value.count("cow-dst") == 2  # css + cell
    forward.click()
    assert _hooks(view.value)["step"] == str(cow + 1)
    back.click()
    back.click()
    assert _hooks(view.value)["step"] == str(cow - 1)


class _Unfinished(BlockManager):
    def fork(self, parent_id, child_id):
        raise NotImplementedError()


def test_an_unfinished_class_falls_back_to_the_course_s_own_version(capsys):
    widget = animate(_Unfinished, BlockManager, 16, 4, beam_search(width=3))
    assert "the course's own version" in capsys.readouterr().out
    assert _hooks(widget.children[1].value)["steps"] == str(len(beam_search(width=3)) + 1)


def test_without_the_course_s_version_an_unfinished_class_stops_the_cell_in_one_line():
    with pytest.raises(NotReady, match="Finish your BlockManager"):
        animate(_Unfinished, _Unfinished, 16, 4, beam_search(width=3))


def test_a_buggy_class_is_animated_with_its_errors_shown(capsys):
    class Buggy(BlockManager):
        def free(self, seq_id):
            raise RuntimeError("oops")

    frames = record(Buggy(12, 4), 12, interleaved_growth())
    assert frames[-1].failed and "RuntimeError: oops" in frames[-1].event


@pytest.fixture(scope="module")
def alpaca():
    return sample_requests(ALPACA, 120, seed=0)


def test_sharing_saves_more_for_beams_than_samples_and_more_with_width(alpaca):
    samples = [parallel_sampling(alpaca, n, ALPACA).fraction for n in (2, 4, 6)]
    beams = [beam_saving(alpaca, width).fraction for width in (2, 4, 6)]
    assert 0 < samples[0] < samples[1] < samples[2] < 0.5
    assert samples[2] < beams[0] < beams[1] < beams[2] < 1


def test_the_benchmark_runs_both_free_pools():
    assert trace_ops_per_second(BlockManager, 200, operations=900) > 0
    assert trace_ops_per_second(NaiveFreeListManager, 200, operations=900) > 0
    slow = naive(_Unfinished)(8, 4)  # any class built on the skeleton's free pool
    assert isinstance(slow, _Unfinished) and not isinstance(slow.free_blocks, deque)
    slow.allocate(0, 9)
    assert (slow.block_table(0), slow.num_free_blocks()) == ([0, 1, 2], 5)


def test_the_benchmark_prints_the_median_ratio_of_paired_runs(monkeypatch, capsys):
    """What it prints, not how fast: timings belong to ``python -m course.experiments.bench``."""
    fast, slow, ratio = paired_runs(BlockManager, 200, pairs=3, operations=900)
    assert min(fast, slow, ratio) > 0
    monkeypatch.setattr(bench, "paired_runs", lambda manager_class, size: (3e5, 1.5e5, 2.0))
    bench.main()
    header, *rows = capsys.readouterr().out.splitlines()[2:]
    assert header.endswith(tr("deque / list"))
    assert [row.split()[-1] for row in rows] == ["2.00"] * 3


def test_the_probe_tells_correct_classes_from_wrong_ones():
    expected = probe(BlockManager)
    assert all(probe(cls) == expected for cls in ALTERNATIVES)
    for wrong, _ in [m for found in MUTANTS.values() for m in found]:
        # the slower behave right, the unseen go where the probe does not look
        if wrong not in ONLY_SLOWER | UNSEEN_BY_THE_PROBE:
            assert probe(wrong) != expected, wrong.__name__


def test_the_notebook_runs_a_correct_class_and_stands_in_for_an_unfinished_one(capsys):
    mine = ALTERNATIVES[0]
    assert learner_or_course_class(mine, BlockManager, probe) is mine
    assert "Using your BlockManager." in capsys.readouterr().out
    assert learner_or_course_class(_Unfinished, BlockManager, probe) is BlockManager
    assert "the course's own version" in capsys.readouterr().out
    wrong = MUTANTS["copy_on_write"][0][0]
    assert learner_or_course_class(wrong, BlockManager, probe) is BlockManager
    assert "disagrees" in capsys.readouterr().out
    stand_in = learner_or_course_class(_Unfinished, _Unfinished, probe)  # a learner edition
    with pytest.raises(NotReady, match="Finish"):
        needs(stand_in)


def test_sharing_runs_any_correct_class_alike(alpaca):
    few = alpaca[:20]
    for cls in ALTERNATIVES:  # no num_blocks attribute, a LIFO or random free pool
        assert parallel_sampling(few, 4, ALPACA, manager_class=cls) == parallel_sampling(
            few, 4, ALPACA)
        assert beam_saving(few, 3, manager_class=cls) == beam_saving(few, 3)


def test_a_failure_caused_by_an_earlier_todo_says_to_fix_it_first():
    from autograder.checks import ch03

    wrong = {m.__name__: m for found in MUTANTS.values() for m, _ in found}
    for check in (ch03.check_copy_on_write, ch03.check_free):
        with pytest.raises(AssertionError, match="fix fork first"):
            check(wrong["ForkWithoutReferences"])


_HIDDEN_OF = {"allocate": "check_allocate_thoroughly", "append_slot":
              "check_append_slot_thoroughly", "fork": "check_fork_thoroughly",
              "copy_on_write": "check_copy_on_write_thoroughly", "free": "check_free_thoroughly"}
# append_slot and its copy-on-write are one method, written twice: a bug in it costs both
_SAME_METHOD = {"append_slot": {"copy_on_write"}, "copy_on_write": {"append_slot"}}
_ONE_WRONG_TODO = [(todo, mutant) for todo, found in MUTANTS.items() for mutant, _ in found
                   if "__init__" not in vars(mutant)]  # a changed pool is every TODO's


def _hidden_lookups(once_per_run) -> dict[str, set[str]]:
    """TODO -> the BlockManager methods its hidden test looks up on the course's class."""
    from autograder.hidden import ch03 as hidden

    return {other: set(names) for other, names in once_per_run("ch03-hidden-lookups", lambda: {
        other: sorted(looked_up(getattr(hidden, check), BlockManager))
        for other, check in _HIDDEN_OF.items()}).items()}


@pytest.mark.one_wrong_todo
@pytest.mark.parametrize(("todo", "mutant"), _ONE_WRONG_TODO,
                         ids=[f"{todo}-{m.__name__}" for todo, m in _ONE_WRONG_TODO])
def test_one_wrong_todo_costs_that_todo_alone(todo, mutant, once_per_run):
    """A BlockManager right but for one TODO: every other TODO's hidden test passes (the
    methods they build on lent from the course where the learner's fail). A hidden test that
    never looks up what the mutant changes runs on it as on the course's class, which passes
    it (``one_wrong_todo.reaches``): it is not run again."""
    from autograder.hidden import ch03 as hidden

    looked = _hidden_lookups(once_per_run)
    for other, check in _HIDDEN_OF.items():
        if other != todo and other not in _SAME_METHOD.get(todo, ()) and reaches(
                looked[other], mutant, BlockManager):
            getattr(hidden, check)(mutant)


def test_what_a_check_looks_up_is_recorded_and_decides_whether_a_mistake_can_reach_it(
        once_per_run):
    """What the one-wrong-TODO sweep relies on to skip a check: every lookup of a method is
    noted (a call, a bound method taken, the constructor), a check that looks up none of what
    a mutant changes passes on it as on the course's class (free's mistake and allocate's
    hidden test, run anyway), and a changed constant reaches every check."""
    from autograder.hidden import ch03 as hidden

    def check(cls):
        bm = cls(4, 2)
        bm.allocate(0, 3)
        taken = bm.free  # a bound method, never called
        assert callable(taken)

    looked = looked_up(check, BlockManager)
    assert {"__init__", "allocate", "free"} <= looked and "fork" not in looked
    allocates = _hidden_lookups(once_per_run)["allocate"]  # as the sweep reads it
    assert not reaches(allocates, PrematureFree, BlockManager)
    hidden.check_allocate_thoroughly(PrematureFree)
    assert reaches(allocates, type("Bigger", (PrematureFree,), {"DEFAULT_BLOCKS": 8}),
                   BlockManager)
    assert reaches({"free"}, PrematureFree, BlockManager)


def _with_allocate_one_block_too_many(base: type) -> type:
    """``base`` with the allocate mistake ``num_tokens // block_size + 1`` (one block too
    many for a prompt that fills its blocks; right otherwise)."""

    class OneTooMany(base):
        def allocate(self, seq_id, num_tokens):
            table = super().allocate(seq_id, num_tokens)
            if num_tokens % self.block_size == 0:
                self.tables[seq_id].append(self._take_block())
                table.append(self.tables[seq_id][-1])
            return table

    return OneTooMany


def test_the_note_blames_an_earlier_todo_only_where_it_is_due():
    """allocate wrong (one block too many for a prompt that fills its blocks) and a
    copy-on-write that keeps the shared block's reference: test_copy_on_write's scenario
    allocates 3 tokens (right) and fails on the reference, so the learner reads that failure
    and its idea, with no note sending them to allocate. With copy-on-write right, the same
    wrong allocate is what breaks the scenario that fills a block: then the note is due."""
    from autograder.checks import ch03

    both = _with_allocate_one_block_too_many(dict(
        (m.__name__, m) for m, _ in MUTANTS["copy_on_write"])["CopyKeepsReference"])
    with pytest.raises(AssertionError) as failed:
        ch03.check_copy_on_write(both)
    assert "fix allocate first" not in str(failed.value)
    assert "reference" in str(failed.value)
    with pytest.raises(AssertionError, match="fix allocate first"):
        ch03.check_copy_on_write(_with_allocate_one_block_too_many(BlockManager))
