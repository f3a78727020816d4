"""Chapter 5's hidden checks: random queues, pools, limits and watermarks for admission, and
random workloads under memory pressure, by recompute and by swap, each driven step by step
against a model of the policy written with plain counters (blocks per request, free blocks,
the three queues). The visible checks ask the model's steps of ``expected_run`` here.
"""

from __future__ import annotations

from collections import deque

from hypothesis import strategies as st

from autograder.checks._helpers import for_all
from autograder.checks.ch05 import (
    MAX_STEPS,
    _Harness,
    check_admit,
    check_preempt,
    check_reserve_decode_slots,
    check_swap_in,
)
from autograder.private import thorough
from course.scheduler import Request, SwapSpaceFullError


class _Model:
    """The policy with counters: blocks per request, free blocks, the three queues."""

    def __init__(self, num_blocks, block_size, max_seqs, max_tokens, watermark, preemption,
                 cpu_blocks):
        self.size, self.total, self.free = block_size, num_blocks, num_blocks
        self.max_seqs, self.max_tokens = max_seqs, max_tokens
        self.mark = int(num_blocks * watermark)
        self.preemption, self.cpu_free = preemption, cpu_blocks
        self.held: dict[int, int] = {}  # GPU blocks per running request
        self.cpu_held: dict[int, int] = {}
        self.kv: dict[int, int] = {}  # tokens with KV on the GPU (or CPU when swapped)
        self.waiting: deque = deque()
        self.running: list = []
        self.swapped: deque = deque()

    def blocks(self, tokens: int) -> int:
        return -(-tokens // self.size)

    def step(self) -> dict:
        plan = {"prefill": [], "decode": [], "preempted": [], "out": [], "in": [],
                "rejected": []}
        i = 0
        while i < len(self.running):
            r = self.running[i]
            if self.kv[r.id] % self.size == 0:  # needs a new block
                if self.free == 0:
                    victim = self.running.pop()
                    plan["preempted"].append(victim.id)
                    if self.preemption == "swap":
                        if self.blocks(self.kv[victim.id]) > self.cpu_free:
                            raise SwapSpaceFullError
                        self.cpu_free -= self.blocks(self.kv[victim.id])
                        self.cpu_held[victim.id] = self.blocks(self.kv[victim.id])
                        plan["out"].append(victim.id)
                        self.swapped.append(victim)
                    else:
                        del self.kv[victim.id]
                        self.waiting.appendleft(victim)
                    self.free += self.held.pop(victim.id)
                    if victim is r:
                        break
                    continue
                self.free -= 1
                self.held[r.id] += 1
            self.kv[r.id] += 1
            plan["decode"].append(r.id)
            i += 1
        if self.preemption == "swap":
            while self.swapped and len(self.running) < self.max_seqs:
                r = self.swapped[0]
                need = self.cpu_held[r.id]
                if need > self.free - self.mark:
                    break
                self.swapped.popleft()
                self.cpu_free += self.cpu_held.pop(r.id)
                self.free -= need
                self.held[r.id] = need
                self.running.append(r)
                plan["in"].append(r.id)
        if not self.swapped:
            tokens = 0
            while self.waiting and len(self.running) < self.max_seqs:
                r = self.waiting[0]
                if self.blocks(r.prompt_len + r.output_len) > self.total - self.mark:
                    self.waiting.popleft()
                    plan["rejected"].append(r.id)
                    continue
                need = self.blocks(r.context_len)
                if need > self.free - self.mark or tokens + r.context_len + len(
                        plan["decode"]) > self.max_tokens:
                    break
                tokens += r.context_len
                self.waiting.popleft()
                self.free -= need
                self.held[r.id] = need
                self.kv[r.id] = r.context_len
                self.running.append(r)
                plan["prefill"].append(r.id)
        return plan


def expected_run(specs, num_blocks, block_size, max_seqs, max_tokens, watermark, preemption,
                 cpu_blocks, max_steps) -> list[dict]:
    """What the policy does with requests ``specs`` ((prompt_len, output_len), ids in order)
    on a fake engine (every planned request produces one token per step; finished requests
    are freed), step by step, for at most ``max_steps`` steps: ``{"swap_full": True}`` where
    the step raises SwapSpaceFullError, else the step's plan (request ids by kind), the
    waiting queue, the free GPU blocks and the tokens each request holds after it, and the
    requests that finish once it has run."""
    model = _Model(num_blocks, block_size, max_seqs, max_tokens, watermark, preemption,
                   cpu_blocks)
    requests = [Request(i, prompt, output) for i, (prompt, output) in enumerate(specs)]
    model.waiting.extend(requests)
    steps: list[dict] = []
    while len(steps) < max_steps and (model.waiting or model.running or model.swapped):
        try:
            plan = model.step()
        except SwapSpaceFullError:
            steps.append({"swap_full": True})
            continue
        step = {"swap_full": False, "plan": plan, "waiting": [r.id for r in model.waiting],
                "free": model.free, "kv": dict(model.kv)}
        for request_id in plan["prefill"] + plan["decode"]:
            requests[request_id].generated += 1
        done = [r for r in model.running if r.done]
        for request in done:
            model.running.remove(request)
            model.free += model.held.pop(request.id)
            del model.kv[request.id]
        step["finished"] = sorted(r.id for r in done)
        steps.append(step)
    return steps


@thorough
def check_admit_thoroughly(cls: type) -> None:
    """The visible cases, then random queues, pools, limits and watermarks."""
    check_admit(cls)

    @st.composite
    def cases(draw):
        specs = draw(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 20)), max_size=12))
        return (specs, draw(st.integers(1, 20)), draw(st.sampled_from([1, 2, 4, 16])),
                draw(st.integers(1, 8)), draw(st.integers(8, 200)),
                draw(st.sampled_from([0.0, 0.1])))

    def run(case) -> None:
        specs, blocks, size, seqs, tokens, mark = case
        _Harness(cls, specs, blocks, size, seqs, tokens, mark, steps=1,
                 oracle=expected_run).admit_only()

    for_all(cases(), run, max_examples=150)


@thorough
def check_reserve_decode_slots_thoroughly(cls: type) -> None:
    """The visible case, then random workloads in pools large enough never to preempt."""
    check_reserve_decode_slots(cls)

    @st.composite
    def cases(draw):
        specs = draw(st.lists(st.tuples(st.integers(1, 20), st.integers(1, 20)), max_size=8))
        return specs, draw(st.sampled_from([1, 2, 3, 4, 16])), draw(st.integers(1, 8))

    def run(case) -> None:
        specs, size, seqs = case
        blocks = sum(-(-(p + o) // size) for p, o in specs) + 1
        _Harness(cls, specs, blocks, size, max_seqs=seqs, oracle=expected_run).drain()

    for_all(cases(), run, max_examples=100)


@thorough
def check_preempt_thoroughly(cls: type) -> None:
    """The visible case, then random workloads under memory pressure, by recompute."""
    check_preempt(cls)
    _stateful_drain(cls, max_examples=120, preemption="recompute")


@thorough
def check_swap_in_thoroughly(cls: type) -> None:
    """The visible case, then random swap workloads."""
    check_swap_in(cls)
    _stateful_drain(cls, max_examples=120, preemption="swap")


def _stateful_drain(cls: type, max_examples: int, preemption: str | None = None) -> None:
    @st.composite
    def cases(draw):
        size = draw(st.sampled_from([1, 2, 4, 8]))
        specs = draw(st.lists(st.tuples(st.integers(1, 12), st.integers(1, 16)), min_size=1,
                              max_size=8))
        longest = max(-(-(p + o) // size) for p, o in specs)
        blocks = draw(st.integers(longest, longest * 3))
        mode = preemption or draw(st.sampled_from(["recompute", "swap"]))
        return specs, blocks, size, mode

    def run(case) -> None:
        specs, blocks, size, mode = case
        cpu = sum(-(-(p + o) // size) for p, o in specs)  # room to swap everyone out
        _Harness(cls, specs, blocks, size, preemption=mode, cpu_blocks=cpu,
                 steps=MAX_STEPS, oracle=expected_run).drain()

    for_all(cases(), run, max_examples=max_examples)
