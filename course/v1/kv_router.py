"""Chapter 14: the router, which sends each request where its prefix lives.

Three policies over the same engines:

* **round robin**: engine 0, 1, 2, ... in turn; blind to caches and load;
* **least loaded**: the engine with the fewest active blocks (those of requests routed to it
  and not finished, as the router counts them);
* **KV-aware**, NVIDIA Dynamo's cost (its KV cache routing architecture notes and the router's
  design notes, 2025-2026): for each engine ``e``, from the index's overlap (its leading
  blocks of the request, ``course.v1.kv_indexer``)::

      prefill_blocks(e) = (num_tokens - overlap(e) * block_size) / block_size
      decode_blocks(e)  = active_blocks(e) + ceil(num_tokens / block_size)
      cost(e)           = overlap_score_weight * prefill_blocks(e) + decode_blocks(e)

  and the request goes to the lowest cost (the lowest engine number among equals; Dynamo
  draws among them). ``prefill_blocks`` is the prompt left to compute there; ``decode_blocks``
  the blocks the engine would then hold. The weight trades one against the other: a large
  weight follows the cache even onto a busy engine, a weight of 0 is least loaded.

Answers are the bodies between ``### BEGIN SOLUTION`` and ``### END SOLUTION``: chapter 14's
notebook renders its cells from them, and a learner edition replaces them with stubs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from course.v1.kv_indexer import KVIndexer

POLICIES = ("round_robin", "least_loaded", "kv")


def choose_engine(overlaps: dict[int, int], active_blocks: dict[int, int], num_tokens: int,
                  block_size: int, overlap_score_weight: float = 1.0) -> int:
    """The engine of lowest cost (the module's formula) for a request of ``num_tokens``
    prompt tokens; among equal costs, the lowest engine number. ``overlaps[e]`` is engine
    ``e``'s overlap in blocks (an engine missing from it holds none), ``active_blocks`` has
    every engine."""
    ### BEGIN SOLUTION
    request_blocks = math.ceil(num_tokens / block_size)

    def cost(engine: int) -> float:
        prefill = (num_tokens - overlaps.get(engine, 0) * block_size) / block_size
        return overlap_score_weight * prefill + active_blocks[engine] + request_blocks

    return min(sorted(active_blocks), key=cost)
    ### END SOLUTION


@dataclass
class Router:
    """Routes requests to ``num_engines`` engines by ``policy`` (one of ``POLICIES``),
    counting each engine's active blocks as Dynamo's router does: a request's blocks from
    its routing until ``finish``; engines in ``down`` (failed, not yet back) get nothing:
    round robin skips them, the other policies choose among the rest. ``index`` and
    ``choose`` are the chapter's (a notebook gives its own)."""

    num_engines: int
    block_size: int
    policy: str = "kv"
    overlap_score_weight: float = 1.0
    index: KVIndexer = field(default_factory=KVIndexer)
    choose: Callable[..., int] = choose_engine
    down: set[int] = field(default_factory=set)
    active_blocks: dict[int, int] = field(default_factory=dict)
    turn: int = 0

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy {self.policy!r}: one of {', '.join(POLICIES)}")
        for engine in range(self.num_engines):
            self.index.add_engine(engine)
            self.active_blocks.setdefault(engine, 0)

    def route(self, block_hashes: Sequence[bytes], num_tokens: int) -> int:
        """The engine for a request of ``num_tokens`` prompt tokens whose full blocks hash to
        ``block_hashes``; its blocks count as that engine's from now."""
        live = [e for e in range(self.num_engines) if e not in self.down]
        if not live:
            raise RuntimeError("no live engine to route to")
        if self.policy == "round_robin":
            while self.turn in self.down:
                self.turn = (self.turn + 1) % self.num_engines
            engine, self.turn = self.turn, (self.turn + 1) % self.num_engines
        elif self.policy == "least_loaded":
            engine = min(live, key=lambda e: (self.active_blocks[e], e))
        else:
            engine = self.choose(self.index.overlap_blocks(block_hashes),
                                 {e: self.active_blocks[e] for e in live}, num_tokens,
                                 self.block_size, self.overlap_score_weight)
        self.active_blocks[engine] += math.ceil(num_tokens / self.block_size)
        return engine

    def finish(self, engine: int, num_tokens: int) -> None:
        """A request of ``num_tokens`` prompt tokens routed to ``engine`` has finished."""
        self.active_blocks[engine] -= math.ceil(num_tokens / self.block_size)
