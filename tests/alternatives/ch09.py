"""Chapter 9 solved another way: a scheduling step that first reserves slots for the running
requests (preempting as needed), then hands the budget out over one combined list.

Self-contained functions (the grading tests paste them into the notebook), using only what
the notebook imports.
"""

from __future__ import annotations

from course.block_manager import NoFreeBlocksError
from course.chunked_scheduler import Chunk, Schedule


def schedule_step(scheduler):
    manager = scheduler.manager
    plan = Schedule()
    budget = scheduler.max_num_batched_tokens
    position = 0
    while budget and position < len(scheduler.running):
        request = scheduler.running[position]
        missing = request.tokens[manager.seq_len(request.id):]
        try:
            for token in missing:
                manager.append_slot(request.id, token)
        except NoFreeBlocksError:
            newest = scheduler.running[-1]
            del scheduler.running[-1]
            manager.free(newest.id)
            newest.num_computed_tokens = 0
            scheduler.waiting.insert(0, newest)
            plan.preempted += [newest.id]
            continue
        take = max(0, min(budget, request.num_tokens - request.num_computed_tokens))
        plan.chunks += [Chunk(request, request.num_computed_tokens, take)]
        request.num_computed_tokens += take
        budget -= take
        position += 1
    if plan.preempted:
        return plan
    while budget and scheduler.waiting and len(scheduler.running) < scheduler.max_num_seqs:
        head = scheduler.waiting[0]
        try:
            head.num_computed_tokens = manager.allocate(head.id, head.tokens)
        except NoFreeBlocksError:
            break
        scheduler.waiting.popleft()
        scheduler.running += [head]
        take = min(budget, head.num_tokens - head.num_computed_tokens)
        plan.chunks += [Chunk(head, head.num_computed_tokens, take)]
        head.num_computed_tokens += take
        budget -= take
    return plan
