"""Chapter 5: the scheduling step of a continuous-batching engine.

Every step the scheduler decides, on top of a chapter 3 BlockManager, which requests run:

    1. reserve: every running request gets the slot for its next token (oldest first). When
       the pool is out of blocks, the newest running request is preempted (the current one
       itself when it is the newest), by recompute (its blocks are freed and it goes back to
       the *front* of the waiting queue, to be prefilled again with everything it has so far)
       or by swap (its blocks are copied to a bounded CPU pool and freed on the GPU, until
       there is room to bring them back; a full CPU pool raises SwapSpaceFullError and changes
       nothing).
    2. swap in: swapped requests come back first, in the order they were swapped out, while
       their blocks fit above a small watermark and ``running`` has fewer than
       ``max_num_seqs`` requests.
    3. admit: the head of the waiting queue, first come first served. A request that could
       never fit in the whole pool is rejected with a reason as soon as it is at the head;
       otherwise admission stops at the first request that does not fit: ``running`` is full
       (``max_num_seqs``), its blocks do not fit above the watermark, or the step's tokens
       would exceed ``max_num_batched_tokens``.
    4. run: the returned plan. Reservation comes before running, so a step never runs a
       request whose blocks it does not hold: the step is atomic.

Answers are the bodies between ``### BEGIN SOLUTION`` and ``### END SOLUTION``: chapter 5's
notebook renders its cells from them, and a learner edition replaces them with stubs.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from course.v0.block_manager import BlockManager, NoFreeBlocksError


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
        """Give every running request (oldest first) the slot for its next token
        (``gpu.append_slot``) and add it to ``plan.decode`` once it holds that slot. When the
        pool is out of blocks, preempt the newest running request and try the current one
        again; when the newest is the current request, it preempts itself, stays out of
        ``plan.decode``, and the reservation ends (everything older holds its slot)."""
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
        """Take ``victim`` out of ``running`` and add it to ``plan.preempted``; by recompute,
        free its GPU blocks and put it at the front of ``waiting``; by swap, copy its KV
        (``gpu.seq_len`` tokens) to the CPU pool, list ``(gpu_block, cpu_block)`` pairs in
        ``plan.swapped_out``, free its GPU blocks and append it to ``swapped``. A CPU pool
        with too few free blocks raises SwapSpaceFullError before anything changes (the
        victim stays running and keeps its GPU blocks)."""
        ### BEGIN SOLUTION
        if self.preemption == "swap":
            tokens = self.gpu.seq_len(victim.id)
            if self.blocks_for(tokens) > self.cpu.num_free_blocks():
                raise SwapSpaceFullError(
                    f"request {victim.id} needs {self.blocks_for(tokens)} CPU blocks to swap "
                    f"out, {self.cpu.num_free_blocks()} are free: raise the swap space "
                    "(cpu_blocks) or preempt by recompute")
            self.running.remove(victim)
            plan.preempted.append(victim)
            gpu_table = self.gpu.block_table(victim.id)
            cpu_table = self.cpu.allocate(victim.id, tokens)
            plan.swapped_out.append((victim, list(zip(gpu_table, cpu_table, strict=True))))
            self.gpu.free(victim.id)
            self.swapped.append(victim)
        else:
            self.running.remove(victim)
            plan.preempted.append(victim)
            self.gpu.free(victim.id)
            self.waiting.appendleft(victim)
        ### END SOLUTION

    def swap_in(self, plan: StepPlan) -> None:
        """Bring swapped requests back in the order they were swapped out (the front of
        ``swapped`` first), while ``running`` has fewer than ``max_num_seqs`` requests and
        the front one's blocks fit in the free GPU blocks minus the watermark: allocate its
        KV on the GPU (``cpu.seq_len`` tokens), list ``(cpu_block, gpu_block)`` pairs in
        ``plan.swapped_in``, free its CPU blocks, remove it from ``swapped`` and append it
        to ``running`` (it decodes from the next step). Stop at the first that does not
        fit: nothing overtakes it."""
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
        """Admit waiting requests, first come first served. For the head of ``waiting``, in
        this order: if its full length (``prompt_len + output_len``) needs more blocks than
        the whole pool above the watermark, reject it (``(request, reason)`` in
        ``plan.rejected``) and look at the next; else stop if ``running`` already holds
        ``max_num_seqs`` requests, if its ``context_len`` tokens' blocks exceed the free
        blocks minus the watermark, or if ``plan.num_batched_tokens`` plus its
        ``context_len`` exceeds ``max_num_batched_tokens`` (equal is within); else allocate
        its ``context_len`` tokens and add it to ``running`` and ``plan.prefill``."""
        ### BEGIN SOLUTION
        while self.waiting:
            request = self.waiting[0]
            total = self.blocks_for(request.prompt_len + request.output_len)
            usable = self.gpu.num_blocks - self.watermark_blocks
            if total > usable:
                self.waiting.popleft()
                plan.rejected.append((request, f"request {request.id} needs {total} blocks at "
                                      f"full length; the pool holds {usable} above the "
                                      "watermark"))
                continue
            if len(self.running) >= self.max_num_seqs:
                break
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
