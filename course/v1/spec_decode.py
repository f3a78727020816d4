"""Speculative decoding's KV side: draft tokens proposed cheaply, verified by the target model
in one step, and what the target rejects rolled back (vLLM's ``vllm/v1/spec_decode/`` and
``vllm/v1/sample/rejection_sampler.py``, vLLM 0.34.0)::

    step t     request  [p p p p p o o | o d d d]   its newest token o and k = 3 drafts d,
                                                    computed as one chunk of 1 + k tokens
               logits   row 0 says what follows o, row i what follows draft i
    greedy     drafts accepted while each equals the target's choice before it; then one
               token more: the target's own at the first draft it rejects, or a bonus
               after the last
    rollback   num_computed_tokens pulls back by the drafts rejected; their slots hold K/V
               of tokens that never were, so no block is cached past the accepted tokens

The KV cache sees drafts twice. Before the step, ``schedule_lookahead`` gives a request's
drafts slots from what the step's budget and pool have left, every group's or none; a guess
never preempts a request or displaces a real token, and a request whose drafts find no room
still computes its own token. After it, ``rollback`` pulls the request's computed tokens back
by the drafts rejected and gives back the blocks that held only them. A sliding window frees
by what the step's first token sees, never by its drafts: a draft rejected would have freed
blocks the accepted tokens still read.

A step that accepts ``a`` of ``k`` drafts emits ``a + 1`` tokens for one read of the request's
KV: decode is memory-bound, so the tokens come almost for the price of one.

Proposals here are prompt lookup (``ngram_propose``, vLLM's ``NgramProposer``): the tokens
that followed the last time the request's newest n tokens occurred. They cost no model, and
pay where text repeats itself (code edits, retrieval answers quoting their sources).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from course.v1.chunked_scheduler import Chunk, ChunkedRequest, ChunkedScheduler, Schedule


def ngram_propose(tokens: Sequence[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Up to ``k`` drafts by prompt lookup. For ``n`` from ``max_n`` down to ``min_n`` (and
    below ``len(tokens)``): the n-gram that ends ``tokens`` (its last ``n`` tokens) is
    looked for earlier in ``tokens``, at every start before ``len(tokens) - n`` (an earlier
    occurrence may overlap the n-gram itself). The longest ``n`` found wins; of its
    occurrences, the first. The drafts are the tokens that followed that occurrence, at most
    ``k`` of them. No n-gram found: ``[]``."""
    ### BEGIN SOLUTION
    if min_n < 1 or max_n < min_n or k < 0:
        raise ValueError(f"n-grams of {min_n} to {max_n} tokens, {k} drafts: need "
                         "1 <= min_n <= max_n and k >= 0")
    tokens = list(tokens)
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []
    ### END SOLUTION


def accept_greedy(drafts: Sequence[int], target: Sequence[int]) -> list[int]:
    """The tokens a greedy verification emits. ``target[i]`` is the target model's greedy
    choice after the request's newest token and drafts ``0 .. i-1`` (so ``len(drafts) + 1``
    of them). Drafts are accepted from the first while each equals the target's choice at
    its place; then one token more, the target's own: its choice at the first draft
    rejected, or after the last draft when all are accepted."""
    if len(target) != len(drafts) + 1:
        raise ValueError(f"{len(drafts)} drafts need {len(drafts) + 1} target choices, "
                         f"got {len(target)}")
    ### BEGIN SOLUTION
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == target[accepted]:
        accepted += 1
    return [*drafts[:accepted], target[accepted]]
    ### END SOLUTION


def rejection_sample(drafts: Sequence[int], draft_probs: torch.Tensor | None,
                     target_probs: torch.Tensor, generator: torch.Generator) -> list[int]:
    """The tokens a sampled verification emits, distributed as the target's own samples
    (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding",
    Algorithm 1; vLLM's ``RejectionSampler``). ``target_probs`` [k + 1, vocab] is the target's
    distribution at each place, ``draft_probs`` [k, vocab] the proposer's (``None`` for a
    proposer with no distribution, such as prompt lookup: all its mass on its draft).

    Draft ``x`` at place ``i`` is accepted with probability ``min(1, p(x) / q(x))``; at the
    first rejection the token is drawn from ``max(0, p - q)`` normalised, and no later draft
    counts; after every draft is accepted, a bonus token is drawn from the last place's
    ``p``."""
    k = len(drafts)
    if target_probs.shape[0] != k + 1:
        raise ValueError(f"{k} drafts need {k + 1} target distributions, "
                         f"got {target_probs.shape[0]}")
    if draft_probs is None:
        draft_probs = torch.zeros(k, target_probs.shape[1], dtype=target_probs.dtype)
        draft_probs[torch.arange(k), torch.tensor(list(drafts), dtype=torch.long)] = 1.0
    emitted: list[int] = []
    for place, token in enumerate(drafts):
        p, q = target_probs[place], draft_probs[place]
        ratio = 1.0 if p[token] >= q[token] else float(p[token] / q[token])
        if float(torch.rand((), generator=generator)) < ratio:
            emitted.append(token)
            continue
        residual = (p - q).clamp(min=0)
        emitted.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))
        return emitted
    emitted.append(int(torch.multinomial(target_probs[k], 1, generator=generator)))
    return emitted


def schedule_lookahead(scheduler: ChunkedScheduler, plan: Schedule) -> Schedule:
    """Give drafts slots in the step ``plan`` (chapter 9's ``schedule_step``) decided, from
    what it left: ``budget`` is ``scheduler.max_num_batched_tokens`` less the plan's tokens,
    ``kv`` is ``scheduler.kv_cache``. For each chunk in the plan's order whose request has
    drafts (``request.spec_token_ids``) and which ends at the request's last known token
    (``chunk.end == request.num_tokens``):

    1. the request keeps only the drafts the budget holds (``spec_token_ids[:budget]``);
       none left: on to the next chunk;
    2. room for the chunk and its drafts is asked from the chunk's first token: with
       ``request.num_computed_tokens`` set back to ``chunk.start``,
       ``kv.allocate_slots(request, chunk.num_tokens + len(drafts))`` (a sliding window
       then frees only what that first token no longer sees);
    3. made: the plan's chunk becomes ``Chunk(request, chunk.start, chunk.num_tokens +
       len(drafts))`` and the drafts come off the budget; refused: the request's drafts
       become ``[]`` and its chunk stays (a draft never preempts a request);
    4. either way ``request.num_computed_tokens`` is its chunk's end.

    Returns ``plan``."""
    ### BEGIN SOLUTION
    kv = scheduler.kv_cache
    budget = scheduler.max_num_batched_tokens - plan.total_num_scheduled_tokens
    for index, chunk in enumerate(plan.chunks):
        request = chunk.request
        if chunk.end != request.num_tokens or not request.spec_token_ids:
            continue
        request.spec_token_ids = request.spec_token_ids[:budget]
        if not request.spec_token_ids:
            continue
        request.num_computed_tokens = chunk.start
        extended = chunk.num_tokens + len(request.spec_token_ids)
        if kv.allocate_slots(request, extended):
            plan.chunks[index] = Chunk(request, chunk.start, extended)
            budget -= len(request.spec_token_ids)
        else:
            request.spec_token_ids = []
        request.num_computed_tokens = plan.chunks[index].end
    return plan
    ### END SOLUTION


def rollback(scheduler: ChunkedScheduler, request: ChunkedRequest, num_accepted: int) -> None:
    """After a step verified ``request``'s drafts and kept ``num_accepted`` of them (a
    ``ValueError`` unless ``0 <= num_accepted <= len(request.spec_token_ids)``):

    1. ``request.num_computed_tokens`` pulls back by the drafts rejected,
       ``len(request.spec_token_ids) - num_accepted`` (their slots hold K/V of tokens that
       never were; real tokens write those places again);
    2. the request has no drafts left: ``request.spec_token_ids = []``;
    3. in every group (``kv.managers``, ``kv = scheduler.kv_cache``), the request's table
       (``manager.tables[request.id]``) keeps the blocks its computed tokens fill,
       ``ceil(num_computed_tokens / kv.block_size)``; the blocks past them go back to the
       pool, last first (``kv.pool.free_blocks``), and leave the table."""
    if not 0 <= num_accepted <= len(request.spec_token_ids):
        raise ValueError(f"request {request.id}: {num_accepted} of "
                         f"{len(request.spec_token_ids)} drafts accepted")
    ### BEGIN SOLUTION
    request.num_computed_tokens -= len(request.spec_token_ids) - num_accepted
    request.spec_token_ids = []
    kv = scheduler.kv_cache
    keep = -(-request.num_computed_tokens // kv.block_size)
    for manager in kv.managers:
        table = manager.tables[request.id]
        kv.pool.free_blocks(list(reversed(table[keep:])))
        del table[keep:]
    ### END SOLUTION
