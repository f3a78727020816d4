"""Wrong schedulers, as learners write them, with the hint each must get."""

from __future__ import annotations

from course.block_manager import NoFreeBlocksError
from course.scheduler import Scheduler


class AdmitsOutOfOrder(Scheduler):
    """Lets a later request overtake one that does not fit."""

    def admit(self, plan):
        for request in list(self.waiting):
            if len(self.running) >= self.max_num_seqs:
                break
            if self.blocks_for(request.prompt_len + request.output_len) > (
                    self.gpu.num_blocks - self.watermark_blocks):
                self.waiting.remove(request)
                plan.rejected.append((request, "never fits"))
                continue
            needed = self.blocks_for(request.context_len)
            if needed <= self.gpu.num_free_blocks() - self.watermark_blocks:
                self.waiting.remove(request)
                self.gpu.allocate(request.id, request.context_len)
                self.running.append(request)
                plan.prefill.append(request)


class NeverRejects(Scheduler):
    """Leaves a request that can never fit at the head of the queue."""

    def admit(self, plan):
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            needed = self.blocks_for(request.context_len)
            if needed > self.gpu.num_free_blocks() - self.watermark_blocks:
                break
            if plan.num_batched_tokens + request.context_len > self.max_num_batched_tokens:
                break
            self.waiting.popleft()
            self.gpu.allocate(request.id, request.context_len)
            self.running.append(request)
            plan.prefill.append(request)


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


class SwapsInNewestFirst(Scheduler):
    def swap_in(self, plan):
        while self.swapped and len(self.running) < self.max_num_seqs:
            request = self.swapped[-1]
            cpu_table = self.cpu.block_table(request.id)
            if len(cpu_table) > self.gpu.num_free_blocks() - self.watermark_blocks:
                break
            gpu_table = self.gpu.allocate(request.id, self.cpu.seq_len(request.id))
            plan.swapped_in.append((request, list(zip(cpu_table, gpu_table, strict=True))))
            self.cpu.free(request.id)
            self.swapped.pop()
            self.running.append(request)


MUTANTS = {
    "admit": [(AdmitsOutOfOrder, "first come first served"),
              (NeverRejects, "rejected")],
    "reserve_decode_slots": [(ReservesNewestFirst, "oldest first")],
    "preempt": [(VictimIsOldest, "never the oldest"),
                (RunsBeforeReserving, "Reserve first, then run"),
                (PreemptedToTheBack, "front of the waiting queue")],
    "swap_in": [(SwapsInNewestFirst, "oldest first"),
                (SwapKeepsGpuBlocks, "goes back to the GPU pool")],
}
