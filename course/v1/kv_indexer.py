"""Chapter 14: the router's global index of which engine holds which block.

The indexer is fed by every engine's KV events (``course.v1.kv_events``) and answers one
question per request: for each engine, how many of the request's leading blocks it holds
(NVIDIA Dynamo's ``KvIndexer``, in its KV cache routing architecture notes). Block hashes are
chained (``course.v1.block_hash``), so a block's hash names its whole prefix: a hash held
means the prefix up to it is held, and a lookup walks the request's hashes from the first
and stops, for each engine, at its first miss (a radix tree keyed by hash does the same walk).

Events arrive over PUB sockets, which lose batches; the index must never believe an engine
holds a block it has evicted. Hence its rules, one engine's batches at a time:

* batch ``last + 1`` is applied, in order of its events;
* a batch already applied (``seq <= last``) is ignored: replays can repeat one;
* a batch past a gap is not applied: the batches missing come first (asked of the engine's
  replay socket, ``resync``);
* batch 0 starts a publisher's life: the engine has (re)started, and what the index held for
  it is forgotten before the batch is applied. (Batch 0 can be lost like any other; whoever
  restarts an engine also tells the index, ``restarted``.)

Answers are the bodies between ``### BEGIN SOLUTION`` and ``### END SOLUTION``: chapter 14's
notebook renders its cells from them, and a learner edition replaces them with stubs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from course.v1.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch


@dataclass
class KVIndexer:
    """``engines[h]``: the engines holding block hash ``h``; ``blocks[e]``: the hashes engine
    ``e`` holds; ``last_seq[e]``: the last batch of engine ``e`` applied (-1: none yet)."""

    engines: dict[bytes, set[int]] = field(default_factory=dict)
    blocks: dict[int, set[bytes]] = field(default_factory=dict)
    last_seq: dict[int, int] = field(default_factory=dict)
    events_applied: int = 0

    def add_engine(self, engine: int) -> None:
        """Know ``engine`` (holding nothing yet)."""
        self.blocks.setdefault(engine, set())
        self.last_seq.setdefault(engine, -1)

    def forget(self, engine: int) -> None:
        """Drop every block ``engine`` was known to hold (its sequence number is kept)."""
        for block_hash in self.blocks.get(engine, set()):
            holders = self.engines[block_hash]
            holders.discard(engine)
            if not holders:
                del self.engines[block_hash]
        self.blocks[engine] = set()

    def restarted(self, engine: int) -> None:
        """``engine`` has restarted, as whoever restarted it knows (a fleet's driver; Dynamo's
        discovery gives a restarted worker a new instance): its blocks are forgotten and its
        batch 0 is expected, even if PUB loses that batch."""
        self.add_engine(engine)
        self.forget(engine)
        self.last_seq[engine] = -1

    def apply_batch(self, engine: int, seq: int, batch: KVEventBatch) -> int | None:
        """Apply batch ``seq`` of ``engine`` by the module's rules; ``None`` when it was
        applied or ignored, or, past a gap, the first missing sequence number (nothing
        applied). ``BlockStored`` adds each of its hashes to the engine's, ``BlockRemoved``
        drops each of its, ``AllBlocksCleared`` drops them all; ``engines`` and ``blocks``
        always agree, and a hash no engine holds is not in ``engines``."""
        ### BEGIN SOLUTION
        self.add_engine(engine)
        if seq == 0:
            self.forget(engine)
            self.last_seq[engine] = -1
        last = self.last_seq[engine]
        if seq <= last:
            return None
        if seq > last + 1:
            return last + 1
        for event in batch.events:
            if isinstance(event, BlockStored):
                for block_hash in event.block_hashes:
                    self.engines.setdefault(block_hash, set()).add(engine)
                    self.blocks[engine].add(block_hash)
            elif isinstance(event, BlockRemoved):
                for block_hash in event.block_hashes:
                    if block_hash in self.blocks[engine]:
                        self.blocks[engine].discard(block_hash)
                        self.engines[block_hash].discard(engine)
                        if not self.engines[block_hash]:
                            del self.engines[block_hash]
            elif isinstance(event, AllBlocksCleared):
                self.forget(engine)
            self.events_applied += 1
        self.last_seq[engine] = seq
        return None
        ### END SOLUTION

    def overlap_blocks(self, block_hashes: Sequence[bytes]) -> dict[int, int]:
        """For every engine the index knows, how many of ``block_hashes`` (a request's chained
        hashes, first block first) it holds from the first on, up to its first miss."""
        ### BEGIN SOLUTION
        overlap = dict.fromkeys(self.blocks, 0)
        candidates = set(self.blocks)
        for depth, block_hash in enumerate(block_hashes):
            candidates &= self.engines.get(block_hash, set())
            if not candidates:
                break
            for engine in candidates:
                overlap[engine] = depth + 1
        return overlap
        ### END SOLUTION

    def resync(self, engine: int, replayed: list[tuple[int, KVEventBatch]]) -> bool:
        """Apply ``engine``'s ``replayed`` batches (its replay socket's answer, in order).
        When the first batch missing is older than any it replayed (gone from its buffer),
        the index cannot know what the engine evicted meanwhile: it forgets the engine's
        blocks and goes on from the oldest batch replayed. ``True`` when nothing was lost."""
        self.add_engine(engine)
        intact = True
        for seq, batch in replayed:
            missing = self.apply_batch(engine, seq, batch)
            if missing is not None:
                intact = False
                self.forget(engine)
                self.last_seq[engine] = seq - 1
                self.apply_batch(engine, seq, batch)
        return intact

    def snapshot(self) -> dict[int, tuple[int, list[bytes]]]:
        """What a restarted router needs: each engine's last batch applied and its hashes."""
        return {engine: (self.last_seq[engine], sorted(self.blocks[engine]))
                for engine in self.blocks}

    @classmethod
    def restore(cls, snapshot: dict[int, tuple[int, list[bytes]]]) -> "KVIndexer":  # noqa: UP037
        # (quoted: a notebook's skeleton of this class runs without postponed annotations)
        """An index as ``snapshot`` left it; the batches since come by replay."""
        index = cls()
        for engine, (last, hashes) in snapshot.items():
            index.add_engine(engine)
            index.last_seq[engine] = last
            index.blocks[engine] = set(hashes)
            for block_hash in hashes:
                index.engines.setdefault(block_hash, set()).add(engine)
        return index


def probe(indexer_class: type) -> list:
    """What an indexer reports along a short script (two engines sharing a block; a repeat, a
    gap, a removal, a restart, a clear): after each batch, what ``apply_batch`` returned, each
    engine's hashes and the overlaps of a three-block request. The module's rules fix all of
    it, so a notebook compares the learner's class with the course's on it before using
    theirs."""
    a, b, c = (bytes([n]) * 32 for n in (1, 2, 3))

    def stored(*hashes: bytes) -> BlockStored:
        return BlockStored(block_hashes=list(hashes), parent_block_hash=None, token_ids=[],
                           block_size=1)

    script = [(0, 0, [stored(a, b)]), (1, 0, [stored(a)]), (0, 1, [stored(a, b, c)]),
              (1, 1, []), (0, 1, [stored(c)]), (0, 3, [BlockRemoved(block_hashes=[b])]),
              (0, 2, [BlockRemoved(block_hashes=[a])]), (0, 3, [BlockRemoved(block_hashes=[b])]),
              (1, 0, []), (0, 4, [AllBlocksCleared()])]
    index = indexer_class()
    seen = []
    for engine, seq, events in script:
        answer = index.apply_batch(engine, seq, KVEventBatch(ts=0.0, events=events))
        seen.append((answer, {e: sorted(h) for e, h in index.blocks.items()},
                     index.overlap_blocks([a, b, c])))
    return seen
