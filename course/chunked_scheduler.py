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

Blocks: a request is given blocks for all of its tokens when admitted (chapter 4's
``allocate``, which also finds the hits) and one more slot each time it has a new token
(``append_slot``). The prefix cache here caches a full block only once its K/V are computed
(``ComputedPrefixCache``), so a hit never reads a block another request is still filling.

Answers are the bodies between ``### BEGIN SOLUTION`` and ``### END SOLUTION``: chapter 9's
notebook renders its cells from them, and a learner edition replaces them with stubs.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from course.block_manager import NoFreeBlocksError
from course.prefix_cache import PrefixCachingBlockManager


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

    @property
    def tokens(self) -> list[int]:
        """Prompt, then every generated token."""
        return self.prompt + self.output

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


class ComputedPrefixCache(PrefixCachingBlockManager):
    """Chapter 4's prefix-caching BlockManager, caching a full block only once its K/V are
    computed: ``mark_computed(seq_id, n)`` says the sequence's first ``n`` tokens are."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self.computed: dict[int, int] = {}

    def _cache_full_blocks(self, seq_id: int) -> None:
        """Chapter 4's caching of the sequence's full blocks, keyed by its computed tokens
        only: a full block some of whose tokens are not computed yet is not cached."""
        tokens = self.tokens[seq_id]
        computed = min(self.computed.get(seq_id, 0), len(tokens))
        self.tokens[seq_id] = tokens[:computed]  # key only the computed blocks
        try:
            super()._cache_full_blocks(seq_id)
        finally:
            self.tokens[seq_id] = tokens

    def allocate(self, seq_id: int, tokens: list[int], extra_keys: tuple = ()) -> int:
        """Chapter 4's ``allocate``: blocks for every one of ``tokens``, returning the prefix
        hits; the hit tokens count as computed. Nothing changes when it raises."""
        self.computed[seq_id] = 0
        try:
            hits = super().allocate(seq_id, tokens, extra_keys)
        except BaseException:
            del self.computed[seq_id]
            raise
        self.mark_computed(seq_id, hits)
        return hits

    def mark_computed(self, seq_id: int, num_computed: int) -> None:
        """The sequence's first ``num_computed`` tokens have their K/V (a total, not an
        increment); its full blocks among them become cacheable."""
        self.computed[seq_id] = num_computed
        self._cache_full_blocks(seq_id)

    def free(self, seq_id: int) -> None:
        """Chapter 4's ``free``; the sequence's computed count goes with its blocks."""
        super().free(seq_id)
        self.computed.pop(seq_id, None)


class ChunkedScheduler:
    """Running and waiting requests over a ``ComputedPrefixCache``; ``step`` runs a
    scheduling step (``schedule_step``, or the function given) and records what is computed."""

    def __init__(self, num_blocks: int, block_size: int, max_num_batched_tokens: int,
                 max_num_seqs: int = 64) -> None:
        self.manager = ComputedPrefixCache(num_blocks, block_size)
        self.block_size = block_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.running: list[ChunkedRequest] = []  # in admission order: oldest first
        self.waiting: deque[ChunkedRequest] = deque()

    def add(self, request: ChunkedRequest) -> None:
        """Queue a request; refuse one that could never fit in the whole pool."""
        blocks = -(-(len(request.prompt) + request.output_len) // self.block_size)
        if blocks > self.manager.num_blocks:
            raise ValueError(f"request {request.id} needs {blocks} blocks at full length; the "
                             f"pool has {self.manager.num_blocks}")
        self.waiting.append(request)

    def finish(self, request: ChunkedRequest) -> None:
        """A done request leaves; its blocks go back to the pool (cached ones evictable)."""
        self.running.remove(request)
        self.manager.free(request.id)

    def busy(self) -> bool:
        return bool(self.running or self.waiting)

    def step(self, schedule: Any = None) -> Schedule:
        """One scheduling step; then the blocks its chunks complete become cacheable."""
        plan = (schedule or schedule_step)(self)
        for chunk in plan.chunks:
            self.manager.mark_computed(chunk.request.id, chunk.request.num_computed_tokens)
        return plan


def schedule_step(scheduler: ChunkedScheduler) -> Schedule:
    """Decide one step. ``budget`` starts at ``scheduler.max_num_batched_tokens``.

    1. Running requests, in order (``scheduler.running``, oldest first), while the budget is
       above 0: first every token of the request without a slot gets one, in order (while
       ``manager.seq_len(id) < request.num_tokens``:
       ``manager.append_slot(id, request.tokens[manager.seq_len(id)])``). When that raises
       ``NoFreeBlocksError``, preempt the newest running request (the last of
       ``scheduler.running``) by recompute: take it out of ``running``, free its blocks, set
       its ``num_computed_tokens`` to 0, put it at the front of ``waiting``, note its id in
       ``preempted``; then try this request again, unless the request preempted was this one
       (the newest: no running request is left after it, and the pass ends). Then schedule
       ``min(request.num_tokens - request.num_computed_tokens, budget)`` tokens.
    2. Waiting requests, only if nothing was preempted this step, first come first served,
       while the budget is above 0 and fewer than ``max_num_seqs`` requests run: allocate
       all of its tokens (``hits = manager.allocate(id, request.tokens)``; on
       ``NoFreeBlocksError`` stop admitting); it leaves ``waiting``, joins the end of
       ``running`` with ``num_computed_tokens = hits`` (chapter 4's allocate never counts the
       block that holds the last token: there is always one to compute), and is scheduled
       ``min(num_tokens - hits, budget)`` tokens.

    Scheduling ``n`` tokens appends ``Chunk(request, request.num_computed_tokens, n)`` to the
    schedule, takes ``n`` from the budget and adds ``n`` to ``request.num_computed_tokens``
    (the engine computes them this step).
    """
    ### BEGIN SOLUTION
    manager = scheduler.manager
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
        try:
            while manager.seq_len(request.id) < request.num_tokens:
                manager.append_slot(request.id, request.tokens[manager.seq_len(request.id)])
        except NoFreeBlocksError:
            victim = scheduler.running.pop()
            manager.free(victim.id)
            victim.num_computed_tokens = 0
            scheduler.waiting.appendleft(victim)
            plan.preempted.append(victim.id)
            continue  # the same request again (or, if it was the victim, the loop ends)
        run(request, min(request.num_tokens - request.num_computed_tokens, budget))
        index += 1

    while (not plan.preempted and scheduler.waiting and budget > 0
           and len(scheduler.running) < scheduler.max_num_seqs):
        request = scheduler.waiting[0]
        try:
            hits = manager.allocate(request.id, request.tokens)
        except NoFreeBlocksError:
            break
        scheduler.waiting.popleft()
        scheduler.running.append(request)
        request.num_computed_tokens = hits
        run(request, min(request.num_tokens - hits, budget))
    return plan
    ### END SOLUTION
