"""Visible checks for chapter 5, the scheduler.

The learner's ``Scheduler`` class runs on a fake engine (each planned request produces one
token per step; finished requests are freed) and is compared, step by step, with what the
policy does on the same scenario: which requests are prefilled, decoded, preempted, swapped
and rejected, the order of the waiting queue, and the free blocks. The policy (FCFS, newest
preempted first, reservation before running) is the contract, so each step is predicted
exactly; which physical blocks are used is never compared. The expected steps come from the
chapter's hidden module (``autograder.private``), asked once per scenario before the
learner's class runs; the thorough checks are there too. A sentinel pool follows the KV:
every written position carries a (request, position) marker, the harness performs every swap
copy the plan lists, and each running request must read back its own markers.
"""

from __future__ import annotations

from collections.abc import Callable

from autograder.checks._helpers import not_written
from autograder.private import private, visible
from course.scheduler import Request, StepPlan, SwapSpaceFullError

SUBJECT = "Scheduler"

MAX_STEPS = 2000  # a scenario that has not drained by then waits forever

_POLICY = ("Each step: first reserve the next slot of every running request, oldest first, "
           "preempting the most recently admitted request while the pool is out of blocks "
           "(recompute: free it and put it back at the front of the waiting queue; swap: copy "
           "its blocks to the CPU pool and free them on the GPU); then swap requests back in, "
           "oldest first; then admit waiting requests first come first served while they fit "
           "above the watermark, the batch limit and the token budget.")

_KINDS = ("prefill", "decode", "preempted", "out", "in", "rejected")


class _Harness:
    """The learner's class on a fake engine, against the expected steps of the scenario.

    ``oracle`` says what the policy does, step by step (the hidden module's
    ``expected_run``, asked through ``private`` unless given): a list of steps, each
    ``{"swap_full": True}`` where the step must raise SwapSpaceFullError, else the step's
    plan (request ids by kind), the waiting queue and the free GPU blocks after it, the
    tokens each request holds, and the requests that finish once it has run.
    """

    def __init__(self, cls, specs, num_blocks, block_size, max_seqs=256, max_tokens=8192,
                 watermark=0.0, preemption="recompute", cpu_blocks=0, steps=MAX_STEPS,
                 oracle: Callable | None = None):
        specs = [tuple(spec) for spec in specs]
        ask = oracle or private("05").expected_run  # asked first, whatever the class does
        self.expected = ask(specs=specs, num_blocks=num_blocks, block_size=block_size,
                            max_seqs=max_seqs, max_tokens=max_tokens, watermark=watermark,
                            preemption=preemption, cpu_blocks=cpu_blocks, max_steps=steps)
        self.idle = {"swap_full": False, "plan": {k: [] for k in _KINDS}, "waiting": [],
                     "free": num_blocks, "kv": {}, "finished": []}  # after the last step
        self.index = 0
        args = dict(num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_seqs,
                    max_num_batched_tokens=max_tokens, watermark=watermark,
                    preemption=preemption, cpu_blocks=cpu_blocks)
        self.log = ["s = Scheduler(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")"]
        self.s = cls(**args)
        self.requests = {}
        for i, (prompt, output) in enumerate(specs):
            request = Request(i, prompt, output)
            self.requests[i] = request
            self.s.add(request)
            self.log.append(f"s.add(Request({i}, prompt_len={prompt}, output_len={output}))")
        self.gpu: dict[int, tuple] = {}  # fake KV pools: slot -> marker
        self.cpu: dict[int, tuple] = {}
        self.finished: set[int] = set()

    def fail(self, problem: str, idea: str = _POLICY) -> None:
        steps = "; ".join(self.log[-10:])
        raise AssertionError(f"After {'... ' if len(self.log) > 10 else ''}{steps}: {problem} "
                             f"{idea}")

    def _next(self) -> dict:
        expected = self.expected[self.index] if self.index < len(self.expected) else self.idle
        self.index += 1
        return expected

    def step(self) -> None:
        self.log.append("s.step()")
        expected = self._next()
        try:
            plan = self.s.step()
        except NotImplementedError:
            raise AssertionError(not_written("a Scheduler method")) from None
        except SwapSpaceFullError:
            if expected["swap_full"]:
                return
            self.fail("it raised SwapSpaceFullError, but the CPU pool had room.")
        except Exception as exc:
            self.fail(f"step() raised {type(exc).__name__}: {exc}.")
        if expected["swap_full"]:
            self.fail("it swapped a request out, but the CPU pool had no room for its blocks: "
                      "raise SwapSpaceFullError.")
        got = {"prefill": [r.id for r in plan.prefill], "decode": [r.id for r in plan.decode],
               "preempted": [r.id for r in plan.preempted],
               "out": [r.id for r, _ in plan.swapped_out],
               "in": [r.id for r, _ in plan.swapped_in],
               "rejected": [r.id for r, _ in plan.rejected]}
        self._compare(got, expected, plan)
        self._run(plan, expected)

    def _compare(self, got: dict, expected: dict, plan) -> None:
        want = expected["plan"]
        back = set(got["in"]) | set(got["prefill"])  # a victim may return in the same step
        for victim in plan.preempted:
            if victim.id in self.s.gpu.tables and victim.id not in back:
                self.fail(f"request {victim.id} was preempted but still holds GPU blocks.",
                          "Every block a preempted or swapped-out request held goes back to "
                          "the GPU pool.")
        if got["preempted"] != want["preempted"]:
            running = [r.id for r in self.s.running]
            self.fail(f"it preempted {got['preempted']}, expected {want['preempted']}.",
                      "Preempt the most recently admitted running request (the newest), never "
                      f"the oldest. (Running now, oldest first: {running}.)")
        ran_unreserved = set(got["decode"]) & set(got["preempted"])
        if ran_unreserved:
            self.fail(f"request(s) {sorted(ran_unreserved)} were preempted yet are in the "
                      "step's decode batch.", "Reserve first, then run: a step never runs a "
                      "request whose blocks it does not hold.")
        if got["rejected"] != want["rejected"]:
            self.fail(f"it rejected {got['rejected']}, expected {want['rejected']}.",
                      "A request longer than the whole pool (above the watermark) can never "
                      "fit: reject it with a reason, or it blocks the queue forever.")
        for key, label in [("decode", "decoded"), ("prefill", "prefilled"),
                           ("out", "swapped out"), ("in", "swapped in"),
                           ("rejected", "rejected")]:
            if got[key] != want[key]:
                self.fail(f"the step {label} {got[key]}, expected {want[key]}.",
                          _POLICY + " Admission is first come, first served: a request that "
                          "does not fit stops it; nothing behind it overtakes.")
        waiting = [r.id for r in self.s.waiting]
        if waiting != expected["waiting"]:
            self.fail(f"the waiting queue is {waiting}, expected {expected['waiting']}.",
                      "A request preempted by recompute goes back to the front of the waiting "
                      "queue (it arrived before everything still waiting).")
        if self.s.gpu.num_free_blocks() != expected["free"]:
            self.fail(f"{self.s.gpu.num_free_blocks()} GPU blocks are free, expected "
                      f"{expected['free']}.", "Every block a preempted or swapped-out request "
                      "held goes back to the GPU pool.")
        for request in plan.decode + plan.prefill:
            if request.id not in self.s.gpu.tables:
                self.fail(f"request {request.id} runs without blocks.",
                          "Reserve first, then run: a step never runs a request whose blocks "
                          "it does not hold.")
            if self.s.gpu.seq_len(request.id) != expected["kv"][request.id]:
                self.fail(f"request {request.id} holds {self.s.gpu.seq_len(request.id)} slots,"
                          f" expected {expected['kv'][request.id]}.",
                          "Reserve the slot of every running request's next token before "
                          "the step runs.")

    def _run(self, plan, expected: dict) -> None:
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
        for request in list(self.s.running):
            table = self.s.gpu.block_table(request.id)
            for p in range(self.s.gpu.seq_len(request.id)):
                found = self.gpu.get(table[p // size] * size + p % size)
                if found != (request.id, p):
                    self.fail(f"request {request.id}'s position {p} reads {found}.",
                              "Swapping out and back in must preserve each request's KV: copy "
                              "every block the plan lists.")
        done = [r for r in list(self.s.running) if r.done]
        if sorted(r.id for r in done) != expected["finished"]:
            self.fail(f"the running requests that are done are {sorted(r.id for r in done)}, "
                      f"expected {expected['finished']}.", "A request stays in running from "
                      "its admission until the engine finishes it, unless it is preempted.")
        for request in done:
            self.s.finish(request)
            self.finished.add(request.id)
            self.log.append(f"s.finish({request.id})")

    def drain(self, max_steps: int = MAX_STEPS) -> None:
        for _ in range(max_steps):
            if not (self.s.waiting or self.s.running or self.s.swapped):
                break
            self.step()
        else:
            self.fail("requests were still waiting after many steps: something waits forever.")
        for mine in self.requests.values():
            if mine.id in self.finished and mine.generated != mine.output_len:
                self.fail(f"request {mine.id} produced {mine.generated} tokens, expected "
                          f"{mine.output_len}.")
        if self.s.gpu.num_free_blocks() != self.s.gpu.num_blocks:
            self.fail("blocks are still held after every request finished (a leak).")

    def admit_only(self) -> None:
        """One admission on an idle scheduler (the other steps are not written yet)."""
        self.log.append("s.admit(plan)")
        expected = self._next()
        plan = StepPlan()
        try:
            self.s.admit(plan)
        except NotImplementedError:
            raise AssertionError(not_written("admit")) from None
        except Exception as exc:
            self.fail(f"admit raised {type(exc).__name__}: {exc}.")
        got = {"prefill": [r.id for r in plan.prefill], "decode": [], "preempted": [],
               "out": [], "in": [], "rejected": [r.id for r, _ in plan.rejected]}
        self._compare(got, expected, plan)


@visible
def check_admit(cls: type) -> None:
    """10 blocks of 4: FCFS admission until a prompt does not fit (no overtaking), at most
    max_num_seqs requests, the token budget, and a request too long for the whole pool is
    rejected rather than left waiting."""
    _Harness(cls, [(8, 2), (12, 2), (24, 2), (4, 2)], 10, 4, steps=1).admit_only()
    _Harness(cls, [(3, 1)] * 5, 10, 4, max_seqs=3, steps=1).admit_only()
    _Harness(cls, [(30, 1), (30, 1), (3, 1)], 40, 4, max_tokens=64, steps=1).admit_only()
    _Harness(cls, [(50, 2), (4, 2)], 10, 4, steps=1).admit_only()


@visible
def check_reserve_decode_slots(cls: type) -> None:
    """Three requests decode to completion in a pool with room for all: every step reserves
    each running request's next slot, oldest first, before it runs."""
    _Harness(cls, [(3, 6), (4, 3), (1, 9)], 12, 4).drain()


@visible
def check_preempt(cls: type) -> None:
    """A pool too small for three growing requests: the newest is preempted by recompute
    (back to the front of the queue); every request still finishes with exactly its tokens,
    and no block leaks. (Swap is checked with swap_in.)"""
    _Harness(cls, [(3, 10), (3, 10), (3, 10)], 7, 4).drain()


@visible
def check_swap_in(cls: type) -> None:
    """Preemption by swap: victims go to the CPU pool, give their GPU blocks back, and come
    back oldest first when their blocks fit, with their KV intact (the sentinel reads each
    position back)."""
    _Harness(cls, [(3, 10), (3, 10), (3, 10)], 7, 4, preemption="swap", cpu_blocks=8).drain()
    _Harness(cls, [(4, 12)] * 4, 9, 4, preemption="swap", cpu_blocks=12).drain()
