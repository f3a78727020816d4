"""The serving simulator on the course's scheduler: every request served exactly, no leak; the
experiments run whichever scheduler class they are given (the notebook gives the learner's)."""

from __future__ import annotations

import pytest
from alternatives.ch05 import Scheduler as Alternative
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mutants.ch05 import MUTANTS, UNSEEN_BY_THE_PROBE
from one_wrong_todo import looked_up, reaches

from autograder.hidden import ch05 as hidden
from course.experiments import serving_experiments as experiments
from course.experiments.serving_sim import opt13b_a100_40gb, poisson_arrivals, simulate
from course.experiments.workloads import SHAREGPT
from course.notebook import NotReady, learner_or_course_class, needs
from course.v0.scheduler import Request, Scheduler, StaticBatchScheduler, SwapSpaceFullError


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


@pytest.mark.parametrize("mutant", [m for wrong in MUTANTS.values() for m, _ in wrong
                                     if m not in UNSEEN_BY_THE_PROBE], ids=lambda m: m.__name__)
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


# -- two readings of chapter 5's policy agree on every input ----------------------------------


def _trace(cls, specs, num_blocks, block_size, max_seqs, max_tokens, watermark, preemption,
           cpu_blocks, max_steps) -> list[dict]:
    """What a Scheduler class does with requests ``specs`` on a fake engine (every planned
    request produces one token per step; done requests are finished), in the shape of the
    hidden model's ``expected_run``."""
    s = cls(num_blocks, block_size, max_num_seqs=max_seqs, max_num_batched_tokens=max_tokens,
            watermark=watermark, preemption=preemption, cpu_blocks=cpu_blocks)
    for i, (prompt, output) in enumerate(specs):
        s.add(Request(i, prompt, output))

    def state() -> dict:
        return {"waiting": [r.id for r in s.waiting], "running": [r.id for r in s.running],
                "swapped": [r.id for r in s.swapped], "free": s.gpu.num_free_blocks(),
                "cpu_free": s.cpu.num_free_blocks(),
                "kv": {r.id: s.gpu.seq_len(r.id) for r in s.running}}

    steps: list[dict] = []
    while len(steps) < max_steps and (s.waiting or s.running or s.swapped):
        try:
            plan = s.step()
        except SwapSpaceFullError:
            steps.append({"swap_full": True, **state()})
            break
        ids = {"prefill": [r.id for r in plan.prefill], "decode": [r.id for r in plan.decode],
               "preempted": [r.id for r in plan.preempted],
               "out": [r.id for r, _ in plan.swapped_out],
               "in": [r.id for r, _ in plan.swapped_in],
               "rejected": [r.id for r, _ in plan.rejected]}
        step = {"swap_full": False, "plan": ids, **state()}
        for request in plan.prefill + plan.decode:
            request.generated += 1
        done = [r for r in s.running if r.done]
        for request in done:
            s.finish(request)
        step["finished"] = sorted(r.id for r in done)
        steps.append(step)
    return steps


@st.composite
def _scenarios(draw):
    """Any input the text speaks of: pools smaller than a request (rejections), batch limits,
    token budgets met exactly or smaller than a prompt, watermarks, both preemptions, CPU
    pools from none to roomy."""
    size = draw(st.sampled_from([1, 2, 3, 4, 8]))
    specs = draw(st.lists(st.tuples(st.integers(1, 24), st.integers(1, 16)), max_size=8))
    prompts = [p for p, _ in specs]
    exact = [sum(prompts[:k]) + d for k in range(1, len(prompts) + 1) for d in (0, 1, 2)]
    tokens = draw(st.one_of(st.sampled_from(exact or [1]), st.integers(1, 64), st.just(8192)))
    return dict(specs=specs, num_blocks=draw(st.integers(1, 24)), block_size=size,
                max_seqs=draw(st.one_of(st.integers(1, 5), st.just(256))), max_tokens=tokens,
                watermark=draw(st.sampled_from([0.0, 0.1, 0.25, 0.5])),
                preemption=draw(st.sampled_from(["recompute", "swap"])),
                cpu_blocks=draw(st.one_of(st.integers(0, 16), st.just(64))), max_steps=80)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_scenarios())
def test_two_readings_of_the_scheduling_policy_agree_on_every_input(scenario):
    """The hidden model (counters: tokens per request, free blocks, the queues) and the
    course's Scheduler and the alternative (both on BlockManagers), each written from the
    notebook's text, make the same plans, queues and pool counts step by step."""
    model = hidden.expected_run(**scenario)
    assert _trace(Scheduler, **scenario) == model
    assert _trace(Alternative, **scenario) == model


_HIDDEN_OF = {todo: getattr(hidden, f"check_{todo}_thoroughly") for todo in MUTANTS}
_ONE_WRONG_TODO = [(todo, mutant) for todo, found in MUTANTS.items() for mutant, _ in found
                   if set(vars(mutant)) - {"__module__", "__doc__", "__qualname__"} <= {todo}]


@pytest.mark.one_wrong_todo
@pytest.mark.parametrize(("todo", "mutant"), _ONE_WRONG_TODO,
                         ids=[f"{todo}-{m.__name__}" for todo, m in _ONE_WRONG_TODO])
def test_one_wrong_policy_costs_that_todo_alone(todo, mutant, once_per_run):
    """A scheduler right but for one policy (an admission mistake, say): every other policy's
    hidden test passes, the course's lent where the learner's scheduler fails it. A hidden
    test that never looks up the wrong policy runs on it as on the course's scheduler, which
    passes it (``one_wrong_todo.reaches``): it is not run again."""
    looked = once_per_run("ch05-hidden-lookups", lambda: {
        other: sorted(looked_up(check, Scheduler)) for other, check in _HIDDEN_OF.items()})
    for other, check in _HIDDEN_OF.items():
        if other != todo and reaches(set(looked[other]), mutant, Scheduler):
            check(mutant)


def _mutant(name: str) -> type:
    return next(m for found in MUTANTS.values() for m, _ in found if m.__name__ == name)


class _OneSlotTooMany(Scheduler):
    """admit wrong: it also takes the slot of the first generated token (one KV slot too many
    for every request it admits)."""

    def admit(self, plan):
        super().admit(plan)
        for request in plan.prefill:
            self.gpu.append_slot(request.id)


def test_the_note_blames_an_earlier_todo_only_where_it_is_due():
    """admit wrong (a step exactly at the token budget taken as over) and preempt wrong (a
    victim of recompute sent to the back of the queue): test_preempt's scenarios never meet
    the budget, so they fail on the queue's order with the course's admit lent too, and the
    learner reads that failure and its idea, with no note sending them to admit. An admit
    that holds one KV slot too many breaks those scenarios itself: then the note is due."""
    from autograder.checks import ch05

    both = type("Both", (_mutant("PreemptedToTheBack"),),
                {"admit": _mutant("BudgetMetExactlyIsOver").admit})
    with pytest.raises(AssertionError) as failed:
        ch05.check_preempt(both)
    assert "fix admit first" not in str(failed.value)
    assert "front of the waiting queue" in str(failed.value)
    with pytest.raises(AssertionError, match="fix admit first"):
        ch05.check_preempt(_OneSlotTooMany)
