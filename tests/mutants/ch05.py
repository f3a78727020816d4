"""Wrong schedulers, as learners write them, with the hint each must get."""

from __future__ import annotations

from course.block_manager import NoFreeBlocksError
from course.scheduler import Scheduler, SwapSpaceFullError


def _never_fits(s, request, watermark=True) -> bool:
    usable = s.gpu.num_blocks - (s.watermark_blocks if watermark else 0)
    return s.blocks_for(request.prompt_len + request.output_len) > usable


def _admit_one(s, plan, request) -> None:
    s.waiting.remove(request)
    s.gpu.allocate(request.id, request.context_len)
    s.running.append(request)
    plan.prefill.append(request)


class AdmitsOutOfOrder(Scheduler):
    """Lets a later request overtake one that does not fit."""

    def admit(self, plan):
        for request in list(self.waiting):
            if _never_fits(self, request):
                self.waiting.remove(request)
                plan.rejected.append((request, "never fits"))
                continue
            if len(self.running) >= self.max_num_seqs:
                break
            fits = self.blocks_for(request.context_len) <= (
                self.gpu.num_free_blocks() - self.watermark_blocks)
            within = plan.num_batched_tokens + request.context_len <= self.max_num_batched_tokens
            if fits and within:
                _admit_one(self, plan, request)


def _admit(s, plan, *, reject="first", watermark_fit=True, watermark_reject=True,
           budget="plan", seqs="running") -> None:
    """Admission with one rule read some other way (the arguments say which)."""
    while s.waiting:
        request = s.waiting[0]
        count = len(plan.prefill) if seqs == "prefill" else len(s.running)
        full = count > s.max_num_seqs if seqs == "inclusive" else count >= s.max_num_seqs
        mark = s.watermark_blocks if watermark_fit else 0
        blocks_stop = s.blocks_for(request.context_len) > s.gpu.num_free_blocks() - mark
        used = {"plan": plan.num_batched_tokens, "strict": plan.num_batched_tokens,
                "prefill": sum(r.context_len for r in plan.prefill), "none": 0}[budget]
        over = used + request.context_len
        tokens_stop = (over >= s.max_num_batched_tokens if budget == "strict" else
                       over > s.max_num_batched_tokens) and budget != "none"
        if reject == "after_batch" and full:
            break
        if reject == "after_all" and (full or blocks_stop or tokens_stop):
            break
        if reject != "never" and _never_fits(s, request, watermark_reject):
            s.waiting.popleft()
            plan.rejected.append((request, "too long for the pool"))
            continue
        if full or blocks_stop or tokens_stop:
            break
        _admit_one(s, plan, request)


class NeverRejects(Scheduler):
    """Leaves a request that can never fit at the head of the queue."""

    def admit(self, plan):
        _admit(self, plan, reject="never")


class RejectsOnlyWhenTheBatchHasRoom(Scheduler):
    """Checks the batch limit before rejecting (the loop runs while running has room)."""

    def admit(self, plan):
        _admit(self, plan, reject="after_batch")


class RejectsOnlyWhatWouldOtherwiseFit(Scheduler):
    """Every stop check first, the rejection last."""

    def admit(self, plan):
        _admit(self, plan, reject="after_all")


class AdmitsIntoTheWatermark(Scheduler):
    def admit(self, plan):
        _admit(self, plan, watermark_fit=False)


class RejectsAgainstTheWholePool(Scheduler):
    def admit(self, plan):
        _admit(self, plan, watermark_reject=False)


class IgnoresTheWatermark(Scheduler):
    def admit(self, plan):
        _admit(self, plan, watermark_fit=False, watermark_reject=False)


class BudgetMetExactlyIsOver(Scheduler):
    def admit(self, plan):
        _admit(self, plan, budget="strict")


class BudgetWithoutDecodes(Scheduler):
    def admit(self, plan):
        _admit(self, plan, budget="prefill")


class NoTokenBudget(Scheduler):
    def admit(self, plan):
        _admit(self, plan, budget="none")


class BatchIsThisStepsPrefills(Scheduler):
    def admit(self, plan):
        _admit(self, plan, seqs="prefill")


class OneRequestTooMany(Scheduler):
    def admit(self, plan):
        _admit(self, plan, seqs="inclusive")


class ReservesNewestFirst(Scheduler):
    def reserve_decode_slots(self, plan):
        for request in reversed(list(self.running)):
            self.gpu.append_slot(request.id)
            plan.decode.append(request)


class VictimIsOldest(Scheduler):
    def reserve_decode_slots(self, plan):
        index = 0
        while index < len(self.running):
            request = self.running[index]
            try:
                self.gpu.append_slot(request.id)
            except NoFreeBlocksError:
                victim = self.running[0]
                self.preempt(victim, plan)
                if victim is request:
                    continue
                index -= 1
                continue
            plan.decode.append(request)
            index += 1


class RunsBeforeReserving(Scheduler):
    """Puts a request in the batch, then reserves its slot: a preempted one still runs."""

    def reserve_decode_slots(self, plan):
        index = 0
        while index < len(self.running):
            request = self.running[index]
            if request not in plan.decode:
                plan.decode.append(request)
            try:
                self.gpu.append_slot(request.id)
            except NoFreeBlocksError:
                victim = self.running[-1]
                self.preempt(victim, plan)
                if victim is request:
                    break
                continue
            index += 1


class NoSelfPreemption(Scheduler):
    """When the newest is the request that needs a block, stops without preempting it."""

    def reserve_decode_slots(self, plan):
        index = 0
        while index < len(self.running):
            request = self.running[index]
            try:
                self.gpu.append_slot(request.id)
            except NoFreeBlocksError:
                victim = self.running[-1]
                if victim is request:
                    break
                self.preempt(victim, plan)
                continue
            plan.decode.append(request)
            index += 1


class PreemptedToTheBack(Scheduler):
    def preempt(self, victim, plan):
        if self.preemption == "swap":
            return super().preempt(victim, plan)
        self.running.remove(victim)
        plan.preempted.append(victim)
        self.gpu.free(victim.id)
        self.waiting.append(victim)


class SwapKeepsGpuBlocks(Scheduler):
    """Copies a victim's blocks to the CPU but never gives its GPU blocks back."""

    def preempt(self, victim, plan):
        if self.preemption != "swap":
            return super().preempt(victim, plan)
        self.running.remove(victim)
        plan.preempted.append(victim)
        gpu_table = self.gpu.block_table(victim.id)
        cpu_table = self.cpu.allocate(victim.id, self.gpu.seq_len(victim.id))
        plan.swapped_out.append((victim, list(zip(gpu_table, cpu_table, strict=True))))
        self.swapped.append(victim)


class SwapFullChangesState(Scheduler):
    """Takes the victim out of running, then finds the CPU pool full."""

    def preempt(self, victim, plan):
        if self.preemption != "swap":
            return super().preempt(victim, plan)
        self.running.remove(victim)
        plan.preempted.append(victim)
        gpu_table = self.gpu.block_table(victim.id)
        try:
            cpu_table = self.cpu.allocate(victim.id, self.gpu.seq_len(victim.id))
        except NoFreeBlocksError:
            raise SwapSpaceFullError("the CPU pool is full") from None
        plan.swapped_out.append((victim, list(zip(gpu_table, cpu_table, strict=True))))
        self.gpu.free(victim.id)
        self.swapped.append(victim)


class SwapFullEscapes(Scheduler):
    """Lets the CPU pool's NoFreeBlocksError out instead of SwapSpaceFullError."""

    def preempt(self, victim, plan):
        if self.preemption != "swap":
            return super().preempt(victim, plan)
        cpu_table = self.cpu.allocate(victim.id, self.gpu.seq_len(victim.id))
        self.running.remove(victim)
        plan.preempted.append(victim)
        gpu_table = self.gpu.block_table(victim.id)
        plan.swapped_out.append((victim, list(zip(gpu_table, cpu_table, strict=True))))
        self.gpu.free(victim.id)
        self.swapped.append(victim)


def _swap_in(s, plan, *, newest_first=False, watermark=True, overtake=False):
    """Swapping in with one rule read some other way (the arguments say which)."""
    queue = list(s.swapped)
    if newest_first:
        queue.reverse()
    for request in queue:
        if len(s.running) >= s.max_num_seqs:
            return
        cpu_table = s.cpu.block_table(request.id)
        room = s.gpu.num_free_blocks() - (s.watermark_blocks if watermark else 0)
        if len(cpu_table) > room:
            if overtake:
                continue
            return
        gpu_table = s.gpu.allocate(request.id, s.cpu.seq_len(request.id))
        plan.swapped_in.append((request, list(zip(cpu_table, gpu_table, strict=True))))
        s.cpu.free(request.id)
        s.swapped.remove(request)
        s.running.append(request)


class SwapsInNewestFirst(Scheduler):
    def swap_in(self, plan):
        _swap_in(self, plan, newest_first=True)


class SwapInIgnoresTheWatermark(Scheduler):
    def swap_in(self, plan):
        _swap_in(self, plan, watermark=False)


class SwapInOvertakes(Scheduler):
    def swap_in(self, plan):
        _swap_in(self, plan, overtake=True)


MUTANTS = {
    "admit": [(AdmitsOutOfOrder, "first come, first served"),
              (NeverRejects, "can never run"),
              (RejectsOnlyWhenTheBatchHasRoom, "before the batch, block and token checks"),
              (RejectsOnlyWhatWouldOtherwiseFit, "before the batch, block and token checks"),
              (AdmitsIntoTheWatermark, "watermark was ignored"),
              (RejectsAgainstTheWholePool, "rejection ignored the watermark"),
              (IgnoresTheWatermark, "watermark was ignored"),
              (BudgetMetExactlyIsOver, "equal max_num_batched_tokens exactly"),
              (BudgetWithoutDecodes, "counts the step's decodes"),
              (NoTokenBudget, "max_num_batched_tokens was ignored"),
              (BatchIsThisStepsPrefills, "the whole running batch"),
              (OneRequestTooMany, "not one more")],
    "reserve_decode_slots": [(ReservesNewestFirst, "oldest first")],
    "preempt": [(VictimIsOldest, "never the oldest"),
                (RunsBeforeReserving, "Reserve first, then run"),
                (NoSelfPreemption, "preempts itself"),
                (PreemptedToTheBack, "front of the waiting queue"),
                (SwapKeepsGpuBlocks, "goes back to the GPU pool"),
                (SwapFullChangesState, "A full CPU pool changes nothing"),
                (SwapFullEscapes, "expected SwapSpaceFullError")],
    "swap_in": [(SwapsInNewestFirst, "the order they were swapped out"),
                (SwapInIgnoresTheWatermark, "Swapping in keeps the watermark"),
                (SwapInOvertakes, "come back in order")],
}
