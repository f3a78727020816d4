"""Chapter 9: the scheduling step of an engine with chunked prefill and prefix hits.

A request is its tokens (prompt, then every token generated so far) and how many of them
already have their K/V in the cache, ``num_computed_tokens``. A step hands out a budget of
``max_num_batched_tokens`` tokens to compute; a request scheduled ``n`` tokens computes
positions ``num_computed_tokens .. num_computed_tokens + n - 1``::

    request A (decoding)   [p p p p p p o o o|o]          1 token: its newest
    request B (long prompt)[p p p p|p p p p p p p p p p]  a chunk of its prompt
    request C (new)        [h h h h|p p p]                hits from the prefix cache, then
                                                          the rest of its prompt
    budget 8:  A 1 + B 4 + C 3 (B gets the rest of its prompt in later steps)

Prefill of a long prompt is split across steps beside other requests' decodes (chunked
prefill); a prefix-cache hit only sets where a request starts (``num_computed_tokens``);
preemption by recompute sets it back to zero. One function decides the step,
``schedule_step``; its rules are in its docstring.

Blocks come from the KV cache, in vLLM V1's shape (``course.v1.kv_coordinator``): the step asks
``kv_cache.allocate_slots(request, n)`` for room for a request's next ``n`` tokens, and a new
request starts from ``kv_cache.get_computed_tokens(request)``, its prefix hit. After the step
the blocks its chunks completed are cached (``cache_blocks``), so a hit never reads a block
another request is still filling.

Answers are the bodies between ``### BEGIN SOLUTION`` and ``### END SOLUTION``: chapter 9's
notebook renders its cells from them, and a learner edition replaces them with stubs.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from course.v1.kv_coordinator import KVCacheCoordinator


@dataclass(eq=False)
class ChunkedRequest:
    """A request: ``prompt``, ``output`` as generated (with the logits each token was chosen
    from), and ``num_computed_tokens``, how many of ``tokens`` have K/V in the cache."""

    id: int
    prompt: list[int]
    output_len: int
    arrival: int = 0
    output: list[int] = field(default_factory=list)
    logits: list[Any] = field(default_factory=list)
    num_computed_tokens: int = 0
    spec_token_ids: list[int] = field(default_factory=list)  # drafts to verify next step
    cache_salt: str | None = None  # a tenant's: its blocks are hashed apart (chapter 14)

    @property
    def tokens(self) -> list[int]:
        """Prompt, then every generated token."""
        return self.prompt + self.output

    @property
    def tokens_with_spec(self) -> list[int]:
        """Every token, then the drafts (``course.v1.spec_decode``)."""
        return self.tokens + self.spec_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def done(self) -> bool:
        return len(self.output) >= self.output_len

    def emit(self, token: int, logits: Any = None) -> None:
        self.output.append(token)
        self.logits.append(logits)


@dataclass(frozen=True)
class Chunk:
    """``num_tokens`` tokens of ``request`` computed this step, from position ``start``."""

    request: ChunkedRequest
    start: int
    num_tokens: int

    @property
    def end(self) -> int:
        return self.start + self.num_tokens


@dataclass
class Schedule:
    """What one step computes (``chunks``, running requests first) and which requests it
    preempted (their ids)."""

    chunks: list[Chunk] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)


class ChunkedScheduler:
    """Running and waiting requests over a KV cache (``kv_cache``: by default chapter 9's
    ``KVCacheCoordinator`` of one full-attention group; ``step`` runs a scheduling step
    (``schedule_step``, or the function given) and caches what it computed."""

    def __init__(self, num_blocks: int, block_size: int, max_num_batched_tokens: int,
                 max_num_seqs: int = 64, kv_cache: KVCacheCoordinator | None = None) -> None:
        self.kv_cache = kv_cache or KVCacheCoordinator(num_blocks, block_size)
        self.block_size = block_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.running: list[ChunkedRequest] = []  # in admission order: oldest first
        self.waiting: deque[ChunkedRequest] = deque()

    def add(self, request: ChunkedRequest) -> None:
        """Queue a request; refuse one that the whole pool (the null block aside) could
        never hold, every group's blocks together, even run alone."""
        prompt, total = len(request.prompt), len(request.prompt) + request.output_len
        blocks = self.kv_cache.most_blocks(prompt, total, self.max_num_batched_tokens)
        if blocks > self.kv_cache.pool.num_blocks - 1:
            raise ValueError(f"request {request.id} needs {blocks} blocks at once; the pool "
                             f"has {self.kv_cache.pool.num_blocks - 1}")
        self.waiting.append(request)

    def finish(self, request: ChunkedRequest) -> None:
        """A done request leaves; its blocks go back to the pool (cached ones evictable)."""
        self.running.remove(request)
        self.kv_cache.free(request)

    def busy(self) -> bool:
        return bool(self.running or self.waiting)

    def step(self, schedule: Any = None) -> Schedule:
        """One scheduling step; then the blocks its chunks complete are cached."""
        plan = (schedule or schedule_step)(self)
        for chunk in plan.chunks:
            self.kv_cache.cache_blocks(chunk.request)
        return plan


def schedule_step(scheduler: ChunkedScheduler) -> Schedule:
    """Decide one step. ``budget`` starts at ``scheduler.max_num_batched_tokens``; ``kv`` is
    ``scheduler.kv_cache``.

    1. Running requests, in order (``scheduler.running``, oldest first), while the budget is
       above 0: ``num_new = min(request.num_tokens - request.num_computed_tokens, budget)``;
       ask ``kv.allocate_slots(request, num_new)`` for their slots. While it returns
       ``False``, preempt the newest running request (the last of ``scheduler.running``) by
       recompute: take it out of ``running``, ``kv.free(it)``, set its
       ``num_computed_tokens`` to 0, put it at the front of ``waiting``, note its id in
       ``preempted``; then ask again, unless the request preempted was this one (no running
       request is left after it, and the pass ends). Then schedule ``num_new`` tokens.
    2. Waiting requests, only if nothing was preempted this step, first come first served,
       while the budget is above 0 and fewer than ``max_num_seqs`` requests run: its
       ``num_computed_tokens`` becomes its prefix hit, ``kv.get_computed_tokens(request)``
       (which never reaches its last token: there is always one to compute);
       ``num_new = min(request.num_tokens - request.num_computed_tokens, budget)``. If
       ``kv.allocate_slots(request, num_new)`` returns ``False``, its ``num_computed_tokens``
       goes back to 0 and admitting stops; else it leaves ``waiting``, joins the end of
       ``running`` and is scheduled ``num_new`` tokens.

    Scheduling ``n`` tokens appends ``Chunk(request, request.num_computed_tokens, n)`` to the
    schedule, takes ``n`` from the budget and adds ``n`` to ``request.num_computed_tokens``
    (the engine computes them this step).
    """
    ### BEGIN SOLUTION
    kv = scheduler.kv_cache
    plan = Schedule()
    budget = scheduler.max_num_batched_tokens

    def run(request: ChunkedRequest, num_new: int) -> None:
        nonlocal budget
        plan.chunks.append(Chunk(request, request.num_computed_tokens, num_new))
        request.num_computed_tokens += num_new
        budget -= num_new

    index = 0
    while index < len(scheduler.running) and budget > 0:
        request = scheduler.running[index]
        num_new = min(request.num_tokens - request.num_computed_tokens, budget)
        while not kv.allocate_slots(request, num_new):
            victim = scheduler.running.pop()
            kv.free(victim)
            victim.num_computed_tokens = 0
            scheduler.waiting.appendleft(victim)
            plan.preempted.append(victim.id)
            if victim is request:
                break  # it was the newest: nothing is left to preempt, the pass ends
        else:
            run(request, num_new)
            index += 1

    while (not plan.preempted and scheduler.waiting and budget > 0
           and len(scheduler.running) < scheduler.max_num_seqs):
        request = scheduler.waiting[0]
        request.num_computed_tokens = kv.get_computed_tokens(request)
        num_new = min(request.num_tokens - request.num_computed_tokens, budget)
        if not kv.allocate_slots(request, num_new):
            request.num_computed_tokens = 0
            break
        scheduler.waiting.popleft()
        scheduler.running.append(request)
        run(request, num_new)
    return plan
    ### END SOLUTION
