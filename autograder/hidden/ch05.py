"""Chapter 5's hidden checks: a model of the policy written with plain counters (tokens per
request, free blocks, the three queues), the known mistakes (the same model with one rule
read wrong, each with the hint that names it), and random scenarios that drive the learner's
class step by step against them: queues, pools, limits, token budgets met exactly,
watermarks, swap pools too small for the workload. The visible checks ask ``expected_run``
and ``known_mistakes`` here.

The policy, as the notebook states it:

* reserve: every running request, oldest first, gets the slot of its next token and joins
  ``plan.decode``; a request whose held tokens fill their blocks needs a new block, and when
  none is free the newest running request is preempted (the current one itself when it is
  the newest: then the reservation ends) and the current one tries again;
* preempt: by recompute, the victim's blocks are freed and it goes to the front of the
  waiting queue; by swap, a victim whose blocks do not fit in the free CPU blocks raises
  SwapSpaceFullError before anything changes, else its KV moves to the CPU pool, its GPU
  blocks are freed and it joins the end of ``swapped``;
* swap in: while ``running`` holds fewer than ``max_num_seqs`` requests, the front of
  ``swapped`` (swapped out first) comes back when its blocks fit in the free blocks minus
  the watermark (it decodes from the next step);
* admit (only when nothing is swapped): the head of the waiting queue is rejected when its
  full length needs more blocks than the pool minus the watermark; otherwise admission stops
  when ``running`` holds ``max_num_seqs`` requests, when its ``context_len`` tokens' blocks
  exceed the free blocks minus the watermark, or when the plan's tokens (prefills' context
  lengths and one per decode) plus its ``context_len`` exceed ``max_num_batched_tokens``.
"""

from __future__ import annotations

import types
from collections import deque
from collections.abc import Callable

from hypothesis import strategies as st

from autograder.checks._helpers import for_all, verdict_only
from autograder.checks._lending import one_bug_one_todo
from autograder.checks.ch05 import (
    MAX_STEPS,
    _Harness,
    check_admit,
    check_preempt,
    check_reserve_decode_slots,
    check_swap_in,
)
from autograder.private import thorough
from course.v0.scheduler import Request

_NEVER = ("A request whose full length needs more blocks than the pool holds above the "
          "watermark can never run: it is rejected as soon as it reaches the head of the queue, "
          "before the batch, block and token checks; here it was not.")

MISTAKES = {
    "overtakes": "Admission is first come, first served: a request behind one that did not "
                 "fit was admitted ahead of it.",
    "never_rejects": _NEVER,
    "rejects_late": _NEVER,
    "rejects_after_checks": _NEVER,
    "no_watermark": "The watermark was ignored: admission leaves watermark_blocks of the free "
                    "blocks unused, and a request can never fit when its full length needs "
                    "more blocks than the pool less those.",
    "no_watermark_admit": "The watermark was ignored: a prompt fits only in the free blocks "
                          "less watermark_blocks.",
    "no_watermark_reject": "The rejection ignored the watermark: a request can never fit when "
                           "its full length needs more blocks than the pool less "
                           "watermark_blocks.",
    "budget_strict": "A step whose tokens equal max_num_batched_tokens exactly is within the "
                     "budget; it was treated as over.",
    "budget_no_decode": "The token budget counts the step's decodes too (one token each, "
                        "plan.num_batched_tokens), not only the prefills.",
    "no_budget": "max_num_batched_tokens was ignored: the step's tokens went over it.",
    "seqs_prefill": "max_num_seqs bounds the whole running batch (running), not only the "
                    "requests admitted in this step.",
    "seqs_inclusive": "running may hold max_num_seqs requests, not one more.",
    "admit_prompt_len": "Admission counts, allocates and prefills a request's context_len "
                        "tokens (its prompt and what it has generated), not its prompt_len: a "
                        "request preempted by recompute comes back with everything it had.",
    "reserve_newest_first": "Slots are reserved oldest first (running is in admission order); "
                            "the decode batch came out in another order.",
    "victim_oldest": "The victim is the newest running request (the end of running), never "
                     "the oldest.",
    "no_retry": "After preempting the newest running request, the request that ran out of "
                "blocks tries again: it still needs its slot, and joins plan.decode once it "
                "holds it.",
    "preempt_unlisted": "A preempted request is recorded in plan.preempted, by recompute and by "
                        "swap alike.",
    "no_self_preempt": "When the request that needs a block is itself the newest, it preempts "
                       "itself (into plan.preempted); it was left running without its slot.",
    "recompute_to_back": "A request preempted by recompute goes back to the front of the "
                         "waiting queue (it arrived before everything still waiting); it went "
                         "to the back.",
    "swap_full_changes_state": "A full CPU pool changes nothing: SwapSpaceFullError comes "
                               "before the victim leaves running or its blocks move.",
    "swap_in_newest_first": "Swapped requests come back in the order they were swapped out "
                            "(the front of swapped first); one swapped out later came back "
                            "first.",
    "swap_in_overtakes": "Swapped requests come back in order: a newer one came back while the "
                         "oldest did not fit.",
    "swap_in_decodes": "A request swapped in is not in this step's plan.decode: its next slot "
                       "is reserved in the next step.",
    "swap_in_no_watermark": "Swapping in keeps the watermark too: a swapped request comes back "
                            "only when its blocks fit in the free blocks less watermark_blocks.",
}


class SwapFull(Exception):
    """The model's SwapSpaceFullError."""


class _Undefined(Exception):
    """A mistaken reading that has no meaning from here on (its run ends)."""


class _Model:
    """The policy with counters (``mistake``: the one rule read wrong, or None)."""

    def __init__(self, num_blocks, block_size, max_seqs, max_tokens, watermark, preemption,
                 cpu_blocks, mistake=None):
        self.size, self.total, self.free = block_size, num_blocks, num_blocks
        self.max_seqs, self.max_tokens = max_seqs, max_tokens
        self.mark = int(num_blocks * watermark)
        self.preemption, self.cpu_free = preemption, cpu_blocks
        self.mistake = mistake
        self.gpu: dict[int, int] = {}  # tokens with KV on the GPU, per running request
        self.cpu: dict[int, int] = {}  # tokens with KV on the CPU, per swapped request
        self.waiting: deque = deque()
        self.running: list = []
        self.swapped: deque = deque()

    def blocks(self, tokens: int) -> int:
        return -(-tokens // self.size)

    # -- reserve ---------------------------------------------------------------------------

    def reserve(self, plan: dict) -> None:
        if self.mistake == "reserve_newest_first":
            for r in reversed(self.running):
                if self.gpu[r.id] % self.size == 0:
                    if self.free == 0:
                        raise _Undefined
                    self.free -= 1
                self.gpu[r.id] += 1
                plan["decode"].append(r.id)
            return
        i = 0
        while i < len(self.running):
            r = self.running[i]
            if self.gpu[r.id] % self.size == 0 and self.free == 0:  # needs a block: none left
                victim = self.running[0] if self.mistake == "victim_oldest" else self.running[-1]
                if victim is r and self.mistake == "no_self_preempt":
                    return
                self.preempt(victim, plan)
                if self.mistake == "victim_oldest":
                    i = i if victim is r else i - 1  # running shifted left by one
                    continue
                if victim is r:
                    return
                if self.mistake == "no_retry":  # moves on, r without its slot
                    i += 1
                continue
            if self.gpu[r.id] % self.size == 0:
                self.free -= 1
            self.gpu[r.id] += 1
            plan["decode"].append(r.id)
            i += 1

    def preempt(self, victim, plan: dict) -> None:
        if self.preemption == "swap":
            need = self.blocks(self.gpu[victim.id])
            if self.mistake == "swap_full_changes_state":
                self._remove(victim, plan)
            if need > self.cpu_free:
                raise SwapFull
            if self.mistake != "swap_full_changes_state":
                self._remove(victim, plan)
            self.cpu_free -= need
            self.cpu[victim.id] = self.gpu.pop(victim.id)
            self.free += need
            plan["out"].append(victim.id)
            self.swapped.append(victim)
            return
        self._remove(victim, plan)
        self.free += self.blocks(self.gpu.pop(victim.id))
        if self.mistake == "recompute_to_back":
            self.waiting.append(victim)
        else:
            self.waiting.appendleft(victim)

    def _remove(self, victim, plan: dict) -> None:
        """The victim leaves running, into plan.preempted."""
        self.running.remove(victim)
        if self.mistake != "preempt_unlisted":
            plan["preempted"].append(victim.id)

    # -- swap in ---------------------------------------------------------------------------

    def swap_in(self, plan: dict) -> None:
        mark = 0 if self.mistake == "swap_in_no_watermark" else self.mark
        queue = list(self.swapped)
        if self.mistake == "swap_in_newest_first":
            queue.reverse()
        for r in queue:
            if len(self.running) >= self.max_seqs:
                return
            need = self.blocks(self.cpu[r.id])
            if need > self.free - mark:
                if self.mistake == "swap_in_overtakes":
                    continue
                return
            self.swapped.remove(r)
            self.cpu_free += need
            self.free -= need
            self.gpu[r.id] = self.cpu.pop(r.id)
            self.running.append(r)
            plan["in"].append(r.id)
            if self.mistake == "swap_in_decodes":
                plan["decode"].append(r.id)

    # -- admit -----------------------------------------------------------------------------

    def _full(self, plan: dict) -> bool:
        count = len(plan["prefill"]) if self.mistake == "seqs_prefill" else len(self.running)
        return count > self.max_seqs if self.mistake == "seqs_inclusive" else count >= self.max_seqs

    def _length(self, r) -> int:
        """The tokens admission counts, allocates and prefills for ``r``."""
        return r.prompt_len if self.mistake == "admit_prompt_len" else r.context_len

    def _stops(self, r, plan: dict, tokens: int) -> bool:
        """Whether ``r`` does not fit (blocks or token budget); the batch is checked apart."""
        mark = 0 if self.mistake in ("no_watermark", "no_watermark_admit") else self.mark
        if self.blocks(self._length(r)) > self.free - mark:
            return True
        used = tokens + (0 if self.mistake == "budget_no_decode" else len(plan["decode"]))
        if self.mistake == "no_budget":
            return False
        if self.mistake == "budget_strict":
            return used + self._length(r) >= self.max_tokens
        return used + self._length(r) > self.max_tokens

    def _never(self, r) -> bool:
        if self.mistake == "never_rejects":
            return False
        mark = 0 if self.mistake in ("no_watermark", "no_watermark_reject") else self.mark
        return self.blocks(r.prompt_len + r.output_len) > self.total - mark

    def admit(self, plan: dict) -> None:
        tokens = 0  # the prefills' tokens so far
        i = 0
        while i < len(self.waiting):
            r = self.waiting[i]
            if self.mistake == "rejects_late" and self._full(plan):
                return
            if self.mistake == "rejects_after_checks" and (self._full(plan)
                                                     or self._stops(r, plan, tokens)):
                return
            if self._never(r):
                del self.waiting[i]
                plan["rejected"].append(r.id)
                continue
            if self._full(plan):
                return
            if self._stops(r, plan, tokens):
                if self.mistake == "overtakes":
                    i += 1
                    continue
                return
            del self.waiting[i]
            tokens += self._length(r)
            self.free -= self.blocks(self._length(r))
            self.gpu[r.id] = self._length(r)
            self.running.append(r)
            plan["prefill"].append(r.id)

    # -- a step ----------------------------------------------------------------------------

    def state(self) -> dict:
        return {"waiting": [r.id for r in self.waiting], "running": [r.id for r in self.running],
                "swapped": [r.id for r in self.swapped], "free": self.free,
                "cpu_free": self.cpu_free, "kv": {r.id: self.gpu[r.id] for r in self.running}}

    def needs_preemption(self) -> bool:
        """Whether reserving every running request's slot needs more blocks than are free."""
        return sum(self.gpu[r.id] % self.size == 0 for r in self.running) > self.free

    def step(self, swap_in: bool = True) -> dict:
        plan = {"prefill": [], "decode": [], "preempted": [], "out": [], "in": [],
                "rejected": []}
        self.reserve(plan)
        if self.preemption == "swap" and swap_in:
            self.swap_in(plan)
        if not self.swapped:
            self.admit(plan)
        return plan


MODES = ("full", "admit", "no_swap_in")
"""How a scenario is driven: ``full`` calls ``step()``; ``admit`` reserves every running
request's slot by hand and calls ``admit`` alone (the run ends before a step that would have
to preempt); ``no_swap_in`` calls ``reserve_decode_slots`` and ``admit`` the way ``step()``
does, without ``swap_in`` (the run ends before a step that would swap a request back in)."""


def expected_run(specs, num_blocks, block_size, max_seqs, max_tokens, watermark, preemption,
                 cpu_blocks, max_steps, mode="full", mistake=None) -> list[dict]:
    """What the policy does with requests ``specs`` ((prompt_len, output_len), ids in order)
    on a fake engine (every planned request produces one token per step; finished requests
    are freed), step by step, for at most ``max_steps`` steps, driven as ``mode`` says.

    Each step: ``{"swap_full": True}`` and the state where the step raises
    SwapSpaceFullError (the run ends there), else ``{"swap_full": False}``, the step's plan
    (request ids by kind), the state after it (the waiting, running and swapped ids, the
    free GPU and CPU blocks, the tokens each running request holds on the GPU) and the
    requests that finish once it has run."""
    model = _Model(num_blocks, block_size, max_seqs, max_tokens, watermark, preemption,
                   cpu_blocks, mistake)
    requests = [Request(i, prompt, output) for i, (prompt, output) in enumerate(specs)]
    model.waiting.extend(requests)
    steps: list[dict] = []
    while len(steps) < max_steps and (model.waiting or model.running or model.swapped):
        if mode == "admit" and model.needs_preemption():
            break
        try:
            plan = model.step(swap_in=mode != "no_swap_in")
        except SwapFull:
            steps.append({"swap_full": True, **model.state()})
            break
        except _Undefined:
            break
        if mode == "no_swap_in" and model.swapped and _would_swap_in(model):
            break
        step = {"swap_full": False, "plan": plan, **model.state()}
        for request_id in plan["prefill"] + plan["decode"]:
            requests[request_id].generated += 1
        done = [r for r in model.running if r.done]
        for request in done:
            model.running.remove(request)
            model.free += model.blocks(model.gpu.pop(request.id))
        step["finished"] = sorted(r.id for r in done)
        steps.append(step)
        if mode == "admit" and not (model.running or any(plan.values())):
            break  # the head of the queue never fits the budget: every later step is this one
    return steps


def _would_swap_in(model: _Model) -> bool:
    """Whether the step just planned without swap_in would have swapped a request back."""
    if len(model.running) >= model.max_seqs:
        return False
    need = model.blocks(model.cpu[model.swapped[0].id])
    return need <= model.free - model.mark


def known_mistakes(**scenario) -> list[tuple[str, int, list[dict]]]:
    """For each known mistake that changes what happens in ``scenario`` (``expected_run``'s
    arguments): its hint, the first step where it differs from the policy, and its steps up
    to that one."""
    right = expected_run(**scenario)
    found = []
    for name, hint in MISTAKES.items():
        wrong = expected_run(**scenario, mistake=name)
        first = next((i for i, (a, b) in enumerate(zip(right, wrong, strict=False)) if a != b),
                     min(len(right), len(wrong)))
        if first < len(wrong):
            found.append((hint, first, wrong[:first + 1]))
    return found


_HIDDEN = types.SimpleNamespace(expected_run=expected_run, known_mistakes=known_mistakes)


def _harness(cls, specs, num_blocks, block_size, **options) -> _Harness:
    return _Harness(cls, specs, num_blocks, block_size, answers=_HIDDEN, **options)


# -- what the hidden checks draw --------------------------------------------------------------


def _full_length_blocks(specs, size) -> list[int]:
    return [-(-(p + o) // size) for p, o in specs]


@st.composite
def _budgets(draw, specs, floor: int = 1):
    """A token budget: any, or one that a step's prefills meet exactly."""
    prompts = [p for p, _ in specs]
    exact = [sum(prompts[:k]) for k in range(1, len(prompts) + 1)]
    exact += [e + d for e in exact for d in (1, 2)]  # the same with a decode or two
    choices = [b for b in exact if b >= floor]
    if choices and draw(st.booleans()):
        return draw(st.sampled_from(choices))
    return draw(st.integers(floor, max(floor, 4 * max(prompts, default=1))))


_TODOS = ("admit", "reserve_decode_slots", "preempt", "swap_in")


def _one_bug_one_todo(check: Callable[[type], None], cls: type, others: tuple[str, ...]
                      ) -> None:
    """``lending.one_bug_one_todo`` with the course's Scheduler: every scenario runs whole
    steps, so a test of one policy lends the course's ``others`` where the learner's class
    fails it, and an admission mistake costs admission alone. Preemption's test lends
    ``reserve_decode_slots`` only where it fails its own test: choosing the victim is
    written there, and is what preemption's test judges."""
    from course.v0.scheduler import Scheduler as Course

    one_bug_one_todo(check, cls, Course, _TODOS, others)


def _unless_right(todo: str, its_check: Callable[[type], None], cls: type) -> tuple[str, ...]:
    """``(todo,)`` where the learner's ``todo`` fails its own visible test (so its bug is
    charged there, and another test may lend the course's), else nothing."""
    try:
        with verdict_only():
            its_check(cls)
    except AssertionError:
        return (todo,)
    return ()


@thorough
def check_admit_thoroughly(cls: type) -> None:
    """The visible cases, requests preempted by recompute and admitted again, then random
    queues, pools, batch limits, token budgets (met exactly, with decodes in the step) and
    watermarks, admission alone over several steps."""

    @st.composite
    def cases(draw):
        specs = draw(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 12)), max_size=10))
        size = draw(st.sampled_from([1, 2, 4, 16]))
        blocks = draw(st.integers(1, 30))
        return (specs, blocks, size, draw(st.integers(1, 6)), draw(_budgets(specs)),
                draw(st.sampled_from([0.0, 0.1, 0.25])))

    def check(subject: type) -> None:
        check_admit(subject)
        # requests preempted by recompute come back through admission with what they generated
        _harness(subject, [(3, 10)] * 3, 7, 4).drain()

        def run(case) -> None:
            specs, blocks, size, seqs, tokens, mark = case
            _harness(subject, specs, blocks, size, max_seqs=seqs, max_tokens=tokens,
                     watermark=mark, mode="admit").drain()

        for_all(cases(), run, max_examples=150)

    _one_bug_one_todo(check, cls, ("reserve_decode_slots", "preempt", "swap_in"))


@thorough
def check_reserve_decode_slots_thoroughly(cls: type) -> None:
    """The visible case, then random workloads in pools large enough never to preempt, with
    batch limits, token budgets and watermarks."""

    @st.composite
    def cases(draw):
        specs = draw(st.lists(st.tuples(st.integers(1, 20), st.integers(1, 20)), max_size=8))
        size = draw(st.sampled_from([1, 2, 3, 4, 16]))
        longest = max((p + o for p, o in specs), default=1)
        return (specs, size, draw(st.integers(1, 8)), draw(_budgets(specs, floor=longest)),
                draw(st.sampled_from([0.0, 0.1])))

    def check(subject: type) -> None:
        check_reserve_decode_slots(subject)

        def run(case) -> None:
            specs, size, seqs, tokens, mark = case
            blocks = sum(_full_length_blocks(specs, size)) + 1
            _harness(subject, specs, blocks, size, max_seqs=seqs, max_tokens=tokens,
                     watermark=mark).drain()

        for_all(cases(), run, max_examples=100)

    _one_bug_one_todo(check, cls, ("admit", "preempt", "swap_in"))


@st.composite
def _pressure(draw, preemption: str):
    """A workload that outgrows its pool: block size, requests, a pool that holds the longest
    one, a batch limit, a token budget no request outgrows, a watermark, a CPU pool from
    none to room for everyone."""
    size = draw(st.sampled_from([1, 2, 4, 8]))
    specs = draw(st.lists(st.tuples(st.integers(1, 12), st.integers(1, 16)), min_size=1,
                          max_size=8))
    lengths = _full_length_blocks(specs, size)
    mark = draw(st.sampled_from([0.0, 0.0, 0.1, 0.25]))
    floor = max(lengths) + 1 if mark else max(lengths)
    blocks = draw(st.integers(floor, floor * 3))
    seqs = draw(st.sampled_from([256, 256, 2, 3]))
    tokens = draw(_budgets(specs, floor=max(p + o for p, o in specs)))
    room = sum(lengths)
    cpu = draw(st.sampled_from([room, room, 0])) if preemption == "swap" else 0
    if preemption == "swap" and draw(st.booleans()):
        cpu = draw(st.integers(0, room))
    return specs, blocks, size, seqs, tokens, mark, cpu


@thorough
def check_preempt_thoroughly(cls: type) -> None:
    """The visible cases, then random workloads under memory pressure: by recompute to the
    end, and by swap until the first request would come back (with CPU pools from empty to
    room for everyone)."""

    def check(subject: type) -> None:
        check_preempt(subject)

        def run(case, preemption, mode) -> None:
            specs, blocks, size, seqs, tokens, mark, cpu = case
            _harness(subject, specs, blocks, size, max_seqs=seqs, max_tokens=tokens,
                     watermark=mark, preemption=preemption, cpu_blocks=cpu, mode=mode).drain()

        for_all(_pressure("recompute"), lambda c: run(c, "recompute", "full"),
                max_examples=100)
        for_all(_pressure("swap"), lambda c: run(c, "swap", "no_swap_in"), max_examples=60)

    _one_bug_one_todo(check, cls, ("admit", "swap_in") + _unless_right(
        "reserve_decode_slots", check_reserve_decode_slots, cls))


@thorough
def check_swap_in_thoroughly(cls: type) -> None:
    """The visible cases, then random swap workloads: watermarks, batch limits, token budgets
    and CPU pools from empty to room for everyone."""

    def check(subject: type) -> None:
        check_swap_in(subject)

        def run(case) -> None:
            specs, blocks, size, seqs, tokens, mark, cpu = case
            _harness(subject, specs, blocks, size, max_seqs=seqs, max_tokens=tokens,
                     watermark=mark, preemption="swap", cpu_blocks=cpu, steps=MAX_STEPS).drain()

        for_all(_pressure("swap"), run, max_examples=120)

    _one_bug_one_todo(check, cls, ("admit", "reserve_decode_slots", "preempt"))
