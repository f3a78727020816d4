"""Chapter 14 solved another way: the block hash through cbor2 on a list (CBOR writes a list
and a tuple alike), a request's hashes built from a table of each block's extra keys, an index
written from scratch that works out an engine's new holdings from a batch and then brings
``engines`` in line with what changed, a lookup engine by engine, and the router's cost scaled
by the block size and compared as (cost, engine) pairs.

The whole module goes into the notebook's solution cells (a class built in steps), so it
stands alone, with its own imports."""

from __future__ import annotations

import hashlib

import cbor2


def hash_block_tokens(parent_block_hash, token_ids, extra_keys=None):
    encoded = cbor2.dumps([parent_block_hash, [int(t) for t in token_ids], extra_keys],
                          canonical=True)
    return hashlib.sha256(encoded).digest()


def request_block_hashes(token_ids, block_size, first_parent, lora_name=None, cache_salt=None):
    blocks = [list(token_ids[i * block_size:(i + 1) * block_size])
              for i in range(len(token_ids) // block_size)]
    extras = []
    for i in range(len(blocks)):
        keys = tuple(key for key, wanted in ((lora_name, True), (cache_salt, i == 0))
                     if key and wanted)
        extras.append(keys if keys else None)
    hashes = []
    for block, extra in zip(blocks, extras, strict=True):
        hashes.append(hash_block_tokens(hashes[-1] if hashes else first_parent, block, extra))
    return hashes


class KVIndexer:
    """Which engine holds which block, fed by the engines' event batches."""

    def __init__(self):
        self.engines = {}  # block hash -> engines holding it
        self.blocks = {}  # engine -> hashes it holds
        self.last_seq = {}  # engine -> last batch applied (-1: none)

    def add_engine(self, engine):
        if engine not in self.blocks:
            self.blocks[engine] = set()
            self.last_seq[engine] = -1

    def _set_holdings(self, engine, held):
        """Make ``engine`` hold exactly ``held``, ``engines`` following."""
        before = self.blocks.get(engine, set())
        for gone in before - held:
            holders = self.engines[gone]
            holders.remove(engine)
            if len(holders) == 0:
                self.engines.pop(gone)
        for new in held - before:
            if new not in self.engines:
                self.engines[new] = set()
            self.engines[new].add(engine)
        self.blocks[engine] = set(held)

    def forget(self, engine):
        self._set_holdings(engine, set())

    def apply_batch(self, engine, seq, batch):
        self.add_engine(engine)
        restarted = seq == 0
        expected = 0 if restarted else self.last_seq[engine] + 1
        if seq < expected:
            return None
        if seq > expected:
            return expected
        held = set() if restarted else set(self.blocks[engine])
        for event in batch.events:
            kind = type(event).__name__
            if kind == "AllBlocksCleared":
                held.clear()
            elif kind == "BlockStored":
                held.update(event.block_hashes)
            elif kind == "BlockRemoved":
                held.difference_update(event.block_hashes)
        self._set_holdings(engine, held)
        self.last_seq[engine] = seq
        return None

    def overlap_blocks(self, block_hashes):
        result = {}
        for engine, held in self.blocks.items():
            count = 0
            while count < len(block_hashes) and block_hashes[count] in held:
                count += 1
            result[engine] = count
        return result

    def resync(self, engine, replayed):
        self.add_engine(engine)
        intact = True
        for seq, batch in replayed:
            if self.apply_batch(engine, seq, batch) is not None:
                intact = False
                self.forget(engine)
                self.last_seq[engine] = seq - 1
                self.apply_batch(engine, seq, batch)
        return intact

    def snapshot(self):
        return {e: (self.last_seq[e], sorted(held)) for e, held in self.blocks.items()}

    @classmethod
    def restore(cls, snapshot):
        index = cls()
        for engine, (last, hashes) in snapshot.items():
            index.add_engine(engine)
            index._set_holdings(engine, set(hashes))
            index.last_seq[engine] = last
        return index


def choose_engine(overlaps, active_blocks, num_tokens, block_size, overlap_score_weight=1.0):
    # cost x block_size, less what every engine pays alike (its prompt, its own blocks)
    scored = [(active_blocks[e] * block_size
               - overlap_score_weight * overlaps.get(e, 0) * block_size, e)
              for e in active_blocks]
    return min(scored)[1]


ALTERNATIVES = [KVIndexer]
