"""Visible checks for chapter 5, the scheduler.

The learner's ``Scheduler`` class runs on a fake engine (each planned request produces one
token per step; finished requests are freed) and is compared, step by step, with what the
policy does on the same scenario: which requests are prefilled, decoded, preempted, swapped
and rejected, the waiting, running and swapped queues, and the free blocks on the GPU and
the CPU. The policy (FCFS, newest preempted first, reservation before running) is the
contract, so each step is predicted exactly; which physical blocks are used is never
compared. The expected steps, and the steps of the known mistakes (each with the hint that
names it), come from the chapter's hidden module (``autograder.private``), asked once per
scenario before the learner's class runs; the thorough checks are there too. A sentinel pool
follows the KV: every written position carries a (request, position) marker, the harness
performs every swap copy the plan lists, and each running request must read back its own
markers.

Where a check's scenario fails and an earlier TODO it runs fails its own visible cases, the
hint says to fix that TODO first ("fix admit first") only where the scenario passes with the
course's version of it lent (``_harness.blame_where_due``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autograder.checks._harness import Harness, blame_where_due
from autograder.checks._helpers import not_written
from autograder.private import private, visible
from course.v0.scheduler import Request, StepPlan, SwapSpaceFullError

SUBJECT = "Scheduler"

MAX_STEPS = 2000  # a scenario that has not drained by then waits forever

TODOS = ("admit", "reserve_decode_slots", "preempt", "swap_in")

_KINDS = ("prefill", "decode", "preempted", "out", "in", "rejected")

# What the first field that differs says about the policy, when no known mistake matches.
_IDEAS = {
    "preempted": "A request is preempted only when a running request needs a block and none "
                 "is free, and the victim is the newest running request.",
    "decode": "Every running request reserves its next slot, oldest first, and joins "
              "plan.decode once it holds it.",
    "out": "A request preempted by swap is listed in plan.swapped_out with its (gpu_block, "
           "cpu_block) pairs.",
    "in": "Swapped requests come back in the order they were swapped out, while running has "
          "room and their blocks fit in the free blocks less the watermark.",
    "rejected": "A request whose full length needs more blocks than the pool holds above the "
                "watermark is rejected when it reaches the head of the waiting queue.",
    "prefill": "Admission takes the head of the waiting queue while it fits (running below "
               "max_num_seqs, its blocks above the watermark, the token budget) and stops at "
               "the first that does not.",
    "waiting": "The waiting queue loses the requests admitted or rejected from its head; a "
               "request preempted by recompute goes back to its front.",
    "running": "running keeps admission order: admitted and swapped-in requests join its end; "
               "preempted and finished ones leave it.",
    "swapped": "swapped keeps the order requests were swapped out in; a request leaves it "
               "when it is swapped back in.",
    "free": "A block is taken by an admission, a reservation that starts a new block or a "
            "swap-in, and given back by a preemption (recompute or swap) or a finished "
            "request.",
    "cpu_free": "A swapped-out request holds CPU blocks for its KV until it is swapped back "
                "in.",
    "kv": "After reservation a running request holds the KV slots of its whole context "
          "(context_len).",
}
_SWAP_FULL = ("A victim whose KV does not fit in the free CPU blocks raises "
              "SwapSpaceFullError (the CPU pool is too small for this workload), and nothing "
              "changes.")


class _Harness(Harness):
    """The learner's class on a fake engine, against the expected steps of the scenario.

    ``answers`` says what the policy does (the hidden module's ``expected_run``, and
    ``known_mistakes`` for the hints; asked through ``private`` unless given). ``mode``:
    ``full`` calls ``step()``; ``admit`` reserves every running request's slot itself and
    calls ``admit`` alone; ``no_swap_in`` calls ``reserve_decode_slots`` and ``admit`` as
    ``step()`` does, without ``swap_in``. A scenario in the last two modes ends where the
    expected steps end.
    """

    def __init__(self, cls, specs, num_blocks, block_size, max_seqs=256, max_tokens=8192,
                 watermark=0.0, preemption="recompute", cpu_blocks=0, steps=MAX_STEPS,
                 mode="full", answers: Any = None, blame: str | None = None):
        super().__init__(blame)
        specs = [tuple(spec) for spec in specs]
        ask = answers or private("05")  # asked first, whatever the class does
        scenario = dict(specs=specs, num_blocks=num_blocks, block_size=block_size,
                        max_seqs=max_seqs, max_tokens=max_tokens, watermark=watermark,
                        preemption=preemption, cpu_blocks=cpu_blocks, max_steps=steps,
                        mode=mode)
        self.expected = ask.expected_run(**scenario)
        self.mistakes = ask.known_mistakes(**scenario)
        self.mode, self.max_steps = mode, steps
        self.index, self.stopped = 0, False
        args = dict(num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_seqs,
                    max_num_batched_tokens=max_tokens, watermark=watermark,
                    preemption=preemption, cpu_blocks=cpu_blocks)
        self.setup = ["s = Scheduler(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")"]
        self.s = cls(**args)
        self.requests = {}
        for i, (prompt, output) in enumerate(specs):
            request = Request(i, prompt, output)
            self.requests[i] = request
            self.s.add(request)
            self.setup.append(f"s.add(Request({i}, prompt_len={prompt}, output_len={output}))")
        self.gpu: dict[int, tuple] = {}  # fake KV pools: slot -> marker
        self.cpu: dict[int, tuple] = {}
        self.finished: set[int] = set()

    # -- wording -----------------------------------------------------------------------------

    def operations(self) -> str:
        """The scenario so far, runs of the same call counted."""
        runs: list[list] = []
        for op in self.log:
            if runs and runs[-1][0] == op:
                runs[-1][1] += 1
            else:
                runs.append([op, 1])
        steps = [op if n == 1 else f"{op} (x{n})" for op, n in runs]
        if len(steps) > 12:
            steps = ["..."] + steps[-10:]
        return "; ".join(self.setup + steps)

    def _idea(self, observed: dict, field: str) -> str:
        """The hint of every known mistake that does exactly what the class did in this
        step, else what the first field that differs is about."""
        keys = ("swap_full", "plan", "waiting", "running", "swapped", "free", "cpu_free", "kv")
        found = []
        for hint, first, steps in self.mistakes:
            if first == self.index and all(steps[first].get(k) == observed.get(k)
                                           for k in keys) and hint not in found:
                found.append(hint)
        if found:
            return " ".join(found)
        return _IDEAS.get(field, "")

    # -- one step ----------------------------------------------------------------------------

    def _expected(self) -> dict:
        if self.index < len(self.expected):
            return self.expected[self.index]
        return {"swap_full": False, "plan": {k: [] for k in _KINDS}, "waiting": [],
                "running": [], "swapped": [], "free": self.s.gpu.num_blocks,
                "cpu_free": self.s.cpu.num_blocks, "kv": {}, "finished": []}

    def _plan(self) -> StepPlan:
        s = self.s
        if self.mode == "full":
            self.log.append("s.step()")
            return s.step()
        plan = StepPlan()
        if self.mode == "admit":
            if s.running:
                self.log.append("(every running request reserves its slot)")
                for request in list(s.running):
                    s.gpu.append_slot(request.id)
                    plan.decode.append(request)
            self.log.append("s.admit(plan)")
            s.admit(plan)
            return plan
        self.log.append("s.reserve_decode_slots(plan); s.admit(plan) unless s.swapped")
        s.reserve_decode_slots(plan)
        if not s.swapped:
            s.admit(plan)
        return plan

    def step(self) -> None:
        expected = self._expected()
        try:
            plan = self._plan()
        except NotImplementedError as exc:
            raise AssertionError(not_written(_raised_in(exc))) from None
        except SwapSpaceFullError:
            if expected["swap_full"]:
                self._after_swap_full(expected)
                return
            self.fail("it raised SwapSpaceFullError, but the CPU pool had room for the "
                      "victim's blocks (or no request needed preempting).", _SWAP_FULL)
        except Exception as exc:
            if expected["swap_full"]:
                self.fail(f"it raised {type(exc).__name__}: {exc}, expected "
                          "SwapSpaceFullError.", _SWAP_FULL)
            self.fail(f"it raised {type(exc).__name__}: {exc}.")
        if expected["swap_full"]:
            self.fail(f"it returned a plan, but the victim's KV did not fit in the CPU pool "
                      f"({self.s.cpu.num_free_blocks()} free CPU blocks were left): expected "
                      "SwapSpaceFullError.", _SWAP_FULL)
        observed = self._observe(plan)
        self._compare(observed, expected, plan)
        self.index += 1
        self._run(plan, expected)

    def _state(self) -> dict:
        s = self.s
        return {"waiting": [r.id for r in s.waiting], "running": [r.id for r in s.running],
                "swapped": [r.id for r in s.swapped], "free": s.gpu.num_free_blocks(),
                "cpu_free": s.cpu.num_free_blocks(),
                "kv": {r.id: s.gpu.seq_len(r.id) for r in s.running if r.id in s.gpu.tables}}

    def _observe(self, plan) -> dict:
        for request, reason in _pairs(self, plan.rejected, "plan.rejected", "(request, reason)"):
            if not isinstance(reason, str) or not reason:
                self.fail(f"plan.rejected holds ({request.id}, {reason!r}).", "Each rejected "
                          "request comes with its reason, a non-empty str.")
        _pairs(self, plan.swapped_out, "plan.swapped_out", "(request, [(gpu_block, "
               "cpu_block), ...])")
        _pairs(self, plan.swapped_in, "plan.swapped_in", "(request, [(cpu_block, "
               "gpu_block), ...])")
        ids = {"prefill": [r.id for r in plan.prefill], "decode": [r.id for r in plan.decode],
               "preempted": [r.id for r in plan.preempted],
               "out": [r.id for r, _ in plan.swapped_out],
               "in": [r.id for r, _ in plan.swapped_in],
               "rejected": [r.id for r, _ in plan.rejected]}
        return {"swap_full": False, "plan": ids, **self._state()}

    def _compare(self, got: dict, expected: dict, plan) -> None:
        back = set(got["plan"]["in"]) | set(got["plan"]["prefill"])  # a victim may return
        for victim in plan.preempted:
            if victim.id in self.s.gpu.tables and victim.id not in back:
                self.fail(f"request {victim.id} was preempted but still holds GPU blocks.",
                          "Every block a preempted request held goes back to the GPU pool, "
                          "by swap too (its KV now lives in the CPU pool).")
        want = expected["plan"]
        if got["plan"]["preempted"] != want["preempted"]:
            self.fail(f"the step preempted {got['plan']['preempted']}, expected "
                      f"{want['preempted']}.", self._idea(got, "preempted"))
        ran_unreserved = set(got["plan"]["decode"]) & set(got["plan"]["preempted"])
        if ran_unreserved:
            self.fail(f"request(s) {sorted(ran_unreserved)} were preempted yet are in the "
                      "step's decode batch.", "Reserve first, then run: a request joins the "
                      "decode batch only once it holds its slot, and a step never runs a "
                      "request whose blocks it does not hold.")
        for request in plan.decode + plan.prefill:
            if request.id not in self.s.gpu.tables:
                self.fail(f"request {request.id} runs without blocks.", "Reserve first, then "
                          "run: a step never runs a request whose blocks it does not hold.")
        for key, label in [("decode", "decode batch"), ("out", "swapped out requests"),
                           ("in", "swapped in requests"), ("rejected", "rejected requests"),
                           ("prefill", "prefill batch")]:
            if got["plan"][key] != want[key]:
                self.fail(f"the step's {label}: {got['plan'][key]}, expected {want[key]}.",
                          self._idea(got, key))
        self._compare_state(got, expected, "")

    def _compare_state(self, got: dict, expected: dict, when: str) -> None:
        for key, what in [("waiting", "the waiting queue is"), ("running", "running is"),
                          ("swapped", "swapped is")]:
            if got[key] != expected[key]:
                self.fail(f"{when}{what} {got[key]}, expected {expected[key]}.",
                          self._idea(got, key))
        if got["free"] != expected["free"]:
            self.fail(f"{when}free GPU blocks: {got['free']}, expected {expected['free']}.",
                      self._idea(got, "free"))
        if got["cpu_free"] != expected["cpu_free"]:
            self.fail(f"{when}free CPU blocks: {got['cpu_free']}, expected "
                      f"{expected['cpu_free']}.", self._idea(got, "cpu_free"))
        for request_id, tokens in expected["kv"].items():
            if got["kv"].get(request_id) != tokens:
                self.fail(f"{when}request {request_id} holds {got['kv'].get(request_id)} KV "
                          f"slots, expected {tokens}.", self._idea(got, "kv"))

    def _after_swap_full(self, expected: dict) -> None:
        """The step raised SwapSpaceFullError, as it should: nothing may have changed for
        the victim. The engine stops there, and so does the scenario."""
        observed = {"swap_full": True, **self._state()}
        self._compare_state(observed, expected, "after SwapSpaceFullError, ")
        self.index += 1
        self.stopped = True

    # -- the fake engine ---------------------------------------------------------------------

    def _run(self, plan, expected: dict) -> None:
        size = self.s.block_size
        for _, mapping in plan.swapped_out:  # the engine copies GPU -> CPU
            for gpu_block, cpu_block in mapping:
                for o in range(size):
                    self.cpu[cpu_block * size + o] = self.gpu.get(gpu_block * size + o)
        for request, _ in plan.swapped_out:  # what swap_in will copy back must be its own
            if request.id not in self.s.cpu.tables:  # swapped back in within the step
                continue
            table = self.s.cpu.block_table(request.id)
            for p in range(self.s.cpu.seq_len(request.id)):
                found = self.cpu.get(table[p // size] * size + p % size)
                if found != (request.id, p):
                    self.fail(f"request {request.id}'s position {p} reads {found} in the CPU "
                              "pool.", "plan.swapped_out lists (gpu_block, cpu_block) pairs: "
                              "the victim's GPU table and its new CPU table, position by "
                              "position, so the engine copies each GPU block into its CPU "
                              "block.")
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
                              "Swapping out and back in must preserve each request's KV: "
                              "every block the plan lists is copied, in table order.")
        done = [r for r in list(self.s.running) if r.done]
        if sorted(r.id for r in done) != expected["finished"]:
            self.fail(f"the running requests that are done are {sorted(r.id for r in done)}, "
                      f"expected {expected['finished']}.", "A request stays in running from "
                      "its admission until the engine finishes it, unless it is preempted.")
        for request in done:
            self.s.finish(request)
            self.finished.add(request.id)
            self.log.append(f"s.finish({request.id})")

    def drain(self) -> None:
        """Step until the policy's run ends (``full``: until nothing is left), then check that
        every finished request produced its tokens and that no block leaked."""
        while not self.stopped:
            if self.mode != "full":
                if self.index >= len(self.expected):
                    return
            elif not (self.s.waiting or self.s.running or self.s.swapped):
                break
            if self.index >= self.max_steps:
                self.fail("requests were still waiting after many steps: something waits "
                          "forever.")
            self.step()
        if self.stopped:
            return
        for mine in self.requests.values():
            if mine.id in self.finished and mine.generated != mine.output_len:
                self.fail(f"request {mine.id} produced {mine.generated} tokens, expected "
                          f"{mine.output_len}.")
        if self.s.gpu.num_free_blocks() != self.s.gpu.num_blocks:
            self.fail("blocks are still held after every request finished (a leak).",
                      "Every block goes back to the pool when its request is preempted or "
                      "finishes.")


def _pairs(harness: _Harness, entries, name: str, shape: str) -> list:
    """``entries`` as (request, second) pairs, or a hint that says what they should be."""
    found = []
    for entry in entries:
        if not (isinstance(entry, tuple | list) and len(entry) == 2
                and isinstance(entry[0], Request)):
            harness.fail(f"{name} holds {entry!r}.", f"Each entry of {name} is {shape}.")
        found.append(tuple(entry))
    return found


def _raised_in(exc: BaseException) -> str:
    """The TODO whose stub raised ``exc``, from the innermost frame that names one."""
    name = "a Scheduler method"
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name in TODOS:
            name = tb.tb_frame.f_code.co_name
        tb = tb.tb_next
    return name


def _admit_cases(cls: type, blame: str | None = None) -> None:
    def admit(specs, num_blocks, block_size, **options) -> None:
        _Harness(cls, specs, num_blocks, block_size, mode="admit", blame=blame,
                 **options).drain()

    admit([(8, 2), (12, 2), (24, 2), (4, 2)], 10, 4, steps=1)
    admit([(3, 1)] * 5, 10, 4, max_seqs=3, steps=1)
    admit([(30, 1), (34, 1), (1, 1)], 40, 4, max_tokens=64, steps=1)
    admit([(4, 50), (4, 2)], 10, 4, steps=1)
    admit([(50, 2), (4, 2)], 10, 4, steps=1)
    admit([(1, 1)] * 5 + [(1, 5)], 5, 1, max_seqs=5, max_tokens=8, steps=1)
    admit([(4, 50), (4, 34), (16, 2), (12, 2), (8, 2)], 10, 4, watermark=0.2, steps=1)
    admit([(6, 4), (6, 4), (12, 2)], 20, 4, max_tokens=13)
    admit([(2, 3)] * 3, 10, 4, max_seqs=2)


def _reserve_cases(cls: type, blame: str | None = None) -> None:
    _Harness(cls, [(3, 6), (4, 3), (1, 9)], 12, 4, blame=blame).drain()


def _preempt_cases(cls: type, blame: str | None = None) -> None:
    def run(specs, num_blocks, block_size, **options) -> None:
        _Harness(cls, specs, num_blocks, block_size, blame=blame, **options).drain()

    run([(3, 10), (3, 10), (3, 10)], 7, 4)
    run([(1, 3), (1, 3)], 5, 1)
    run([(2, 2)] * 3, 4, 1)
    run([(3, 10), (3, 10), (3, 10)], 7, 4, preemption="swap", cpu_blocks=8, mode="no_swap_in")
    run([(3, 10), (3, 10), (3, 10)], 7, 4, preemption="swap", cpu_blocks=1, mode="no_swap_in")
    run([(1, 4)] * 4, 6, 1, preemption="swap", cpu_blocks=8, mode="no_swap_in")  # two swapped


def _swap_in_cases(cls: type, blame: str | None = None) -> None:
    def run(specs, num_blocks, block_size, **options) -> None:
        _Harness(cls, specs, num_blocks, block_size, preemption="swap", blame=blame,
                 **options).drain()

    run([(3, 10), (3, 10), (3, 10)], 7, 4, cpu_blocks=8)
    run([(4, 12)] * 4, 9, 4, cpu_blocks=12)
    run([(4, 12)] * 4, 10, 4, watermark=0.2, cpu_blocks=12)
    run([(1, 3), (2, 2), (1, 3)], 4, 1, cpu_blocks=8)


_CASES = {"admit": _admit_cases, "reserve_decode_slots": _reserve_cases,
          "preempt": _preempt_cases, "swap_in": _swap_in_cases}


def _with_blame(cases: Callable, cls: type, *earlier: str) -> None:
    """The check's cases, blaming an earlier TODO only where lending the course's version of
    it makes them pass (``_harness.blame_where_due``)."""
    from course.v0.scheduler import Scheduler

    blame_where_due(cases, cls, _CASES, Scheduler, *earlier)


@visible
def check_admit(cls: type) -> None:
    """Admission alone, each running request's slot reserved by the test: FCFS until a
    prompt does not fit (no overtaking), at most max_num_seqs running, a token budget met
    exactly and one that counts the step's decodes, the watermark, and a request too long
    for the pool above the watermark rejected as soon as it is at the head (a full batch
    too)."""
    _admit_cases(cls)


@visible
def check_reserve_decode_slots(cls: type) -> None:
    """Three requests decode to completion in a pool with room for all: every step reserves
    each running request's next slot, oldest first, before it runs."""
    _with_blame(_reserve_cases, cls, "admit")


@visible
def check_preempt(cls: type) -> None:
    """Pools too small for growing requests. By recompute: the newest is preempted (itself,
    when it is the one that needs a block) and goes back to the front of the queue; every
    request finishes with exactly its tokens, and no block leaks. By swap (until a request
    would come back, which is swap_in's): victims move to the CPU pool, with their KV, in the
    order they were swapped out, and give their GPU blocks back; a CPU pool too small raises
    SwapSpaceFullError and changes nothing."""
    _with_blame(_preempt_cases, cls, "admit", "reserve_decode_slots")


@visible
def check_swap_in(cls: type) -> None:
    """Preemption by swap to the end: victims come back in the order they were swapped out,
    when their blocks fit above the watermark, with their KV intact (the sentinel reads each
    position back)."""
    _with_blame(_swap_in_cases, cls, "admit", "reserve_decode_slots", "preempt")
