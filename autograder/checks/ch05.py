"""Checks for chapter 5, the scheduler.

The learner's ``Scheduler`` class runs on a fake engine (each planned request produces one
token per step; finished requests are freed) and is compared, step by step, with a model of
the policy written with plain counters: which requests are prefilled, decoded, preempted,
swapped and rejected, the order of the queues, and the free blocks. The policy (FCFS, newest
preempted first, reservation before running) is the contract, so the model predicts each step
exactly; which physical blocks are used is never compared. A sentinel pool follows the KV:
every written position carries a (request, position) marker, the harness performs every swap
copy the plan lists, and each running request must read back its own markers.
"""

from __future__ import annotations

from collections import deque

from hypothesis import strategies as st

from autograder.checks._helpers import for_all, not_written
from course.scheduler import Request, SwapSpaceFullError

SUBJECT = "Scheduler"

_POLICY = ("Each step: first reserve the next slot of every running request, oldest first, "
           "preempting the most recently admitted request while the pool is out of blocks "
           "(recompute: free it and put it back at the front of the waiting queue; swap: copy "
           "its blocks to the CPU pool and free them on the GPU); then swap requests back in, "
           "oldest first; then admit waiting requests first come first served while they fit "
           "above the watermark, the batch limit and the token budget.")


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


class _Harness:
    def __init__(self, cls, requests, num_blocks, block_size, max_seqs=256, max_tokens=8192,
                 watermark=0.0, preemption="recompute", cpu_blocks=0):
        args = dict(num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_seqs,
                    max_num_batched_tokens=max_tokens, watermark=watermark,
                    preemption=preemption, cpu_blocks=cpu_blocks)
        self.log = ["s = Scheduler(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")"]
        self.s = cls(**args)
        self.model = _Model(num_blocks, block_size, max_seqs, max_tokens, watermark,
                            preemption, cpu_blocks)
        self.requests = {}
        for r in requests:
            mine = Request(r.id, r.prompt_len, r.output_len)
            twin = Request(r.id, r.prompt_len, r.output_len)
            self.requests[r.id] = (mine, twin)
            self.s.add(mine)
            self.model.waiting.append(twin)
            self.log.append(f"s.add(Request({r.id}, prompt_len={r.prompt_len}, "
                            f"output_len={r.output_len}))")
        self.gpu: dict[int, tuple] = {}  # fake KV pools: slot -> marker
        self.cpu: dict[int, tuple] = {}
        self.finished: set[int] = set()

    def fail(self, problem: str, idea: str = _POLICY) -> None:
        steps = "; ".join(self.log[-10:])
        raise AssertionError(f"After {'... ' if len(self.log) > 10 else ''}{steps}: {problem} "
                             f"{idea}")

    def step(self) -> None:
        self.log.append("s.step()")
        try:
            plan = self.s.step()
        except NotImplementedError:
            raise AssertionError(not_written("a Scheduler method")) from None
        except SwapSpaceFullError:
            try:
                self.model.step()
            except SwapSpaceFullError:
                return
            self.fail("it raised SwapSpaceFullError, but the CPU pool had room.")
        except Exception as exc:
            self.fail(f"step() raised {type(exc).__name__}: {exc}.")
        expected = self.model.step()
        got = {"prefill": [r.id for r in plan.prefill], "decode": [r.id for r in plan.decode],
               "preempted": [r.id for r in plan.preempted],
               "out": [r.id for r, _ in plan.swapped_out],
               "in": [r.id for r, _ in plan.swapped_in],
               "rejected": [r.id for r, _ in plan.rejected]}
        self._compare(got, expected, plan)
        self._run(plan)

    def _compare(self, got: dict, expected: dict, plan) -> None:
        back = set(got["in"]) | set(got["prefill"])  # a victim may return in the same step
        for victim in plan.preempted:
            if victim.id in self.s.gpu.tables and victim.id not in back:
                self.fail(f"request {victim.id} was preempted but still holds GPU blocks.",
                          "Every block a preempted or swapped-out request held goes back to "
                          "the GPU pool.")
        if got["preempted"] != expected["preempted"]:
            running = [r.id for r in self.s.running]
            self.fail(f"it preempted {got['preempted']}, expected {expected['preempted']}.",
                      "Preempt the most recently admitted running request (the newest), never "
                      f"the oldest. (Running now, oldest first: {running}.)")
        ran_unreserved = set(got["decode"]) & set(got["preempted"])
        if ran_unreserved:
            self.fail(f"request(s) {sorted(ran_unreserved)} were preempted yet are in the "
                      "step's decode batch.", "Reserve first, then run: a step never runs a "
                      "request whose blocks it does not hold.")
        if got["rejected"] != expected["rejected"]:
            self.fail(f"it rejected {got['rejected']}, expected {expected['rejected']}.",
                      "A request longer than the whole pool (above the watermark) can never "
                      "fit: reject it with a reason, or it blocks the queue forever.")
        for key, label in [("decode", "decoded"), ("prefill", "prefilled"),
                           ("out", "swapped out"), ("in", "swapped in"),
                           ("rejected", "rejected")]:
            if got[key] != expected[key]:
                self.fail(f"the step {label} {got[key]}, expected {expected[key]}.",
                          _POLICY + " Admission is first come, first served: a request that "
                          "does not fit stops it; nothing behind it overtakes.")
        waiting = [r.id for r in self.s.waiting]
        if waiting != [r.id for r in self.model.waiting]:
            self.fail(f"the waiting queue is {waiting}, expected "
                      f"{[r.id for r in self.model.waiting]}.",
                      "A request preempted by recompute goes back to the front of the waiting "
                      "queue (it arrived before everything still waiting).")
        if self.s.gpu.num_free_blocks() != self.model.free:
            self.fail(f"{self.s.gpu.num_free_blocks()} GPU blocks are free, expected "
                      f"{self.model.free}.", "Every block a preempted or swapped-out request "
                      "held goes back to the GPU pool.")
        for request in plan.decode + plan.prefill:
            if request.id not in self.s.gpu.tables:
                self.fail(f"request {request.id} runs without blocks.",
                          "Reserve first, then run: a step never runs a request whose blocks "
                          "it does not hold.")
            if self.s.gpu.seq_len(request.id) != self.model.kv[request.id]:
                self.fail(f"request {request.id} holds {self.s.gpu.seq_len(request.id)} slots,"
                          f" expected {self.model.kv[request.id]}.",
                          "Reserve the slot of every running request's next token before "
                          "the step runs.")

    def _run(self, plan) -> None:
        size = self.s.block_size
        for _, mapping in plan.swapped_out:  # the engine copies GPU -> CPU
            for gpu_block, cpu_block in mapping:
                for o in range(size):
                    self.cpu[cpu_block * size + o] = self.gpu.get(gpu_block * size + o)
        for _, mapping in plan.swapped_in:
            for cpu_block, gpu_block in mapping:
                for o in range(size):
                    self.gpu[gpu_block * size + o] = self.cpu.get(cpu_block * size + o)
        for request in plan.prefill:
            table = self.s.gpu.block_table(request.id)
            for p in range(request.context_len):
                self.gpu[table[p // size] * size + p % size] = (request.id, p)
        for request in plan.decode:
            table, p = self.s.gpu.block_table(request.id), self.s.gpu.seq_len(request.id) - 1
            self.gpu[table[p // size] * size + p % size] = (request.id, p)
        for request in plan.prefill + plan.decode:
            request.generated += 1
            self.requests[request.id][1].generated += 1
        for request in list(self.s.running):
            table = self.s.gpu.block_table(request.id)
            for p in range(self.s.gpu.seq_len(request.id)):
                found = self.gpu.get(table[p // size] * size + p % size)
                if found != (request.id, p):
                    self.fail(f"request {request.id}'s position {p} reads {found}.",
                              "Swapping out and back in must preserve each request's KV: copy "
                              "every block the plan lists.")
        for request in [r for r in list(self.s.running) if r.done]:
            self.s.finish(request)
            twin = self.requests[request.id][1]
            self.model.running.remove(twin)
            self.model.free += self.model.held.pop(twin.id)
            del self.model.kv[twin.id]
            self.finished.add(request.id)
            self.log.append(f"s.finish({request.id})")

    def drain(self, max_steps: int = 2000) -> None:
        for _ in range(max_steps):
            if not (self.s.waiting or self.s.running or self.s.swapped):
                break
            self.step()
        else:
            self.fail("requests were still waiting after many steps: something waits forever.")
        for mine, _ in self.requests.values():
            if mine.id in self.finished and mine.generated != mine.output_len:
                self.fail(f"request {mine.id} produced {mine.generated} tokens, expected "
                          f"{mine.output_len}.")
        if self.s.gpu.num_free_blocks() != self.s.gpu.num_blocks:
            self.fail("blocks are still held after every request finished (a leak).")

    def admit_only(self) -> None:
        """One admission on an idle scheduler (the other steps are not written yet)."""
        from course.scheduler import StepPlan

        self.log.append("s.admit(plan)")
        plan = StepPlan()
        try:
            self.s.admit(plan)
        except NotImplementedError:
            raise AssertionError(not_written("admit")) from None
        except Exception as exc:
            self.fail(f"admit raised {type(exc).__name__}: {exc}.")
        expected = self.model.step()
        got = {"prefill": [r.id for r in plan.prefill], "decode": [], "preempted": [],
               "out": [], "in": [], "rejected": [r.id for r, _ in plan.rejected]}
        self._compare(got, expected, plan)


def _requests(specs: list[tuple[int, int]]) -> list[Request]:
    return [Request(i, prompt, output) for i, (prompt, output) in enumerate(specs)]


def check_admit(cls: type) -> None:
    """10 blocks of 4: FCFS admission until a prompt does not fit (no overtaking), at most
    max_num_seqs requests, the token budget, and a request too long for the whole pool is
    rejected rather than left waiting."""
    _Harness(cls, _requests([(8, 2), (12, 2), (24, 2), (4, 2)]), 10, 4).admit_only()
    _Harness(cls, _requests([(3, 1)] * 5), 10, 4, max_seqs=3).admit_only()
    _Harness(cls, _requests([(30, 1), (30, 1), (3, 1)]), 40, 4, max_tokens=64).admit_only()
    _Harness(cls, _requests([(50, 2), (4, 2)]), 10, 4).admit_only()


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
        _Harness(cls, _requests(specs), blocks, size, seqs, tokens, mark).admit_only()

    for_all(cases(), run, max_examples=150)


def check_reserve_decode_slots(cls: type) -> None:
    """Three requests decode to completion in a pool with room for all: every step reserves
    each running request's next slot, oldest first, before it runs."""
    h = _Harness(cls, _requests([(3, 6), (4, 3), (1, 9)]), 12, 4)
    h.drain()


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
        _Harness(cls, _requests(specs), blocks, size, max_seqs=seqs).drain()

    for_all(cases(), run, max_examples=100)


def check_preempt(cls: type) -> None:
    """A pool too small for three growing requests: the newest is preempted by recompute
    (back to the front of the queue); every request still finishes with exactly its tokens,
    and no block leaks. (Swap is checked with swap_in.)"""
    _Harness(cls, _requests([(3, 10), (3, 10), (3, 10)]), 7, 4).drain()


def check_preempt_thoroughly(cls: type) -> None:
    """The visible case, then random workloads under memory pressure, by recompute."""
    check_preempt(cls)
    _stateful_drain(cls, max_examples=120, preemption="recompute")


def check_swap_in(cls: type) -> None:
    """Preemption by swap: victims go to the CPU pool, give their GPU blocks back, and come
    back oldest first when their blocks fit, with their KV intact (the sentinel reads each
    position back)."""
    _Harness(cls, _requests([(3, 10), (3, 10), (3, 10)]), 7, 4, preemption="swap",
             cpu_blocks=8).drain()
    specs = [(4, 12), (4, 12), (4, 12), (4, 12)]
    _Harness(cls, _requests(specs), 9, 4, preemption="swap", cpu_blocks=12).drain()


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
        _Harness(cls, _requests(specs), blocks, size, preemption=mode, cpu_blocks=cpu).drain()

    for_all(cases(), run, max_examples=max_examples)
