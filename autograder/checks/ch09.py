"""Visible checks for chapter 9, the engine with chunked prefill: each TODO's readable case.

The scheduling step is run on a small scenario step by step (a simulated engine around it
emits a fixed token whenever a request has computed all of its tokens, and finishes done
requests); after every step, the chunks, the preemptions and every request's computed count
must equal what the chapter's rules give. What the rules give comes from the chapter's hidden
module (``autograder.private``), a separate reading of the same rules, where the thorough
checks are too.
"""

from __future__ import annotations

from collections.abc import Callable

from autograder.checks._helpers import learner_call
from autograder.private import private, visible
from course.chunked_scheduler import ChunkedRequest, ChunkedScheduler, Schedule

# --- schedule_step ---------------------------------------------------------------------------

RULES = ("The rules: running requests first (oldest first), each given a slot for its new "
         "token (preempting the newest running request by recompute when the pool is out of "
         "blocks) and min(tokens left to compute, budget) tokens; then, if nothing was "
         "preempted, waiting requests first come first served, each allocated with its "
         "prefix hits as num_computed_tokens and given min(tokens left, budget); every "
         "scheduled chunk adds its tokens to num_computed_tokens and takes them from the "
         "budget.")
BUDGET = ("The step scheduled more tokens than max_num_batched_tokens: every chunk, a "
          "decode's 1 token included, takes its tokens from the one budget, and each chunk is "
          "clipped to what is left of it. ")
REMAINING = ("A chunk runs past the request's last token: schedule at most what is left to "
             "compute, request.num_tokens - request.num_computed_tokens (a prefix hit or an "
             "earlier chunk already computed the rest). ")
AT_LEAST_ONE = ("A request was admitted with nothing left to compute: its prefix hits are "
                "what manager.allocate returns, which never counts the last token (at least "
                "one token is always computed, so the step has a logit to sample from). ")
RUNNING_FIRST = ("A waiting request was scheduled before a running one: running requests "
                 "(their decodes and unfinished prefill chunks) come first, waiting ones take "
                 "what budget is left. ")
RESET = ("A preempted request kept its num_computed_tokens: preemption by recompute frees its "
         "blocks, so its K/V are gone; set num_computed_tokens to 0 (it recomputes, with "
         "whatever prefix hits it finds when admitted again). ")
MAX_STEPS = 400


def emitted_token(request: ChunkedRequest) -> int:
    """The token the simulated engine emits: fixed by the request and its output length."""
    return (7 * request.id + 13 * len(request.output) + 5) % 97


def describe_state(scheduler: ChunkedScheduler) -> str:
    def one(r: ChunkedRequest) -> str:
        return f"{r.id} ({r.num_tokens} tokens, {r.num_computed_tokens} computed)"

    return (f"running [{', '.join(map(one, scheduler.running))}], waiting "
            f"[{', '.join(map(one, scheduler.waiting))}], {scheduler.manager.num_free_blocks()} "
            f"free blocks of {scheduler.block_size}, budget {scheduler.max_num_batched_tokens}")


def summary(scheduler: ChunkedScheduler, plan: Schedule) -> dict:
    """What a step did, as plain data: chunks (id, start, tokens), preempted ids, and each
    running and waiting request's (id, num_computed_tokens) in queue order."""
    chunks = [(c.request.id, c.start, c.num_tokens) for c in getattr(plan, "chunks", [])]
    return {"chunks": chunks, "preempted": list(getattr(plan, "preempted", [])),
            "running": [(r.id, r.num_computed_tokens) for r in scheduler.running],
            "waiting": [(r.id, r.num_computed_tokens) for r in scheduler.waiting]}


def make_scheduler(scenario: dict) -> tuple[ChunkedScheduler, list[ChunkedRequest]]:
    scheduler = ChunkedScheduler(scenario["num_blocks"], scenario["block_size"],
                                 scenario["budget"], scenario.get("max_num_seqs", 64))
    requests = [ChunkedRequest(i, list(prompt), output_len, arrival)
                for i, (prompt, output_len, arrival) in enumerate(scenario["requests"])]
    return scheduler, requests


def arrive(scheduler: ChunkedScheduler, requests: list[ChunkedRequest], step: int) -> None:
    for request in requests:
        if request.arrival == step:
            scheduler.add(request)


def simulate(scheduler: ChunkedScheduler, step: int, schedule: Callable,
             name: str = "schedule_step") -> tuple[Schedule, dict]:
    """One step of the simulated engine (arrivals already joined): ``schedule`` plans,
    every request that computed all its tokens emits ``emitted_token``, done requests
    finish. Returns the plan and its summary (taken before tokens are emitted)."""
    plan = learner_call(name, scheduler.step, schedule)
    if not isinstance(plan, Schedule):
        raise AssertionError(f"{name}(scheduler) returned {type(plan).__name__}, expected a "
                             "Schedule")
    seen = summary(scheduler, plan)
    for chunk in plan.chunks:
        request = chunk.request
        if chunk.num_tokens > 0 and chunk.end == request.num_tokens and not request.done:
            request.emit(emitted_token(request))
    for request in list(scheduler.running):
        if request.done:
            scheduler.finish(request)
    return plan, seen


def diagnose(before: dict, plan: Schedule, seen: dict, budget: int) -> str:
    """The idea a wrong step misses, read from what it did (``before``: each request's
    (num_tokens, num_computed_tokens, running) before the step)."""
    chunks = seen["chunks"]
    if sum(n for _, _, n in chunks) > budget:
        return BUDGET
    if any(start + n > before[i][0] for i, start, n in chunks if i in before):
        return REMAINING
    admitted = [i for i, _, _ in chunks if i in before and not before[i][2]]
    if any(n <= 0 for i, _, n in chunks if i in admitted):
        return AT_LEAST_ONE
    kinds = [before[i][2] for i, _, _ in chunks if i in before]
    if any(not a and b for a, b in zip(kinds, kinds[1:], strict=False)):
        return RUNNING_FIRST
    waiting = dict(seen["waiting"])
    if any(waiting.get(i, 0) != 0 for i in seen["preempted"]):
        return RESET
    return ""


def run_schedule(fn: Callable, scenario: dict, expected: list[dict] | Callable,
                 label: str) -> None:
    """Run ``fn`` on ``scenario`` step by step against ``expected`` (the summaries the rules
    give, or a function of the step and the state before it that gives one)."""
    scheduler, requests = make_scheduler(scenario)
    for step in range(MAX_STEPS):
        if step > max(r.arrival for r in requests) and not scheduler.busy():
            return
        arrive(scheduler, requests, step)
        state = describe_state(scheduler)
        before = {r.id: (r.num_tokens, r.num_computed_tokens, True) for r in scheduler.running}
        before |= {r.id: (r.num_tokens, r.num_computed_tokens, False) for r in scheduler.waiting}
        want = expected(step, scheduler) if callable(expected) else expected[step]
        plan, seen = simulate(scheduler, step, fn)
        if seen != want:
            hint = diagnose(before, plan, seen, scenario["budget"])
            raise AssertionError(
                f"schedule_step(scheduler) {label}, step {step}, with {state}: it scheduled "
                f"{seen['chunks']} (request, start, tokens), preempted {seen['preempted']}, "
                f"left running {seen['running']} and waiting {seen['waiting']} (request, "
                f"computed); the rules give {want['chunks']}, preempted {want['preempted']}, "
                f"running {want['running']}, waiting {want['waiting']}. {hint}{RULES}")
    raise AssertionError(f"schedule_step(scheduler) {label}: still busy after {MAX_STEPS} "
                         "steps. " + RULES)


SHARED = [1, 2, 3, 4, 5, 6, 7, 8]
SCENARIO = {  # blocks of 4; request 2's prompt is request 0's first 8 tokens
    "num_blocks": 7, "block_size": 4, "budget": 5,
    "requests": [(SHARED + [9, 10], 3, 0), ([20, 21, 22], 4, 0), (SHARED, 3, 3),
                 ([40] * 9, 6, 4)],
}


@visible
def check_schedule_step(fn: Callable) -> None:
    """Budget 5, blocks of 4, a pool of 7 blocks: a 10-token prompt chunked beside a short
    one, a later prompt that is its first 8 tokens (prefix hits, the last block recomputed),
    and a long request that runs the pool out of blocks (preemption by recompute)."""
    expected = private("09").schedule_trace(SCENARIO)
    run_schedule(fn, SCENARIO, expected, "(budget 5, blocks of 4, 7 blocks)")
