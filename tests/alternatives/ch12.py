"""Chapter 12 solved another way: prompt lookup as a scan from the end for the longest match,
acceptance by zip, the lookahead's budget counted down from the tokens still free, and the
rollback's blocks popped off each table's end."""

from __future__ import annotations

from course.v1.chunked_scheduler import Chunk


def ngram_propose(tokens, min_n, max_n, k):
    tokens = list(tokens)
    best = None  # (n, start)
    for start in range(len(tokens) - 1):
        n = 0  # how far tokens[start:] matches the end of tokens, read backwards
        while (n < max_n and start - n >= 0 and len(tokens) - 1 - n > start - n
               and tokens[start - n] == tokens[len(tokens) - 1 - n]):
            n += 1
        n = min(n, max_n)
        if n >= min_n and n < len(tokens) and (best is None or n > best[0]):
            best = (n, start - n + 1)
    if best is None:
        return []
    n, begin = best
    return tokens[begin + n:begin + n + k]


def accept_greedy(drafts, target):
    out = []
    for draft, choice in zip(drafts, target, strict=False):
        if draft != choice:
            return out + [choice]
        out.append(draft)
    return out + [target[len(drafts)]]


def schedule_lookahead(scheduler, plan):
    free_tokens = scheduler.max_num_batched_tokens - sum(c.num_tokens for c in plan.chunks)
    chunks = []
    for chunk in plan.chunks:
        request = chunk.request
        wants = request.spec_token_ids and chunk.start + chunk.num_tokens == request.num_tokens
        if wants:
            request.spec_token_ids = request.spec_token_ids[:max(free_tokens, 0)]
        if wants and request.spec_token_ids:
            extra = len(request.spec_token_ids)
            request.num_computed_tokens = chunk.start
            if scheduler.kv_cache.allocate_slots(request, chunk.num_tokens + extra):
                chunk = Chunk(request, chunk.start, chunk.num_tokens + extra)
                free_tokens -= extra
            else:
                request.spec_token_ids = []
            request.num_computed_tokens = chunk.start + chunk.num_tokens
        chunks.append(chunk)
    plan.chunks[:] = chunks
    return plan


def rollback(scheduler, request, num_accepted):
    request.num_computed_tokens += num_accepted - len(request.spec_token_ids)
    request.spec_token_ids = []
    kv = scheduler.kv_cache
    for manager in kv.managers:
        table = manager.tables[request.id]
        while len(table) * kv.block_size - kv.block_size >= request.num_computed_tokens:
            kv.pool.free_blocks([table.pop()])
