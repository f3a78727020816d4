"""Chapter 4 solved another way: blake2b over a length-prefixed byte encoding, keys built
recursively, and a manager written from scratch (not on the notebook's skeleton) with explicit
loops. It keeps only what the checks read besides the public methods: the cache maps ``cache``
(key to block) and ``keys`` (block to key), and ``_take_block`` / ``_release_block``."""

from __future__ import annotations

import hashlib
import struct

from course.v0.block_manager import NoFreeBlocksError
from course.v0.prefix_cache import ROOT_KEY


def block_key(parent_key, tokens, extra_keys=()):
    digest = hashlib.blake2b(digest_size=32)
    digest.update(parent_key.encode())
    digest.update(struct.pack("<I", len(tokens)))
    for token in tokens:
        digest.update(struct.pack("<q", int(token)))
    for extra in extra_keys:
        text = repr(extra).encode()
        digest.update(struct.pack("<I", len(text)) + text)
    return digest.hexdigest()


def prefix_keys(tokens, block_size, extra_keys=()):
    full = len(tokens) // block_size
    if full == 0:
        return []
    earlier = prefix_keys(tokens[:(full - 1) * block_size], block_size, extra_keys)
    parent = earlier[-1] if earlier else ROOT_KEY
    return earlier + [block_key(parent, list(tokens[(full - 1) * block_size:full * block_size]),
                                extra_keys)]


class PrefixCachingBlockManager:
    def __init__(self, num_blocks, block_size):
        self.block_size = block_size
        self.lru = dict.fromkeys(range(num_blocks))  # unreferenced blocks, oldest use first
        self.refs = [0] * num_blocks
        self.cache = {}  # key -> block
        self.keys = {}  # block -> key
        self.seqs = {}  # seq id -> {"table", "tokens", "extra", "keys"}

    def block_table(self, seq_id):
        return list(self.seqs[seq_id]["table"])

    def seq_len(self, seq_id):
        return len(self.seqs[seq_id]["tokens"])

    def ref_count(self, block):
        return self.refs[block]

    def num_free_blocks(self):
        return len(self.lru)

    def is_cached(self, block):
        return block in self.keys

    def evictable_blocks(self):
        return [block for block in self.lru if block in self.keys]

    def _take_block(self):
        if not self.lru:
            raise NoFreeBlocksError("the pool is empty")
        block = next(iter(self.lru))  # the first is the least recently used
        del self.lru[block]
        if block in self.keys:
            self.cache.pop(self.keys.pop(block))
        self.refs[block] = 1
        return block

    def _release_block(self, block):
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.lru[block] = None

    def _key_full_blocks(self, record):
        size, keys = self.block_size, record["keys"]
        while (len(keys) + 1) * size <= len(record["tokens"]):
            index = len(keys)
            keys.append(block_key(keys[-1] if keys else ROOT_KEY,
                                  list(record["tokens"][index * size:(index + 1) * size]),
                                  record["extra"]))
            block = record["table"][index]
            if keys[-1] not in self.cache and block not in self.keys:
                self.cache[keys[-1]] = block
                self.keys[block] = keys[-1]

    def allocate(self, seq_id, tokens, extra_keys=()):
        if seq_id in self.seqs:
            raise ValueError("sequence exists")
        keys = prefix_keys(tokens, self.block_size, extra_keys)
        limit = max(0, (len(tokens) - 1) // self.block_size)
        hits = []
        while len(hits) < min(limit, len(keys)) and keys[len(hits)] in self.cache:
            hits.append(self.cache[keys[len(hits)]])
        total = (len(tokens) + self.block_size - 1) // self.block_size
        taken_from_free = (total - len(hits)) + len([b for b in hits if not self.refs[b]])
        if taken_from_free > self.num_free_blocks():
            raise NoFreeBlocksError("does not fit")
        table = []
        for block in hits:
            if self.refs[block] == 0:
                self.lru.pop(block)
            self.refs[block] += 1
            table.append(block)
        while len(table) < total:
            table.append(self._take_block())
        record = {"table": table, "tokens": list(tokens), "extra": tuple(extra_keys), "keys": []}
        self.seqs[seq_id] = record
        self._key_full_blocks(record)
        return self.block_size * len(hits)

    def append_slot(self, seq_id, token):
        record = self.seqs[seq_id]
        position = len(record["tokens"])
        if position == len(record["table"]) * self.block_size:
            record["table"].append(self._take_block())
        record["tokens"].append(token)
        self._key_full_blocks(record)
        return record["table"][position // self.block_size], position % self.block_size

    def free(self, seq_id):
        record = self.seqs.pop(seq_id, None)
        if record is None:
            raise ValueError("unknown sequence")
        table = record["table"]
        for index in range(len(table) - 1, -1, -1):
            self._release_block(table[index])


ALTERNATIVES = [PrefixCachingBlockManager]
