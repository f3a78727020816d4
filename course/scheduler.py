"""Chapter 5: the scheduling step of a continuous-batching engine.

Every step the scheduler decides, on top of a chapter 3 BlockManager, which requests run:

    1. reserve: every running request gets the slot for its next token (oldest first). When
       the pool is out of blocks, the most recently admitted request is preempted, by
       recompute (its blocks are freed and it goes back to the *front* of the waiting queue,
       to be prefilled again with everything it has so far) or by swap (its blocks are copied
       to a bounded CPU pool and freed on the GPU, until there is room to bring them back).
    2. swap in: swapped requests come back first, oldest first, when their blocks fit.
    3. admit: waiting requests, first come first served, while their prompt's blocks fit above
       a small watermark, the batch has fewer than ``max_num_seqs`` requests, and the step's
       tokens stay within ``max_num_batched_tokens``. A request that could never fit in the
       whole pool is rejected with a reason instead of waiting forever.
    4. run: the returned plan. Reservation comes before running, so a step never runs a
       request whose blocks it does not hold: the step is atomic.

Answers are the bodies between ``### BEGIN SOLUTION`` and ``### END SOLUTION``: chapter 5's
notebook renders its cells from them, and the learner edition replaces them with stubs
(``autograder/render.py``, ``autograder/edition.py``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from course.block_manager import BlockManager, NoFreeBlocksError


class SwapSpaceFullError(RuntimeError):
    """Preemption by swap found the CPU pool full."""


@dataclass
class Request:
    id: int
    prompt_len: int
    output_len: int
    arrival: float = 0.0
    generated: int = 0  # output tokens produced so far

    @property
    def context_len(self) -> int:
        """Tokens whose KV the request needs: its prompt and what it has generated."""
        return self.prompt_len + self.generated

    @property
    def done(self) -> bool:
        return self.generated >= self.output_len


@dataclass
class StepPlan:
    """What one step runs, and what the scheduler did to get there."""

    prefill: list[Request] = field(default_factory=list)  # (re)computed from scratch this step
    decode: list[Request] = field(default_factory=list)  # one new token each
    preempted: list[Request] = field(default_factory=list)
    swapped_out: list[tuple[Request, list[tuple[int, int]]]] = field(default_factory=list)
    swapped_in: list[tuple[Request, list[tuple[int, int]]]] = field(default_factory=list)
    rejected: list[tuple[Request, str]] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(r.context_len for r in self.prefill) + len(self.decode)


class Scheduler:
    """FCFS continuous batching over a BlockManager, with preemption by recompute or swap."""

    def __init__(self, num_blocks: int, block_size: int, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 8192, watermark: float = 0.01,
                 preemption: str = "recompute", cpu_blocks: int = 0) -> None:
        self.gpu = BlockManager(num_blocks, block_size)
        self.cpu = BlockManager(cpu_blocks, block_size)
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.watermark_blocks = int(num_blocks * watermark)
        self.preemption = preemption
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: the newest is preempted first
        self.swapped: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def finish(self, request: Request) -> None:
        """The engine calls this when a request has produced all of its tokens."""
        self.running.remove(request)
        self.gpu.free(request.id)

    def step(self) -> StepPlan:
        """Reserve, swap in, admit; return what runs. The engine then runs the plan."""
        plan = StepPlan()
        self.reserve_decode_slots(plan)
        if self.preemption == "swap":
            self.swap_in(plan)
        if not self.swapped:  # swapped requests come back before new ones are admitted
            self.admit(plan)
        return plan

    def reserve_decode_slots(self, plan: StepPlan) -> None:
        """Give every running request (oldest first) the slot for its next token, preempting
        the newest request while the pool is out of blocks."""
        ### BEGIN SOLUTION
        index = 0
        while index < len(self.running):
            request = self.running[index]
            try:
                self.gpu.append_slot(request.id)
            except NoFreeBlocksError:
                victim = self.running[-1]
                self.preempt(victim, plan)
                if victim is request:
                    break  # it was the newest: nothing after it is left to reserve
                continue  # try the same request again, with the victim's blocks freed
            plan.decode.append(request)
            index += 1
        ### END SOLUTION

    def preempt(self, victim: Request, plan: StepPlan) -> None:
        """Take ``victim`` out of the running batch, by recompute or by swap."""
        ### BEGIN SOLUTION
        self.running.remove(victim)  # never reserved this step: victims come after the
        plan.preempted.append(victim)  # request being reserved, or are that request
        if self.preemption == "swap":
            gpu_table = self.gpu.block_table(victim.id)
            try:
                cpu_table = self.cpu.allocate(victim.id, self.gpu.seq_len(victim.id))
            except NoFreeBlocksError:
                raise SwapSpaceFullError(
                    f"request {victim.id} needs {len(gpu_table)} CPU blocks to swap out, "
                    f"{self.cpu.num_free_blocks()} are free: raise the swap space or preempt "
                    "by recompute") from None
            plan.swapped_out.append((victim, list(zip(gpu_table, cpu_table, strict=True))))
            self.gpu.free(victim.id)
            self.swapped.append(victim)
        else:
            self.gpu.free(victim.id)
            self.waiting.appendleft(victim)
        ### END SOLUTION

    def swap_in(self, plan: StepPlan) -> None:
        """Bring swapped requests back, oldest first, while their blocks fit."""
        ### BEGIN SOLUTION
        while self.swapped and len(self.running) < self.max_num_seqs:
            request = self.swapped[0]
            cpu_table = self.cpu.block_table(request.id)
            if len(cpu_table) > self.gpu.num_free_blocks() - self.watermark_blocks:
                break
            gpu_table = self.gpu.allocate(request.id, self.cpu.seq_len(request.id))
            plan.swapped_in.append((request, list(zip(cpu_table, gpu_table, strict=True))))
            self.cpu.free(request.id)
            self.swapped.popleft()
            self.running.append(request)
        ### END SOLUTION

    def admit(self, plan: StepPlan) -> None:
        """Admit waiting requests, first come first served, while they fit."""
        ### BEGIN SOLUTION
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            total = self.blocks_for(request.prompt_len + request.output_len)
            if total > self.gpu.num_blocks - self.watermark_blocks:
                self.waiting.popleft()
                plan.rejected.append((request, f"request {request.id} needs {total} blocks at "
                                      f"full length; the pool has {self.gpu.num_blocks}"))
                continue
            needed = self.blocks_for(request.context_len)
            if needed > self.gpu.num_free_blocks() - self.watermark_blocks:
                break
            if plan.num_batched_tokens + request.context_len > self.max_num_batched_tokens:
                break
            self.waiting.popleft()
            self.gpu.allocate(request.id, request.context_len)
            self.running.append(request)
            plan.prefill.append(request)
        ### END SOLUTION


def static_batching(scheduler: type[Scheduler]) -> type[Scheduler]:
    """``scheduler`` with static batching: a new batch is admitted only once every request
    of the last one has finished (no request joins a running batch)."""

    class StaticBatch(scheduler):
        def admit(self, plan: StepPlan) -> None:
            if not self.running:
                super().admit(plan)

    StaticBatch.__name__ = StaticBatch.__qualname__ = f"StaticBatch{scheduler.__name__}"
    return StaticBatch


StaticBatchScheduler = static_batching(Scheduler)
