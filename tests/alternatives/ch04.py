"""Chapter 4 solved another way: blake2b over a length-prefixed byte encoding, keys built
recursively, and the manager's methods written with explicit loops."""

from __future__ import annotations

import hashlib
import struct

from course.block_manager import NoFreeBlocksError
from course.prefix_cache import ROOT_KEY
from course.prefix_cache import PrefixCachingBlockManager as _Skeleton


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


class PrefixCachingBlockManager(_Skeleton):
    def _cache_full_blocks(self, seq_id):
        # the notebook's skeleton method, calling this module's block_key (as in a notebook,
        # where the skeleton calls the learner's)
        keys, tokens, size = self.seq_keys[seq_id], self.tokens[seq_id], self.block_size
        while (len(keys) + 1) * size <= len(tokens):
            start = len(keys) * size
            keys.append(block_key(keys[-1] if keys else ROOT_KEY, tokens[start:start + size],
                                  self.extra[seq_id]))
            block = self.tables[seq_id][len(keys) - 1]
            if keys[-1] not in self.cache and block not in self.keys:
                self.cache[keys[-1]] = block
                self.keys[block] = keys[-1]

    def _take_block(self):
        if not self.free_queue:
            raise NoFreeBlocksError("the pool is empty")
        block = next(iter(self.free_queue))  # the first is the least recently used
        del self.free_queue[block]
        if block in self.keys:
            self.cache.pop(self.keys.pop(block))
        self.ref_counts[block] = 1
        return block

    def allocate(self, seq_id, tokens, extra_keys=()):
        if seq_id in self.tables:
            raise ValueError("sequence exists")
        keys = prefix_keys(tokens, self.block_size, extra_keys)
        limit = max(0, (len(tokens) - 1) // self.block_size)
        hits = []
        while len(hits) < min(limit, len(keys)) and keys[len(hits)] in self.cache:
            hits.append(self.cache[keys[len(hits)]])
        total = (len(tokens) + self.block_size - 1) // self.block_size
        taken_from_free = (total - len(hits)) + len([b for b in hits if not self.ref_counts[b]])
        if taken_from_free > self.num_free_blocks():
            raise NoFreeBlocksError("does not fit")
        table = []
        for block in hits:
            if self.ref_counts[block] == 0:
                self.free_queue.pop(block)
            self.ref_counts[block] += 1
            table.append(block)
        while len(table) < total:
            table.append(self._take_block())
        self.tables[seq_id] = table
        self.tokens[seq_id] = list(tokens)
        self.extra[seq_id] = tuple(extra_keys)
        self.seq_keys[seq_id] = []
        self._cache_full_blocks(seq_id)
        return self.block_size * len(hits)

    def append_slot(self, seq_id, token):
        position = len(self.tokens[seq_id])
        if position == len(self.tables[seq_id]) * self.block_size:
            self.tables[seq_id].append(self._take_block())
        self.tokens[seq_id].append(token)
        self._cache_full_blocks(seq_id)
        return self.tables[seq_id][position // self.block_size], position % self.block_size

    def free(self, seq_id):
        table = self.tables.pop(seq_id, None)
        if table is None:
            raise ValueError("unknown sequence")
        for index in range(len(table) - 1, -1, -1):
            self._release_block(table[index])
        for store in (self.tokens, self.extra, self.seq_keys):
            del store[seq_id]


ALTERNATIVES = [PrefixCachingBlockManager]
