"""Wrong schedulers, as learners write them, with the hint each must get."""

from __future__ import annotations

from course.v0.block_manager import NoFreeBlocksError
from course.v0.scheduler import Scheduler, SwapSpaceFullError

from . import Rule


def _never_fits(s, request, watermark=True) -> bool:
    usable = s.gpu.num_blocks - (s.watermark_blocks if watermark else 0)
    return s.blocks_for(request.prompt_len + request.output_len) > usable


def _admit_one(s, plan, request, tokens, listed=True) -> None:
    s.waiting.remove(request)
    s.gpu.allocate(request.id, tokens)
    s.running.append(request)
    if listed:
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
                _admit_one(self, plan, request, request.context_len)


def _admit(s, plan, *, reject="first", watermark_fit=True, watermark_reject=True,
           budget="plan", seqs="running", reason=True, prompt_only=False,
           listed=True) -> None:
    """Admission with one rule read some other way (the arguments say which)."""
    while s.waiting:
        request = s.waiting[0]
        length = request.prompt_len if prompt_only else request.context_len
        count = len(plan.prefill) if seqs == "prefill" else len(s.running)
        full = count > s.max_num_seqs if seqs == "inclusive" else count >= s.max_num_seqs
        mark = s.watermark_blocks if watermark_fit else 0
        blocks_stop = s.blocks_for(length) > s.gpu.num_free_blocks() - mark
        used = {"plan": plan.num_batched_tokens, "strict": plan.num_batched_tokens,
                "prefill": sum(r.context_len for r in plan.prefill), "none": 0}[budget]
        over = used + length
        tokens_stop = (over >= s.max_num_batched_tokens if budget == "strict" else
                       over > s.max_num_batched_tokens) and budget != "none"
        if reject == "after_batch" and full:
            break
        if reject == "after_all" and (full or blocks_stop or tokens_stop):
            break
        if reject != "never" and _never_fits(s, request, watermark_reject):
            s.waiting.popleft()
            plan.rejected.append((request, "too long for the pool") if reason else request)
            continue
        if full or blocks_stop or tokens_stop:
            break
        _admit_one(s, plan, request, length, listed)


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


class RejectsWithoutAReason(Scheduler):
    """Puts the rejected request itself in plan.rejected, with no reason."""

    def admit(self, plan):
        _admit(self, plan, reason=False)


class AdmitsThePromptOnly(Scheduler):
    """Reads prompt_len where the text says context_len: a request preempted by recompute
    comes back without what it had generated."""

    def admit(self, plan):
        _admit(self, plan, prompt_only=True)


class PrefillNotListed(Scheduler):
    """Admits the request but never adds it to plan.prefill."""

    def admit(self, plan):
        _admit(self, plan, listed=False)


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


class NoRetryAfterPreempting(Scheduler):
    """Preempts the newest for the current request, then moves on without the current
    request's slot."""

    def reserve_decode_slots(self, plan):
        index = 0
        while index < len(self.running):
            request = self.running[index]
            try:
                self.gpu.append_slot(request.id)
            except NoFreeBlocksError:
                victim = self.running[-1]
                self.preempt(victim, plan)
                if victim is request:
                    break
                index += 1
                continue
            plan.decode.append(request)
            index += 1


class SwallowsSwapSpaceFull(Scheduler):
    """Ends the reservation quietly when the CPU pool cannot take a victim."""

    def reserve_decode_slots(self, plan):
        try:
            super().reserve_decode_slots(plan)
        except SwapSpaceFullError:
            return


class PreemptedUnlisted(Scheduler):
    """Preempts the victim but leaves it out of plan.preempted."""

    def preempt(self, victim, plan):
        super().preempt(victim, plan)
        plan.preempted.remove(victim)


class RecomputeKeepsGpuBlocks(Scheduler):
    """By recompute, requeues the victim without freeing its GPU blocks."""

    def preempt(self, victim, plan):
        if self.preemption == "swap":
            return super().preempt(victim, plan)
        self.running.remove(victim)
        plan.preempted.append(victim)
        self.waiting.appendleft(victim)


class SwapOutPairsReversed(Scheduler):
    """Lists a victim's swap-out pairs as (cpu_block, gpu_block), the way swap_in lists its
    own."""

    def preempt(self, victim, plan):
        super().preempt(victim, plan)
        if self.preemption == "swap":
            request, pairs = plan.swapped_out[-1]
            plan.swapped_out[-1] = (request, [(cpu, gpu) for gpu, cpu in pairs])


class SwappedToTheFront(Scheduler):
    """Puts a swapped-out victim at the front of swapped, as recompute does with waiting."""

    def preempt(self, victim, plan):
        super().preempt(victim, plan)
        if self.preemption == "swap":
            self.swapped.appendleft(self.swapped.pop())


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


def _swap_in(s, plan, *, newest_first=False, watermark=True, overtake=False, frees_cpu=True,
             pairs="cpu_gpu", decodes=False):
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
        mapping = zip(cpu_table, gpu_table, strict=True) if pairs == "cpu_gpu" else zip(
            gpu_table, cpu_table, strict=True)
        plan.swapped_in.append((request, list(mapping)))
        if frees_cpu:
            s.cpu.free(request.id)
        s.swapped.remove(request)
        s.running.append(request)
        if decodes:
            plan.decode.append(request)


class SwapsInNewestFirst(Scheduler):
    def swap_in(self, plan):
        _swap_in(self, plan, newest_first=True)


class SwapInIgnoresTheWatermark(Scheduler):
    def swap_in(self, plan):
        _swap_in(self, plan, watermark=False)


class SwapInOvertakes(Scheduler):
    def swap_in(self, plan):
        _swap_in(self, plan, overtake=True)


class SwapInKeepsCpuBlocks(Scheduler):
    def swap_in(self, plan):
        _swap_in(self, plan, frees_cpu=False)


class SwapInPairsReversed(Scheduler):
    """Lists the swap-in pairs as (gpu_block, cpu_block), the way preempt lists its own."""

    def swap_in(self, plan):
        _swap_in(self, plan, pairs="gpu_cpu")


class SwapInDecodesAtOnce(Scheduler):
    """Adds a request swapped in to this step's plan.decode."""

    def swap_in(self, plan):
        _swap_in(self, plan, decodes=True)


UNSEEN_BY_THE_PROBE = {SwapOutPairsReversed, SwapInPairsReversed}
"""Mutants that the notebook's probe (``course.experiments.serving_experiments.probe``) takes for
correct: they differ only in which blocks a swap copies, which the probe does not compare (nor do
the experiments, which count blocks and never read KV)."""

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
              (OneRequestTooMany, "not one more"),
              (RejectsWithoutAReason, "is (request, reason)"),
              (AdmitsThePromptOnly, "not its prompt_len"),
              (PrefillNotListed, "prefill batch: []")],
    "reserve_decode_slots": [(ReservesNewestFirst, "oldest first")],
    "preempt": [(VictimIsOldest, "never the oldest"),
                (RunsBeforeReserving, "Reserve first, then run"),
                (NoSelfPreemption, "preempts itself"),
                (NoRetryAfterPreempting, "tries again: it still needs its slot"),
                (SwallowsSwapSpaceFull, "expected SwapSpaceFullError"),
                (PreemptedUnlisted, "is recorded in plan.preempted"),
                (PreemptedToTheBack, "front of the waiting queue"),
                (RecomputeKeepsGpuBlocks, "goes back to the GPU pool"),
                (SwapKeepsGpuBlocks, "goes back to the GPU pool"),
                (SwapOutPairsReversed, "lists (gpu_block, cpu_block) pairs"),
                (SwappedToTheFront, "the order requests were swapped out in"),
                (SwapFullChangesState, "A full CPU pool changes nothing"),
                (SwapFullEscapes, "expected SwapSpaceFullError")],
    "swap_in": [(SwapsInNewestFirst, "the order they were swapped out"),
                (SwapInIgnoresTheWatermark, "Swapping in keeps the watermark"),
                (SwapInOvertakes, "come back in order"),
                (SwapInKeepsCpuBlocks, "until it is swapped back in"),
                (SwapInPairsReversed, "must preserve each request's KV"),
                (SwapInDecodesAtOnce, "is not in this step's plan.decode")],
}

RULES = [
    Rule("Admit waiting requests first come, first served.", "admit", ("AdmitsOutOfOrder",)),
    Rule("If its full length (prompt_len + output_len) needs more blocks than the pool holds "
         "above the watermark (gpu.num_blocks - watermark_blocks), it never can", "admit",
         ("RejectsAgainstTheWholePool",)),
    Rule("remove it, append (request, reason) to plan.rejected", "admit", ("NeverRejects",)),
    Rule("(reason: a non-empty str that says why)", "admit", ("RejectsWithoutAReason",)),
    Rule("This check comes first, so such a request is rejected even when the batch is full.",
         "admit", ("RejectsOnlyWhenTheBatchHasRoom", "RejectsOnlyWhatWouldOtherwiseFit")),
    Rule("Stop (it stays at the head; nothing behind it overtakes it) when the batch already "
         "holds max_num_seqs requests", "admit", ("BatchIsThisStepsPrefills",
                                                  "OneRequestTooMany")),
    Rule("when its context_len tokens need more blocks than gpu.num_free_blocks() - "
         "watermark_blocks", "admit", ("AdmitsIntoTheWatermark",)),
    Rule("the watermark is watermark_blocks = int(num_blocks * watermark) blocks that admission "
         "and swap-in leave free", "admit", ("IgnoresTheWatermark",)),
    Rule("when plan.num_batched_tokens (the prefills admitted so far plus one token per decode) "
         "plus its context_len is more than max_num_batched_tokens", "admit",
         ("NoTokenBudget",)),
    Rule("the prefills admitted so far plus one token per decode", "admit",
         ("BudgetWithoutDecodes",)),
    Rule("a step exactly at the budget is within it", "admit", ("BudgetMetExactlyIsOver",)),
    Rule("Admit it: gpu.allocate(request.id, request.context_len)", "admit",
         ("AdmitsThePromptOnly",)),
    Rule("remove it from waiting, append it to running and to plan.prefill", "admit",
         ("PrefillNotListed",)),
    Rule("Walk running oldest first", "reserve_decode_slots", ("ReservesNewestFirst",)),
    Rule("preempt the newest running request (running[-1])", "preempt", ("VictimIsOldest",)),
    Rule("and try the current request again", "preempt", ("NoRetryAfterPreempting",)),
    Rule("When the newest is the current request, it preempts itself", "preempt",
         ("NoSelfPreemption",)),
    Rule("Reservation comes before running, so the step never runs a request whose blocks it "
         "does not hold.", "preempt", ("RunsBeforeReserving",)),
    Rule("preempt may raise SwapSpaceFullError: let it through.", "preempt",
         ("SwallowsSwapSpaceFull",)),
    Rule("Take the victim out of running and record it in plan.preempted", "preempt",
         ("PreemptedUnlisted",)),
    Rule("recompute: free its GPU blocks", "preempt", ("RecomputeKeepsGpuBlocks",)),
    Rule("put it back at the front of the waiting queue (it arrived before everything still "
         "waiting)", "preempt", ("PreemptedToTheBack",)),
    Rule("record (victim, [(gpu_block, cpu_block), ...]) (its GPU table and its new CPU table, "
         "position by position) in plan.swapped_out", "preempt", ("SwapOutPairsReversed",)),
    Rule("free its GPU blocks, and append it to self.swapped", "preempt",
         ("SwapKeepsGpuBlocks", "SwappedToTheFront")),
    Rule("A CPU pool whose free blocks cannot hold the victim's KV raises SwapSpaceFullError",
         "preempt", ("SwapFullEscapes",)),
    Rule("before anything changes: the victim stays in running with its GPU blocks and is not "
         "in plan.preempted, and nothing is allocated on the CPU.", "preempt",
         ("SwapFullChangesState",)),
    Rule("Swapped requests come back in the order they were swapped out (the front of swapped "
         "first)", "swap_in", ("SwapsInNewestFirst",)),
    Rule("the front request's blocks fit in gpu.num_free_blocks() - watermark_blocks",
         "swap_in", ("SwapInIgnoresTheWatermark",)),
    Rule("record (request, [(cpu_block, gpu_block), ...]) in plan.swapped_in", "swap_in",
         ("SwapInPairsReversed",)),
    Rule("free its CPU blocks, remove it from swapped and append it to running", "swap_in",
         ("SwapInKeepsCpuBlocks",)),
    Rule("Stop at the first that does not fit (nothing overtakes it).", "swap_in",
         ("SwapInOvertakes",)),
    Rule("A request swapped in is not in this step's plan.decode: its next slot is reserved in "
         "the next step.", "swap_in", ("SwapInDecodesAtOnce",)),
]
