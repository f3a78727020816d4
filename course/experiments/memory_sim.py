"""Where a serving engine's KV memory goes: a step-by-step simulation of allocation strategies.

Requests wait in a first-come-first-served queue. A request is admitted when its memory fits,
is prefilled (its prompt's KV written), then grows by one token per step until it reaches its
final length and leaves. The KV pool has a fixed number of token slots. Strategies:

* contiguous ("Max", "Pow2", "Oracle"): on admission a request reserves one contiguous range of
  slots, big enough for ``max_model_len`` tokens, for the next power of two of its final
  length, or for exactly its final length (an oracle that knows the future). Ranges are placed
  first-fit in a linear address space, and freed ranges merge with free neighbours.
* paged: the pool is cut into blocks of ``block_size`` slots; a request holds just the blocks
  its tokens fill, and takes a new one when its last block is full. When none is free, the
  most recently admitted request is preempted: its blocks are freed and it goes back to the
  head of the queue, to be recomputed (prefilled again with the tokens it has so far).

After each step every slot of the pool is counted in exactly one category::

    token_states  holds a token's K and V
    reserved      reserved by a contiguous request for tokens it will generate later
    internal      allocated but never to be used: past a request's final length (contiguous),
                  or the empty tail of a request's last block (paged, at most block_size - 1)
    external      free, but no use to the request waiting next: holes too small for its
                  reservation (contiguous), or the remainder of a pool that is not a whole
                  number of blocks (paged)
    free          free and usable: everything free while nobody waits, and paging's free
                  blocks (any request can use any block)

Shares are averaged over the steps in which requests were waiting: the engine under load,
where lost memory costs throughput.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from course.experiments.workloads import Request

CATEGORIES = ("token_states", "reserved", "internal", "external", "free")


@dataclass(frozen=True)
class Strategy:
    """How requests get memory: a contiguous reservation rule, or paging with a block size."""

    name: str
    reservation: str = ""  # contiguous only: "max", "pow2" or "oracle"
    block_size: int = 0  # paged only

    @property
    def paged(self) -> bool:
        return self.block_size > 0

    def reserve(self, request: Request, max_model_len: int) -> int:
        """Slots a contiguous strategy reserves for ``request``."""
        if self.reservation == "max":
            return max_model_len
        if self.reservation == "pow2":
            return 1 << (request.final_len - 1).bit_length()
        return request.final_len


MAX = Strategy("Max", reservation="max")
POW2 = Strategy("Pow2", reservation="pow2")
ORACLE = Strategy("Oracle", reservation="oracle")


def paged(block_size: int) -> Strategy:
    return Strategy(f"Paged (B={block_size})", block_size=block_size)


@dataclass
class Step:
    """The pool after one step: slots per category, and the requests in and out of it."""

    token_states: int
    reserved: int
    internal: int
    external: int
    free: int
    resident: int
    waiting: int
    table_entries: int  # blocks held by resident requests (paged); 0 for contiguous

    @property
    def total(self) -> int:
        return sum(getattr(self, c) for c in CATEGORIES)


@dataclass
class SimulationResult:
    strategy: Strategy
    pool_slots: int
    steps: list[Step]
    preemptions: int
    completed: int

    def _loaded(self) -> list[Step]:
        return [s for s in self.steps if s.waiting > 0] or self.steps

    def shares(self) -> dict[str, float]:
        """Mean share of the pool in each category, over the steps with requests waiting."""
        loaded = self._loaded()
        return {c: sum(getattr(s, c) for s in loaded) / (len(loaded) * self.pool_slots)
                for c in CATEGORIES}

    def mean_resident(self) -> float:
        loaded = self._loaded()
        return sum(s.resident for s in loaded) / len(loaded)

    def mean_table_length(self) -> float:
        """Mean block-table entries per resident request, under load (paged only)."""
        loaded = [s for s in self._loaded() if s.resident]
        return sum(s.table_entries / s.resident for s in loaded) / max(1, len(loaded))


@dataclass
class _Running:
    request: Request
    length: int  # tokens whose KV is in the cache
    start: int = 0  # contiguous: first slot of its range
    size: int = 0  # contiguous: slots reserved; paged: blocks held


@dataclass
class _Holes:
    """Free ranges of a linear address space, by start; first-fit, merging on free."""

    starts: list[int]
    sizes: list[int]
    free_slots: int = field(init=False)

    def __post_init__(self) -> None:
        self.free_slots = sum(self.sizes)

    def allocate(self, size: int) -> int | None:
        for i, hole in enumerate(self.sizes):
            if hole >= size:
                start = self.starts[i]
                if hole == size:
                    del self.starts[i], self.sizes[i]
                else:
                    self.starts[i] += size
                    self.sizes[i] -= size
                self.free_slots -= size
                return start
        return None

    def release(self, start: int, size: int) -> None:
        i = bisect.bisect(self.starts, start)
        self.starts.insert(i, start)
        self.sizes.insert(i, size)
        self.free_slots += size
        if i + 1 < len(self.starts) and start + size == self.starts[i + 1]:  # merge right
            self.sizes[i] += self.sizes.pop(i + 1)
            self.starts.pop(i + 1)
        if i > 0 and self.starts[i - 1] + self.sizes[i - 1] == start:  # merge left
            self.sizes[i - 1] += self.sizes.pop(i)
            self.starts.pop(i)


def simulate(requests: list[Request], strategy: Strategy, pool_slots: int,
             max_model_len: int = 2048) -> SimulationResult:
    """Run ``requests`` (all queued at step 0) through a pool of ``pool_slots`` slots."""
    if any(r.final_len > max_model_len for r in requests):
        raise ValueError("every request must fit in max_model_len tokens")
    if strategy.paged:
        capacity = pool_slots // strategy.block_size * strategy.block_size
        if max(r.final_len for r in requests) > capacity:
            raise ValueError(f"a request does not fit in the {capacity} usable slots of the pool")
        return _simulate_paged(requests, strategy, pool_slots)
    if pool_slots < max(strategy.reserve(r, max_model_len) for r in requests):
        raise ValueError(f"a {strategy.name} reservation is larger than the whole pool")
    return _simulate_contiguous(requests, strategy, pool_slots, max_model_len)


def _simulate_contiguous(requests: list[Request], strategy: Strategy, pool_slots: int,
                         max_model_len: int) -> SimulationResult:
    holes = _Holes([0], [pool_slots])
    waiting = deque(requests)
    running: list[_Running] = []
    steps: list[Step] = []
    completed = 0
    while waiting or running:
        for seq in running:
            seq.length += 1
        for seq in [s for s in running if s.length >= s.request.final_len]:
            running.remove(seq)
            holes.release(seq.start, seq.size)
            completed += 1
        while waiting:
            size = strategy.reserve(waiting[0], max_model_len)
            start = holes.allocate(size)
            if start is None:
                break
            request = waiting.popleft()
            running.append(_Running(request, request.prompt_len, start, size))
        tokens = sum(s.length for s in running)
        final = sum(s.request.final_len for s in running)
        reserved_total = sum(s.size for s in running)
        stuck = holes.free_slots if waiting else 0
        steps.append(Step(tokens, final - tokens, reserved_total - final, stuck,
                          holes.free_slots - stuck, len(running), len(waiting), 0))
    return SimulationResult(strategy, pool_slots, steps, 0, completed)


def _simulate_paged(requests: list[Request], strategy: Strategy,
                    pool_slots: int) -> SimulationResult:
    block = strategy.block_size
    num_blocks = pool_slots // block
    # Like vLLM's v0 block manager, keep 1 % of the blocks free at admission, so that a
    # request just admitted does not force a preemption on its very next token.
    watermark = max(1, num_blocks // 100)
    free_blocks = num_blocks
    waiting: deque[_Running] = deque(_Running(r, r.prompt_len) for r in requests)
    running: list[_Running] = []  # in admission order: the newest is preempted first
    steps: list[Step] = []
    completed = preemptions = 0
    while waiting or running:
        i = 0
        while i < len(running):
            seq = running[i]
            seq.length += 1
            if seq.length > seq.size * block:  # its last block is full: it needs another
                if free_blocks == 0:
                    # Preempt the newest request: it comes after seq in admission order (it
                    # has not grown yet this step), or it is seq itself. Every running
                    # request holds at least one block, so this frees at least one.
                    victim = running.pop()
                    free_blocks += victim.size
                    victim.size = 0
                    waiting.appendleft(victim)
                    preemptions += 1
                    if victim is seq:
                        continue  # seq was the last in line: the loop is over
                seq.size += 1
                free_blocks -= 1
            i += 1
        for seq in [s for s in running if s.length >= s.request.final_len]:
            running.remove(seq)
            free_blocks += seq.size
            completed += 1
        while waiting:
            needed = -(-waiting[0].length // block)
            if needed > free_blocks - (watermark if running else 0):
                break
            seq = waiting.popleft()
            seq.size = needed
            free_blocks -= needed
            running.append(seq)
        tokens = sum(s.length for s in running)
        held = sum(s.size for s in running)
        steps.append(Step(tokens, 0, held * block - tokens, pool_slots - num_blocks * block,
                          free_blocks * block, len(running), len(waiting), held))
    return SimulationResult(strategy, pool_slots, steps, preemptions, completed)


# Share of KV memory holding token states, Kwon et al. (SOSP 2023), Fig. 2: Orca with
# reservations of the maximum length, of the next power of two, and of the exact final length
# (an oracle), and vLLM.
PAPER_TOKEN_STATE_SHARE = {"Max": 0.204, "Pow2": 0.268, "Oracle": 0.382, "Paged (B=16)": 0.963}


@dataclass(frozen=True)
class SweepPoint:
    block_size: int
    token_state_share: float
    mean_table_length: float


def sweep_block_sizes(requests: list[Request], pool_slots: int, block_sizes: list[int],
                      max_model_len: int = 2048) -> list[SweepPoint]:
    """Token-state share and mean block-table length under load, for each block size."""
    points = []
    for block_size in block_sizes:
        result = simulate(requests, paged(block_size), pool_slots, max_model_len)
        points.append(SweepPoint(block_size, result.shares()["token_states"],
                                 result.mean_table_length()))
    return points
