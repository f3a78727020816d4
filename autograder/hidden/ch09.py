"""Chapter 9's hidden checks, and what the visible checks ask of them.

The scheduling step's model is a second reading of the rules in ``schedule_step``'s
docstring, written apart from the course's answer (phases as functions over a snapshot of the
queues); the course's own test (``tests/test_chunked_scheduler.py``) shows the two agree on
hypothesis-drawn scenarios. The thorough check runs the learner's step and the model in lock
step on hypothesis-drawn scenarios: budgets down to 1, blocks of 1 to 4, shared prefixes,
pools small enough to preempt, a cap on running requests.
"""

from __future__ import annotations

from collections.abc import Callable

from autograder.checks._helpers import for_all
from autograder.checks.ch09 import (
    MAX_STEPS,
    arrive,
    make_scheduler,
    run_schedule,
    simulate,
)
from autograder.private import thorough
from course.block_manager import NoFreeBlocksError
from course.chunked_scheduler import Chunk, ChunkedRequest, ChunkedScheduler, Schedule

# --- schedule_step ---------------------------------------------------------------------------


def model_step(scheduler: ChunkedScheduler) -> Schedule:
    """The rules, read again: a phase for running requests, one for waiting ones."""
    manager, plan = scheduler.manager, Schedule()
    left = [scheduler.max_num_batched_tokens]

    def give(request: ChunkedRequest, tokens_left: int) -> None:
        count = tokens_left if tokens_left < left[0] else left[0]
        plan.chunks.append(Chunk(request, request.num_computed_tokens, count))
        request.num_computed_tokens = request.num_computed_tokens + count
        left[0] = left[0] - count

    def evict_newest() -> ChunkedRequest:
        victim = scheduler.running[-1]
        scheduler.running = scheduler.running[:-1]
        manager.free(victim.id)
        victim.num_computed_tokens = 0
        scheduler.waiting.insert(0, victim)
        plan.preempted.append(victim.id)
        return victim

    def slots_for(request: ChunkedRequest) -> bool:
        """Give every token of ``request`` a slot; False when it was preempted itself."""
        for position in range(manager.seq_len(request.id), request.num_tokens):
            while True:
                try:
                    manager.append_slot(request.id, request.tokens[position])
                    break
                except NoFreeBlocksError:
                    if evict_newest() is request:
                        return False
        return True

    for request in list(scheduler.running):
        if left[0] == 0 or request not in scheduler.running:
            break
        if not slots_for(request):
            break
        give(request, request.num_tokens - request.num_computed_tokens)
    if plan.preempted:
        return plan
    while left[0] > 0 and len(scheduler.waiting) > 0 and \
            len(scheduler.running) < scheduler.max_num_seqs:
        head = scheduler.waiting[0]
        try:
            hits = manager.allocate(head.id, head.tokens)
        except NoFreeBlocksError:
            return plan
        scheduler.waiting.remove(head)
        scheduler.running.append(head)
        head.num_computed_tokens = hits
        give(head, head.num_tokens - hits)
    return plan


def schedule_trace(scenario: dict) -> list[dict]:
    """Each step's summary when the rules schedule ``scenario``."""
    scheduler, requests = make_scheduler(scenario)
    trace = []
    for step in range(MAX_STEPS):
        if step > max(r.arrival for r in requests) and not scheduler.busy():
            break
        arrive(scheduler, requests, step)
        trace.append(simulate(scheduler, step, model_step)[1])
    return trace


class _LockStep:
    """The model's own scheduler, stepped beside the learner's: the expected summary of each
    step."""

    def __init__(self, scenario: dict) -> None:
        self.scheduler, self.requests = make_scheduler(scenario)

    def __call__(self, step: int, _learner_state: ChunkedScheduler) -> dict:
        arrive(self.scheduler, self.requests, step)
        return simulate(self.scheduler, step, model_step)[1]


def _scenarios():
    from hypothesis import strategies as st

    prefix = st.lists(st.integers(0, 3), min_size=0, max_size=9)

    @st.composite
    def scenario(draw):
        block_size = draw(st.sampled_from([1, 2, 3, 4]))
        shared = draw(prefix)
        requests = []
        for _ in range(draw(st.integers(1, 5))):
            own = draw(st.lists(st.integers(0, 9), min_size=1, max_size=10))
            prompt = (shared[:draw(st.integers(0, len(shared)))] if draw(st.booleans())
                      else []) + own
            requests.append((prompt, draw(st.integers(1, 6)), draw(st.integers(0, 6))))
        longest = max(-(-(len(p) + n) // block_size) for p, n, _ in requests)
        return {"num_blocks": longest + draw(st.integers(0, 12)), "block_size": block_size,
                "budget": draw(st.integers(1, 12)), "max_num_seqs": draw(st.integers(1, 5)),
                "requests": requests}

    return scenario()


def _describe(scenario: dict) -> str:
    return (f"(budget {scenario['budget']}, blocks of {scenario['block_size']}, "
            f"{scenario['num_blocks']} blocks, at most {scenario['max_num_seqs']} running, "
            f"requests (prompt, output_len, arrival) {scenario['requests']})")


@thorough
def check_schedule_step_thoroughly(fn: Callable) -> None:
    """Hypothesis-drawn scenarios, the learner's step and the model's in lock step."""

    def one(scenario: dict) -> None:
        run_schedule(fn, scenario, _LockStep(scenario), _describe(scenario))

    for_all(_scenarios(), one, max_examples=120)
