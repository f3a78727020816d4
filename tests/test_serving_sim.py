"""The serving simulator on the course's scheduler: every request served exactly, no leak; the
experiments run whichever scheduler class they are given (the notebook gives the learner's)."""

from __future__ import annotations

import pytest
from alternatives.ch05 import Scheduler as Alternative
from mutants.ch05 import MUTANTS

from course import serving_experiments as experiments
from course.notebook import NotReady, learner_or_course_class, needs
from course.scheduler import Request, Scheduler, StaticBatchScheduler, SwapSpaceFullError
from course.serving_sim import opt13b_a100_40gb, poisson_arrivals, simulate
from course.workloads import SHAREGPT


class Recording(Scheduler):
    """The reference, keeping the schedulers it makes inspectable after the run."""

    made: list[Scheduler] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        Recording.made.append(self)


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("block_size", [1, 16, 128])
def test_every_request_finishes_with_its_tokens_and_no_block_leaks(preemption, block_size):
    requests = poisson_arrivals(SHAREGPT, 150, rate=6.0, seed=2)
    Recording.made.clear()
    report = simulate(requests, lambda: Recording(
        3000 // block_size, block_size, preemption=preemption,
        cpu_blocks=20000 // block_size), opt13b_a100_40gb())
    scheduler = Recording.made[0]
    assert report.completed == len(requests) and report.rejected == 0
    assert report.output_tokens == sum(r.output_len for r in requests)
    assert report.preemptions > 0  # the pool is small enough to force preemption
    assert scheduler.gpu.num_free_blocks() == scheduler.gpu.num_blocks
    assert scheduler.cpu.num_free_blocks() == scheduler.cpu.num_blocks
    assert len(report.ttft) == len(report.latency) == len(requests)
    assert all(t >= 0 for t in report.ttft)


def test_a_request_that_can_never_fit_is_rejected_not_retried():
    requests = [Request(0, 100, 10, 0.0), Request(1, 3000, 10, 0.1), Request(2, 50, 5, 0.2)]
    report = simulate(requests, lambda: Scheduler(100, 16), opt13b_a100_40gb())
    assert report.rejected == 1 and report.completed == 2


def test_a_full_swap_space_says_so():
    requests = [Request(i, 40, 200, 0.0) for i in range(4)]
    with pytest.raises(SwapSpaceFullError, match="swap space"):
        simulate(requests, lambda: Scheduler(30, 16, preemption="swap", cpu_blocks=2),
                 opt13b_a100_40gb())


def test_static_batching_admits_only_between_batches():
    requests = poisson_arrivals(SHAREGPT, 40, rate=4.0, seed=1)
    static = simulate(requests, lambda: StaticBatchScheduler(14128 // 2048, 2048),
                      opt13b_a100_40gb())
    continuous = simulate(requests, lambda: Scheduler(14128 // 2048, 2048), opt13b_a100_40gb())
    assert static.completed == continuous.completed == 40
    assert static.duration_s > continuous.duration_s


def test_paging_beats_contiguous_reservation_at_the_same_memory():
    paged, contiguous = experiments.run(4.0, "paged", count=200), experiments.run(
        4.0, "contiguous", count=200)
    assert paged.requests_per_s > 2 * contiguous.requests_per_s


def test_the_experiment_commands_print_their_tables(capsys):
    experiments.main(["timeline"])
    assert "steps, peak queue" in capsys.readouterr().out


def test_the_experiments_run_the_scheduler_they_are_given():
    made = []

    class Counting(Alternative):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(type(self))

    runs = experiments.batching(scheduler=Counting)
    assert len(made) == 3 and made[1] is made[2] is Counting
    assert made[0] is not Counting and issubclass(made[0], Counting)  # static batching
    assert {label: r.completed for label, r in runs.items()} == {
        label: r.completed for label, r in experiments.batching().items()}


def test_the_probe_takes_every_path_of_a_step():
    found = experiments.probe(Scheduler)
    steps = [step for scenario in found for step in scenario if step[0] != "swap space full"]
    for kind in range(6):  # prefill, decode, preempted, swapped out, swapped in, rejected
        assert any(step[kind] for step in steps)
    assert any(scenario[-1][0] == "swap space full" for scenario in found)
    for scenario, steps in zip(experiments.PROBES, found, strict=True):
        if scenario.get("preemption", "recompute") == "recompute":
            assert not any(step[3] or step[4] for step in steps)


def _policy(cls, course=Scheduler):
    return learner_or_course_class(cls, course, experiments.probe)


def test_the_notebook_runs_a_learners_scheduler_that_agrees_on_the_probe(capsys):
    assert _policy(Alternative) is Alternative
    assert "Using your Scheduler." in capsys.readouterr().out


@pytest.mark.parametrize("mutant", [m for wrong in MUTANTS.values() for m, _ in wrong],
                         ids=lambda m: m.__name__)
def test_a_wrong_scheduler_gives_way_to_the_courses_own(mutant, capsys):
    assert _policy(mutant) is Scheduler
    assert "the course's own version draws this" in capsys.readouterr().out


def test_an_unfinished_scheduler_stops_the_cell_where_the_course_has_no_answer(capsys):
    class Unfinished(Scheduler):
        def preempt(self, victim, plan):
            raise NotImplementedError

    class Stubbed(Scheduler):  # the learner edition's course scheduler
        def admit(self, plan):
            raise NotImplementedError

    assert _policy(Unfinished) is Scheduler
    assert "is not finished yet" in capsys.readouterr().out
    with pytest.raises(NotReady, match="Finish your Unfinished"):
        needs(_policy(Unfinished, course=Stubbed))
    assert _policy(Alternative, course=Stubbed) is Alternative

