"""Wrong chapter 4 solutions, as learners write them, with the hint each must get."""

from __future__ import annotations

from course import prefix_cache as reference
from course.prefix_cache import PrefixCachingBlockManager


def _content_only(parent_key, tokens, extra_keys=()):
    return reference.block_key(reference.ROOT_KEY, tokens, extra_keys)


def _run_together(parent_key, tokens, extra_keys=()):
    import hashlib

    text = parent_key + "".join(str(t) for t in tokens) + "".join(map(str, extra_keys))
    return hashlib.sha256(text.encode()).hexdigest()


def _python_hash(parent_key, tokens, extra_keys=()):
    return hash((parent_key, tuple(tokens), tuple(extra_keys)))


def _values_joined(parent_key, tokens, extra_keys=()):
    """Joins every value with a separator: a token moved into the extra keys looks the same."""
    import hashlib

    text = "|".join([parent_key, *map(str, tokens), *map(str, extra_keys)])
    return hashlib.sha256(text.encode()).hexdigest()


def _hash_hexed(parent_key, tokens, extra_keys=()):
    """sha256 over Python's hash(): long enough, but another process gets another key."""
    import hashlib

    return hashlib.sha256(str(hash((parent_key, tuple(tokens), tuple(extra_keys)))).encode()
                          ).hexdigest()


def _partial_block_keyed(tokens, block_size, extra_keys=()):
    keys = reference.prefix_keys(tokens, block_size, extra_keys)
    if len(tokens) % block_size:
        keys.append(reference.block_key(keys[-1] if keys else reference.ROOT_KEY,
                                        tokens[len(keys) * block_size:], extra_keys))
    return keys


def _not_chained(tokens, block_size, extra_keys=()):
    return [reference.block_key(reference.ROOT_KEY, tokens[i:i + block_size], extra_keys)
            for i in range(0, len(tokens) - block_size + 1, block_size)]


class EvictedKeepsKey(PrefixCachingBlockManager):
    def _take_block(self):
        if not self.free_queue:
            raise reference.NoFreeBlocksError("empty")
        block, _ = self.free_queue.popitem(last=False)
        self.ref_counts[block] = 1
        return block


class HitsLastToken(PrefixCachingBlockManager):
    """Lets a prompt hit every full block, its last token's included."""

    def allocate(self, seq_id, tokens, extra_keys=()):
        keys = reference.prefix_keys(tokens, self.block_size, extra_keys)
        hits = []
        for key in keys:
            if key not in self.cache:
                break
            hits.append(self.cache[key])
        needed = -(-len(tokens) // self.block_size) - len(hits)
        revived = sum(1 for b in hits if self.ref_counts[b] == 0)
        if needed + revived > len(self.free_queue):
            raise reference.NoFreeBlocksError("full")
        for block in hits:
            if self.ref_counts[block] == 0:
                del self.free_queue[block]
            self.ref_counts[block] += 1
        self.tables[seq_id] = hits + [self._take_block() for _ in range(needed)]
        self.tokens[seq_id], self.extra[seq_id] = list(tokens), tuple(extra_keys)
        self.seq_keys[seq_id] = []
        self._cache_full_blocks(seq_id)
        return len(hits) * self.block_size


class RevivedNotCounted(PrefixCachingBlockManager):
    """Counts only fresh blocks against the free queue, forgetting that revived ones leave it."""

    def allocate(self, seq_id, tokens, extra_keys=()):
        keys = reference.prefix_keys(tokens, self.block_size, extra_keys)
        max_hits = (len(tokens) - 1) // self.block_size if tokens else 0
        hits = []
        for key in keys[:max_hits]:
            if key not in self.cache:
                break
            hits.append(self.cache[key])
        needed = -(-len(tokens) // self.block_size) - len(hits)
        if needed > len(self.free_queue):
            raise reference.NoFreeBlocksError("full")
        for block in hits:
            if self.ref_counts[block] == 0:
                del self.free_queue[block]
            self.ref_counts[block] += 1
        self.tables[seq_id] = hits + [self._take_block() for _ in range(needed)]
        self.tokens[seq_id], self.extra[seq_id] = list(tokens), tuple(extra_keys)
        self.seq_keys[seq_id] = []
        self._cache_full_blocks(seq_id)
        return len(hits) * self.block_size


def _allocate_fresh_first(self, seq_id, tokens, extra_keys, revive):
    keys = reference.prefix_keys(tokens, self.block_size, extra_keys)
    max_hits = (len(tokens) - 1) // self.block_size if tokens else 0
    hits = []
    for key in keys[:max_hits]:
        if key not in self.cache:
            break
        hits.append(self.cache[key])
    needed = -(-len(tokens) // self.block_size) - len(hits)
    revived = sum(1 for b in hits if self.ref_counts[b] == 0)
    if needed + revived > len(self.free_queue):
        raise reference.NoFreeBlocksError("full")
    fresh = [self._take_block() for _ in range(needed)]  # may evict a hit
    for block in hits:
        revive(block)
        self.ref_counts[block] += 1
    self.tables[seq_id] = hits + fresh
    self.tokens[seq_id], self.extra[seq_id] = list(tokens), tuple(extra_keys)
    self.seq_keys[seq_id] = []
    self._cache_full_blocks(seq_id)
    return len(hits) * self.block_size


class FreshBeforeRevive(PrefixCachingBlockManager):
    """Takes the fresh blocks, then revives the hits (one may have been taken already)."""

    def allocate(self, seq_id, tokens, extra_keys=()):
        def revive(block):
            if self.ref_counts[block] == 0:
                del self.free_queue[block]
        return _allocate_fresh_first(self, seq_id, tokens, extra_keys, revive)


class FreshBeforeReviveQuietly(PrefixCachingBlockManager):
    """The same order, with a revival that ignores a hit no longer in the free queue."""

    def allocate(self, seq_id, tokens, extra_keys=()):
        return _allocate_fresh_first(self, seq_id, tokens, extra_keys,
                                     lambda block: self.free_queue.pop(block, None))


class SkipsMisses(PrefixCachingBlockManager):
    """Looks every key up and keeps the cached ones, instead of stopping at the first miss."""

    def allocate(self, seq_id, tokens, extra_keys=()):
        if seq_id in self.tables:
            raise ValueError("exists")
        keys = reference.prefix_keys(tokens, self.block_size, extra_keys)
        max_hits = (len(tokens) - 1) // self.block_size if tokens else 0
        hits = [self.cache[key] for key in keys[:max_hits] if key in self.cache]
        needed = -(-len(tokens) // self.block_size) - len(hits)
        revived = sum(1 for b in hits if self.ref_counts[b] == 0)
        if needed + revived > len(self.free_queue):
            raise reference.NoFreeBlocksError("full")
        for block in hits:
            if self.ref_counts[block] == 0:
                del self.free_queue[block]
            self.ref_counts[block] += 1
        self.tables[seq_id] = hits + [self._take_block() for _ in range(needed)]
        self.tokens[seq_id], self.extra[seq_id] = list(tokens), tuple(extra_keys)
        self.seq_keys[seq_id] = []
        self._cache_full_blocks(seq_id)
        return len(hits) * self.block_size


class DecodedBlocksNeverCached(PrefixCachingBlockManager):
    def append_slot(self, seq_id, token):
        table, length = self.tables[seq_id], len(self.tokens[seq_id])
        if length % self.block_size == 0:
            table.append(self._take_block())
        self.tokens[seq_id].append(token)
        return table[-1], length % self.block_size


class EvictsBlocksInUse(PrefixCachingBlockManager):
    """Makes every block of a freed sequence evictable, even those others still hold."""

    def free(self, seq_id):
        for block in reversed(self.tables.pop(seq_id)):
            self.ref_counts[block] -= 1
            self.free_queue[block] = None
        del self.tokens[seq_id], self.extra[seq_id], self.seq_keys[seq_id]


class HeadFirst(PrefixCachingBlockManager):
    """Frees a sequence's blocks head first, so its prefix is evicted before its tail."""

    def free(self, seq_id):
        for block in self.tables.pop(seq_id):
            self._release_block(block)
        del self.tokens[seq_id], self.extra[seq_id], self.seq_keys[seq_id]


MUTANTS = {
    "block_key": [(_content_only, "the same tokens after a different prefix"),
                  (_run_together, "runs tokens together"),
                  (_python_hash, "at least 128 bits"),
                  (_values_joined, "moved from the tokens into the extra keys"),
                  (_hash_hexed, "PYTHONHASHSEED")],
    "prefix_keys": [(_partial_block_keyed, "A partial last block has no key"),
                    (_not_chained, "chain its parent's key")],
    "take_block": [(EvictedKeepsKey, "Forget the key")],
    "allocate": [(HitsLastToken, "the last token is always computed"),
                 (FreshBeforeRevive, "Revive the hits first"),
                 (FreshBeforeReviveQuietly, "Revive the hits first"),
                 (SkipsMisses, "stopping at the first miss"), (RevivedNotCounted, "revived")],
    "append_slot": [(DecodedBlocksNeverCached, "cached once it is full")],
    "free": [(EvictsBlocksInUse, "still uses it"),
             (HeadFirst, "tail first")],
}
