"""Wrong chapter 9 solutions, as learners write them, with the hint each must get."""

from __future__ import annotations

from course.block_manager import NoFreeBlocksError
from course.chunked_scheduler import Chunk, Schedule
from course.prefix_cache import prefix_keys


def _scheduler_with(prefill_first=False, clip_budget=True, clip_remaining=True,
                    whole_hit=False, reset=True):
    """The scheduling step with one rule misread."""

    def schedule_step(scheduler):
        manager, plan = scheduler.manager, Schedule()
        budget = [scheduler.max_num_batched_tokens]

        def run(request, left):
            n = min(left, budget[0]) if clip_budget else left
            plan.chunks.append(Chunk(request, request.num_computed_tokens, n))
            request.num_computed_tokens += n
            budget[0] -= n

        def running():
            index = 0
            while index < len(scheduler.running) and budget[0] > 0:
                request = scheduler.running[index]
                try:
                    while manager.seq_len(request.id) < request.num_tokens:
                        manager.append_slot(request.id,
                                            request.tokens[manager.seq_len(request.id)])
                except NoFreeBlocksError:
                    victim = scheduler.running.pop()
                    manager.free(victim.id)
                    if reset:
                        victim.num_computed_tokens = 0
                    scheduler.waiting.appendleft(victim)
                    plan.preempted.append(victim.id)
                    continue
                left = request.num_tokens - request.num_computed_tokens
                if not clip_remaining:
                    left = request.num_tokens
                run(request, left)
                index += 1

        def waiting():
            while (not plan.preempted and scheduler.waiting and budget[0] > 0
                   and len(scheduler.running) < scheduler.max_num_seqs):
                request = scheduler.waiting[0]
                try:
                    hits = manager.allocate(request.id, request.tokens)
                except NoFreeBlocksError:
                    break
                if whole_hit:  # every cached full block counted, the last one too
                    hits = 0
                    for key in prefix_keys(request.tokens, manager.block_size):
                        if key not in manager.cache:
                            break
                        hits += manager.block_size
                scheduler.waiting.popleft()
                scheduler.running.append(request)
                request.num_computed_tokens = hits
                run(request, request.num_tokens - (0 if not clip_remaining else hits))

        if prefill_first:
            waiting()
            running()
        else:
            running()
            waiting()
        return plan

    return schedule_step


def _named(fn, name):
    fn.__name__ = name
    return fn


MUTANTS = {
    "schedule_step": [
        (_named(_scheduler_with(prefill_first=True), "_prefill_before_decodes"),
         "running requests (their decodes and unfinished prefill chunks) come first"),
        (_named(_scheduler_with(clip_budget=False), "_budget_overrun"),
         "takes its tokens from the one budget"),
        (_named(_scheduler_with(clip_remaining=False), "_chunk_not_clipped_to_the_prompt"),
         "what is left to compute"),
        (_named(_scheduler_with(whole_hit=True), "_hit_counts_the_whole_prompt"),
         "at least one token is always computed"),
        (_named(_scheduler_with(reset=False), "_preemption_keeps_computed_tokens"),
         "set num_computed_tokens to 0"),
    ],
}
