"""Wrong chapter 4 solutions, as learners write them, with the hint each must get."""

from __future__ import annotations

from course.v0 import prefix_cache as reference
from course.v0.prefix_cache import PrefixCachingBlockManager, block_key

from . import Rule


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


def _raw_digest(parent_key, tokens, extra_keys=()):
    """sha256's raw bytes, not its hex digest."""
    import hashlib
    import json

    payload = json.dumps([parent_key, [int(t) for t in tokens], [str(e) for e in extra_keys]])
    return hashlib.sha256(payload.encode()).digest()


def _extra_keys_left_out(parent_key, tokens, extra_keys=()):
    """Hashes the parent key and the tokens; the extra keys change nothing."""
    return reference.block_key(parent_key, tokens)


def _partial_block_keyed(tokens, block_size, extra_keys=()):
    keys = reference.prefix_keys(tokens, block_size, extra_keys)
    if len(tokens) % block_size:
        keys.append(reference.block_key(keys[-1] if keys else reference.ROOT_KEY,
                                        tokens[len(keys) * block_size:], extra_keys))
    return keys


def _not_chained(tokens, block_size, extra_keys=()):
    return [reference.block_key(reference.ROOT_KEY, tokens[i:i + block_size], extra_keys)
            for i in range(0, len(tokens) - block_size + 1, block_size)]


def _rooted_elsewhere(tokens, block_size, extra_keys=()):
    """Chains from an empty parent key instead of ROOT_KEY."""
    keys, parent = [], ""
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = block_key(parent, tokens[start:start + block_size], extra_keys)
        keys.append(parent)
    return keys


def _extra_keys_not_passed_on(tokens, block_size, extra_keys=()):
    """Chains the blocks' keys without passing the extra keys on to block_key."""
    return reference.prefix_keys(tokens, block_size)


def _last_full_block_missed(tokens, block_size, extra_keys=()):
    """Stops one block early: a prompt that fills its last block gets no key for it."""
    keys, parent = [], reference.ROOT_KEY
    for start in range(0, len(tokens) - block_size, block_size):
        parent = reference.block_key(parent, tokens[start:start + block_size], extra_keys)
        keys.append(parent)
    return keys


def _take(self, *, newest=False, forget=("keys", "cache"), counted=True, looks=True):
    """Taking a free block with one step read some other way (the arguments say which)."""
    if looks and not self.free_queue:
        raise reference.NoFreeBlocksError("empty")
    block, _ = self.free_queue.popitem(last=newest)
    key = self.keys.pop(block, None) if "keys" in forget else self.keys.get(block)
    if key is not None and "cache" in forget:
        del self.cache[key]
    if counted:
        self.ref_counts[block] = 1
    return block


class EvictedKeepsKey(PrefixCachingBlockManager):
    """Takes a cached block without forgetting its key."""

    def _take_block(self):
        return _take(self, forget=())


class TakesTheNewest(PrefixCachingBlockManager):
    """Pops the most recently used end of the free queue."""

    def _take_block(self):
        return _take(self, newest=True)


class ForgetsOnlyTheBlocksKey(PrefixCachingBlockManager):
    """Forgets the evicted block's key in keys but leaves it in cache."""

    def _take_block(self):
        return _take(self, forget=("keys",))


class TakesWithoutAReference(PrefixCachingBlockManager):
    """Hands the block out with its count still 0."""

    def _take_block(self):
        return _take(self, counted=False)


class RunsOutWithKeyError(PrefixCachingBlockManager):
    """Pops without looking: an empty free queue raises the OrderedDict's KeyError."""

    def _take_block(self):
        return _take(self, looks=False)


def _allocate(self, seq_id, tokens, extra_keys, *, id_checked=True, capped=True,
              stops_at_miss=True, revived_counted=True, room_checked=True, order="revive_first",
              cached=True, counts="tokens"):
    """Allocation with one step read some other way (the arguments say which)."""
    if id_checked and seq_id in self.tables:
        raise ValueError("exists")
    keys = reference.prefix_keys(tokens, self.block_size, extra_keys)
    max_hits = (len(tokens) - 1) // self.block_size if tokens else 0
    hits = []
    for key in keys[:max_hits] if capped else keys:
        if key in self.cache:
            hits.append(self.cache[key])
        elif stops_at_miss:
            break
    needed = -(-len(tokens) // self.block_size) - len(hits)
    revived = sum(1 for b in hits if self.ref_counts[b] == 0) if revived_counted else 0
    if room_checked and needed + revived > len(self.free_queue):
        raise reference.NoFreeBlocksError("full")
    fresh_first = order in ("fresh_first", "fresh_first_quietly")
    fresh = [self._take_block() for _ in range(needed)] if fresh_first else []
    for block in hits:
        if order == "fresh_first_quietly":  # a hit taken as a fresh block is no longer there
            self.free_queue.pop(block, None)
        elif self.ref_counts[block] == 0 and order != "stays_free":
            del self.free_queue[block]
        self.ref_counts[block] += 1
    if not fresh_first:
        fresh = [self._take_block() for _ in range(needed)]
    self.tables[seq_id] = hits + fresh
    self.tokens[seq_id], self.extra[seq_id] = list(tokens), tuple(extra_keys)
    self.seq_keys[seq_id] = []
    if cached:
        self._cache_full_blocks(seq_id)
    return len(hits) * (self.block_size if counts == "tokens" else 1)


class AllocatesOverAnExistingId(PrefixCachingBlockManager):
    """Never looks the id up: allocating it again replaces its table."""

    def allocate(self, seq_id, tokens, extra_keys=()):
        return _allocate(self, seq_id, tokens, extra_keys, id_checked=False)


class HitsLastToken(PrefixCachingBlockManager):
    """Lets a prompt hit every full block, its last token's included."""

    def allocate(self, seq_id, tokens, extra_keys=()):
        return _allocate(self, seq_id, tokens, extra_keys, capped=False)


class SkipsMisses(PrefixCachingBlockManager):
    """Looks every key up and keeps the cached ones, instead of stopping at the first miss."""

    def allocate(self, seq_id, tokens, extra_keys=()):
        return _allocate(self, seq_id, tokens, extra_keys, stops_at_miss=False)


class RevivedNotCounted(PrefixCachingBlockManager):
    """Counts only fresh blocks against the free queue, forgetting that revived ones leave it."""

    def allocate(self, seq_id, tokens, extra_keys=()):
        return _allocate(self, seq_id, tokens, extra_keys, revived_counted=False)


class TakesUntilItRunsOut(PrefixCachingBlockManager):
    """Counts nothing first: revives the hits and takes fresh blocks until the free queue runs
    dry, leaving what it took taken."""

    def allocate(self, seq_id, tokens, extra_keys=()):
        return _allocate(self, seq_id, tokens, extra_keys, room_checked=False)


class FreshBeforeRevive(PrefixCachingBlockManager):
    """Takes the fresh blocks, then revives the hits (one may have been taken already)."""

    def allocate(self, seq_id, tokens, extra_keys=()):
        return _allocate(self, seq_id, tokens, extra_keys, order="fresh_first")


class FreshBeforeReviveQuietly(PrefixCachingBlockManager):
    """The same order, with a revival that ignores a hit no longer in the free queue."""

    def allocate(self, seq_id, tokens, extra_keys=()):
        return _allocate(self, seq_id, tokens, extra_keys, order="fresh_first_quietly")


class RevivedStaysInTheFreeQueue(PrefixCachingBlockManager):
    """Counts a revived hit's reference but leaves it in the free queue, evictable."""

    def allocate(self, seq_id, tokens, extra_keys=()):
        return _allocate(self, seq_id, tokens, extra_keys, order="stays_free")


class PromptBlocksNeverCached(PrefixCachingBlockManager):
    """Records the sequence but never calls _cache_full_blocks: a prompt's blocks are never
    cached."""

    def allocate(self, seq_id, tokens, extra_keys=()):
        return _allocate(self, seq_id, tokens, extra_keys, cached=False)


class ReturnsHitBlocks(PrefixCachingBlockManager):
    """Returns how many blocks hit, not how many tokens."""

    def allocate(self, seq_id, tokens, extra_keys=()):
        return _allocate(self, seq_id, tokens, extra_keys, counts="blocks")


class DecodedBlocksNeverCached(PrefixCachingBlockManager):
    def append_slot(self, seq_id, token):
        table, length = self.tables[seq_id], len(self.tokens[seq_id])
        if length % self.block_size == 0:
            table.append(self._take_block())
        self.tokens[seq_id].append(token)
        return table[-1], length % self.block_size


class TakesABlockOnceFull(PrefixCachingBlockManager):
    """Counts the token, then compares with >=: a token that fills the last block also takes
    the next one."""

    def append_slot(self, seq_id, token):
        tokens, table = self.tokens[seq_id], self.tables[seq_id]
        tokens.append(token)
        if len(tokens) >= len(table) * self.block_size:
            table.append(self._take_block())
        self._cache_full_blocks(seq_id)
        position = len(tokens) - 1
        return table[position // self.block_size], position % self.block_size


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


class FreeOfAnUnknownIdIsQuiet(PrefixCachingBlockManager):
    """Returns quietly for an unknown or already-freed sequence."""

    def free(self, seq_id):
        if seq_id in self.tables:
            super().free(seq_id)


class ForgetsKeysOnFree(PrefixCachingBlockManager):
    """Evicts at once: a freed block with no reference left loses its key."""

    def free(self, seq_id):
        table = self.tables[seq_id]
        super().free(seq_id)
        for block in table:
            if self.ref_counts[block] == 0 and block in self.keys:
                del self.cache[self.keys.pop(block)]


UNSEEN_BY_THE_PROBE = {RunsOutWithKeyError, AllocatesOverAnExistingId, FreeOfAnUnknownIdIsQuiet}
"""Mutants that the notebook's probe (``course.experiments.prefix_sim.probe``) takes for correct:
they differ from a correct manager only on paths it does not take (a take from an empty free queue,
an id allocated twice, a second free)."""

MUTANTS = {
    "block_key": [(_content_only, "the same tokens after a different prefix"),
                  (_run_together, "runs tokens together"),
                  (_python_hash, "at least 128 bits"),
                  (_values_joined, "moved from the tokens into the extra keys"),
                  (_hash_hexed, "PYTHONHASHSEED"),
                  (_raw_digest, "hexdigest(), not digest()"),
                  (_extra_keys_left_out, "the extra keys (a LoRA adapter, a cache salt) change")],
    "prefix_keys": [(_partial_block_keyed, "A partial last block has no key"),
                    (_not_chained, "chain its parent's key"),
                    (_extra_keys_not_passed_on, "pass them to block_key"),
                    (_last_full_block_missed, "expected one per full block"),
                    (_rooted_elsewhere, "the chain starts from ROOT_KEY")],
    "take_block": [(EvictedKeepsKey, "Forget the key"),
                   (ForgetsOnlyTheBlocksKey, "Forget the key"),
                   (TakesTheNewest, "least recently used first"),
                   (TakesWithoutAReference, "must have one reference"),
                   (RunsOutWithKeyError, "expected NoFreeBlocksError")],
    "allocate": [(HitsLastToken, "the last token is always computed"),
                 (FreshBeforeRevive, "Revive the hits first"),
                 (FreshBeforeReviveQuietly, "Revive the hits first"),
                 (SkipsMisses, "stopping at the first miss"), (RevivedNotCounted, "revived"),
                 (AllocatesOverAnExistingId, "allocated again; expected ValueError"),
                 (TakesUntilItRunsOut, "all or nothing"),
                 (RevivedStaysInTheFreeQueue, "they leave the free queue"),
                 (PromptBlocksNeverCached, "A block is cached once it is full"),
                 (ReturnsHitBlocks, "not the number of hit blocks")],
    "append_slot": [(DecodedBlocksNeverCached, "cached once it is full"),
                    (TakesABlockOnceFull, "not when it fills it")],
    "free": [(EvictsBlocksInUse, "still uses it"),
             (HeadFirst, "tail first"),
             (FreeOfAnUnknownIdIsQuiet, "raised nothing; expected KeyError"),
             (ForgetsKeysOnFree, "it loses its key only when it is evicted")],
}

RULES = [
    Rule("A token's key and value depend on every token before it: attention mixed them in. So "
         "a cached block may be reused only by a prompt whose tokens match from the very start "
         "up to the block's end.", "block_key", ("_content_only",)),
    Rule("Python's hash() is 64 bits (collisions become likely over billions of blocks) and "
         "runs tokens together if you feed it a string.", "block_key", ("_run_together",)),
    Rule("H must be a strong hash over a canonical encoding: sha256 of, for example, a JSON "
         "list. Python's hash() is 64 bits (collisions become likely over billions of blocks)",
         "block_key", ("_python_hash",)),
    Rule("Write block_key: a hex digest of sha256 over a canonical encoding of (parent_key, "
         "tokens, extra_keys).", "block_key", ("_raw_digest",)),
    Rule("extra holds anything else the KV depends on: a LoRA adapter's id, or a cache salt "
         "that keeps one tenant's cache from serving another's.", "block_key",
         ("_extra_keys_left_out",)),
    Rule("Inputs that differ anywhere get different keys, also when a value moves from the end "
         "of tokens into extra_keys", "block_key", ("_values_joined",)),
    Rule("equal inputs get the same key in every process, today and tomorrow (Python's hash() "
         "of a string changes with PYTHONHASHSEED, so it cannot name a block another process "
         "cached).", "block_key", ("_hash_hexed",)),
    Rule("Write prefix_keys: the chained keys of a prompt's full blocks", "prefix_keys",
         ("_not_chained",)),
    Rule("starting from ROOT_KEY.", "prefix_keys", ("_rooted_elsewhere",)),
    Rule("Keys of the full blocks of tokens, chained from ROOT_KEY; a partial last block has "
         "none.", "prefix_keys", ("_partial_block_keyed", "_last_full_block_missed")),
    Rule("k0 = H(ROOT_KEY, t0..t15, extra)", "prefix_keys", ("_extra_keys_not_passed_on",)),
    Rule("Write _take_block: pop the least recently used free block", "take_block",
         ("TakesTheNewest",)),
    Rule("if it was cached, evict it (forget its key in both maps, or a later prompt would reuse "
         "content that is no longer there)", "take_block",
         ("EvictedKeepsKey", "ForgetsOnlyTheBlocksKey")),
    Rule("give it one reference", "take_block", ("TakesWithoutAReference",)),
    Rule("An empty free queue raises NoFreeBlocksError.", "take_block", ("RunsOutWithKeyError",)),
    Rule("It returns how many prompt tokens were cache hits", "allocate", ("ReturnsHitBlocks",)),
    Rule("compute the prompt's keys and take the longest run of cached blocks from the start, "
         "stopping at the first miss", "allocate", ("SkipsMisses",)),
    Rule("at most (n - 1) // block_size blocks may hit, so that the last token is always "
         "computed", "allocate", ("HitsLastToken",)),
    Rule("a hit block with no reference is revived: it leaves the free queue.", "allocate",
         ("RevivedStaysInTheFreeQueue",)),
    Rule("So fresh blocks plus revived ones must fit in the free queue", "allocate",
         ("RevivedNotCounted",)),
    Rule("if not, raise NoFreeBlocksError before changing anything", "allocate",
         ("TakesUntilItRunsOut",)),
    Rule("an id that already has blocks raises ValueError", "allocate",
         ("AllocatesOverAnExistingId",)),
    Rule("revive the hits first, then take the fresh blocks", "allocate",
         ("FreshBeforeRevive", "FreshBeforeReviveQuietly")),
    Rule("record the sequence (tables, tokens, extra, seq_keys = []), and call "
         "_cache_full_blocks.", "allocate", ("PromptBlocksNeverCached",)),
    Rule("take a fresh block when the last one is full", "append_slot",
         ("TakesABlockOnceFull",)),
    Rule("cache the block once it fills (_cache_full_blocks), so a later prompt that repeats "
         "this conversation hits it", "append_slot", ("DecodedBlocksNeverCached",)),
    Rule("release the sequence's blocks tail first, so that its prefix, the part most likely to "
         "be shared again, is evicted last.", "free", ("HeadFirst",)),
    Rule("Unknown sequences raise KeyError.", "free", ("FreeOfAnUnknownIdIsQuiet",)),
    Rule("_release_block(block), which drops a reference and, at zero, puts the block at the "
         "LRU end of the free queue", "free", ("EvictsBlocksInUse",)),
    Rule("keeping its key: it stays cached, now evictable.", "free", ("ForgetsKeysOnFree",)),
]
