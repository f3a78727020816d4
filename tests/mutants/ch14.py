"""Wrong chapter 14 solutions, as learners write them, with the hint each must get; and
``RULES``: each rule the notebook states about a TODO, with the mutants that break it alone.

A list and a tuple of token ids are no mistake here: CBOR writes both as one array, so the
hash is the same. Nor is ``ceil`` against ``floor`` in the router's cost, or its
``decode_blocks`` without the request's own blocks: each adds the same to every engine's
cost, so no choice changes."""

from __future__ import annotations

import hashlib
import json
import pickle

import cbor2

from course.v1.block_hash import hash_block_tokens, none_hash, sha256_cbor
from course.v1.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from course.v1.kv_indexer import KVIndexer
from mutants import Rule


def _named(name: str, fn):
    fn.__name__ = name
    return fn


# --- hash_block_tokens ------------------------------------------------------------------------


def _parent_last(parent_block_hash, token_ids, extra_keys=None):
    return sha256_cbor((tuple(int(t) for t in token_ids), extra_keys, parent_block_hash))


def _pickled(parent_block_hash, token_ids, extra_keys=None):
    payload = pickle.dumps((parent_block_hash, tuple(int(t) for t in token_ids), extra_keys))
    return hashlib.sha256(payload).digest()


def _json_encoded(parent_block_hash, token_ids, extra_keys=None):
    payload = json.dumps([parent_block_hash.hex(), [int(t) for t in token_ids], extra_keys])
    return hashlib.sha256(payload.encode()).digest()


def _hex_digest(parent_block_hash, token_ids, extra_keys=None):
    triple = (parent_block_hash, tuple(int(t) for t in token_ids), extra_keys)
    return hashlib.sha256(cbor2.dumps(triple, canonical=True)).hexdigest()


def _extra_keys_dropped(parent_block_hash, token_ids, extra_keys=None):
    return sha256_cbor((parent_block_hash, tuple(int(t) for t in token_ids)))


def _empty_tuple_for_none(parent_block_hash, token_ids, extra_keys=None):
    return sha256_cbor((parent_block_hash, tuple(int(t) for t in token_ids),
                        tuple(extra_keys or ())))


def _parts_joined(parent_block_hash, token_ids, extra_keys=None):
    tokens = cbor2.dumps(tuple(int(t) for t in token_ids), canonical=True)
    return hashlib.sha256(parent_block_hash + tokens + cbor2.dumps(extra_keys)).digest()


def _numpy_ints_kept(parent_block_hash, token_ids, extra_keys=None):
    return sha256_cbor((parent_block_hash, tuple(token_ids), extra_keys))


def _parent_always_the_none_hash(parent_block_hash, token_ids, extra_keys=None):
    return sha256_cbor((none_hash(), tuple(int(t) for t in token_ids), extra_keys))


def _extra_keys_sorted(parent_block_hash, token_ids, extra_keys=None):
    """Sorts the extra keys "to make them canonical": their order is part of the hash."""
    extra = tuple(sorted(extra_keys)) if extra_keys is not None else None
    return sha256_cbor((parent_block_hash, tuple(int(t) for t in token_ids), extra))


def _encoding_not_hashed(parent_block_hash, token_ids, extra_keys=None):
    return cbor2.dumps((parent_block_hash, tuple(int(t) for t in token_ids), extra_keys),
                       canonical=True)


# --- request_block_hashes ---------------------------------------------------------------------


def _chain(partial=False, last=True, chained=True, default_seed=False, salt_every=False,
           salt_first=False, empty=False, lora_every=True, lora=True, salt=True, bare=False,
           as_tuple=False):
    def request_block_hashes(token_ids, block_size, first_parent, lora_name=None,
                             cache_salt=None):
        hashes = []
        parent = none_hash() if default_seed else first_parent
        end = len(token_ids) if partial else len(token_ids) - block_size + 1
        if not last:
            end -= 1
        for start in range(0, max(end, 0), block_size):
            keys = []
            if lora and lora_name is not None and (lora_every or start == 0):
                keys.append(lora_name)
            if salt and cache_salt is not None and (salt_every or start == 0):
                if salt_first:
                    keys.insert(0, cache_salt)
                else:
                    keys.append(cache_salt)
            if bare and len(keys) == 1:
                extra = keys[0]
            else:
                extra = tuple(keys) if keys or empty else None
            block_hash = hash_block_tokens(parent, token_ids[start:start + block_size], extra)
            hashes.append(block_hash)
            if chained:
                parent = block_hash
        return tuple(hashes) if as_tuple else hashes

    return request_block_hashes


_partial_block_hashed = _named("_partial_block_hashed", _chain(partial=True))
_last_full_block_missed = _named("_last_full_block_missed", _chain(last=False))
_not_chained = _named("_not_chained", _chain(chained=False))
_first_parent_ignored = _named("_first_parent_ignored", _chain(default_seed=True))
_salt_on_every_block = _named("_salt_on_every_block", _chain(salt_every=True))
_salt_before_lora = _named("_salt_before_lora", _chain(salt_first=True))
_empty_tuple_without_keys = _named("_empty_tuple_without_keys", _chain(empty=True))
_lora_on_block_0_only = _named("_lora_on_block_0_only", _chain(lora_every=False))
_lora_left_out = _named("_lora_left_out", _chain(lora=False))
_salt_left_out = _named("_salt_left_out", _chain(salt=False))
_lone_key_not_a_tuple = _named("_lone_key_not_a_tuple", _chain(bare=True))
_hashes_as_a_tuple = _named("_hashes_as_a_tuple", _chain(as_tuple=True))


# --- apply_batch ------------------------------------------------------------------------------


def _apply(self, engine, seq, batch, *, gap=True, gap_returns=1, duplicates=True, restart=True,
           restart_forgets=True, clear_all=False, empty_sets=False, remove_all=False,
           known_only=True, in_order=True, advance=True, engines_too=True, gap_moves=False,
           gap_counts_back=False):
    """``apply_batch`` with one rule read some other way (the arguments say which)."""
    self.add_engine(engine)
    if seq == 0 and restart:
        if restart_forgets:
            self.forget(engine)
        self.last_seq[engine] = -1
    last = self.last_seq[engine]
    if duplicates and seq <= last:
        return None
    if gap and seq > last + 1:
        if gap_moves:
            self.last_seq[engine] = seq
        if gap_counts_back:  # the batch just before this one: right for a gap of one batch
            return seq - 1
        return last + gap_returns
    events = batch.events
    if not in_order:  # stores first, then removals
        events = sorted(events, key=lambda e: not isinstance(e, BlockStored))
    for event in events:
        if isinstance(event, BlockStored):
            for block_hash in event.block_hashes:
                if engines_too:
                    self.engines.setdefault(block_hash, set()).add(engine)
                self.blocks[engine].add(block_hash)
        elif isinstance(event, BlockRemoved):
            for block_hash in event.block_hashes:
                if remove_all:
                    for held in self.blocks.values():
                        held.discard(block_hash)
                    self.engines.pop(block_hash, None)
                    continue
                if known_only and block_hash not in self.blocks[engine]:
                    continue
                self.blocks[engine].discard(block_hash)
                if not engines_too:
                    continue
                self.engines[block_hash].discard(engine)
                if not self.engines[block_hash] and not empty_sets:
                    del self.engines[block_hash]
        elif isinstance(event, AllBlocksCleared):
            for other in list(self.blocks) if clear_all else [engine]:
                self.forget(other)
    if advance:
        self.last_seq[engine] = seq
    return None


def _indexer(name: str, **rule) -> type:
    def apply_batch(self, engine, seq, batch):
        return _apply(self, engine, seq, batch, **rule)

    return type(name, (KVIndexer,), {"apply_batch": apply_batch})


AppliesPastAGap = _indexer("AppliesPastAGap", gap=False)
GapReturnsTheLastApplied = _indexer("GapReturnsTheLastApplied", gap_returns=0)
ReappliesOldBatches = _indexer("ReappliesOldBatches", duplicates=False)
RestartIgnored = _indexer("RestartIgnored", restart=False)
RestartKeepsBlocks = _indexer("RestartKeepsBlocks", restart_forgets=False)
ClearedClearsEveryEngine = _indexer("ClearedClearsEveryEngine", clear_all=True)
LeavesEmptySets = _indexer("LeavesEmptySets", empty_sets=True)
RemovesFromEveryEngine = _indexer("RemovesFromEveryEngine", remove_all=True)
RemovesUnknownBlocks = _indexer("RemovesUnknownBlocks", known_only=False)
StoresBeforeRemovals = _indexer("StoresBeforeRemovals", in_order=False)
LastSeqNeverAdvances = _indexer("LastSeqNeverAdvances", advance=False)
BlocksWithoutEngines = _indexer("BlocksWithoutEngines", engines_too=False)
GapMovesLastSeq = _indexer("GapMovesLastSeq", gap_moves=True)
GapReturnsTheOneBefore = _indexer("GapReturnsTheOneBefore", gap_counts_back=True)


# --- overlap_blocks ---------------------------------------------------------------------------


class CountsEveryBlockHeld(KVIndexer):
    def overlap_blocks(self, block_hashes):
        return {engine: sum(1 for h in block_hashes if h in held)
                for engine, held in self.blocks.items()}


class LeavesOutEnginesWithNone(KVIndexer):
    def overlap_blocks(self, block_hashes):
        overlap = {}
        for engine, held in self.blocks.items():
            depth = 0
            while depth < len(block_hashes) and block_hashes[depth] in held:
                depth += 1
            if depth:
                overlap[engine] = depth
        return overlap


class StopsAtAnyEnginesMiss(KVIndexer):
    def overlap_blocks(self, block_hashes):
        overlap = dict.fromkeys(self.blocks, 0)
        for block_hash in block_hashes:
            holders = self.engines.get(block_hash, set())
            if holders != set(self.blocks):
                break
            for engine in holders:
                overlap[engine] += 1
        return overlap


class CountsFromZero(KVIndexer):
    def overlap_blocks(self, block_hashes):
        overlap = dict.fromkeys(self.blocks, 0)
        candidates = set(self.blocks)
        for depth, block_hash in enumerate(block_hashes):
            candidates &= self.engines.get(block_hash, set())
            if not candidates:
                break
            for engine in candidates:
                overlap[engine] = depth
        return overlap


class NarrowsTheIndexItself(KVIndexer):
    """Narrows the first hash's own set of holders in place: the index loses them."""

    def overlap_blocks(self, block_hashes):
        overlap = dict.fromkeys(self.blocks, 0)
        candidates = None
        for depth, block_hash in enumerate(block_hashes):
            holders = self.engines.get(block_hash, set())
            if candidates is None:
                candidates = holders
            else:
                candidates &= holders
            if not candidates:
                break
            for engine in candidates:
                overlap[engine] = depth + 1
        return overlap


class NumbersEnginesFromZero(KVIndexer):
    """Takes the engines to be 0, 1, ..., len(blocks) - 1."""

    def overlap_blocks(self, block_hashes):
        overlap = {}
        for engine in range(len(self.blocks)):
            held = self.blocks.get(engine, set())
            depth = 0
            for block_hash in block_hashes:
                if block_hash not in held:
                    break
                depth += 1
            overlap[engine] = depth
        return overlap


# --- choose_engine ----------------------------------------------------------------------------


def _choose(weighted="prefill", lowest=True, sort=True, every_engine=True, per_token=False,
            times_size=True, load=True, sign=1, pick=min, lookup="get"):
    def choose_engine(overlaps, active_blocks, num_tokens, block_size,
                      overlap_score_weight=1.0):
        request_blocks = -(-num_tokens // block_size)

        def cost(engine):
            overlap = overlaps[engine] if lookup == "index" else overlaps.get(engine, 0)
            held = overlap * block_size if times_size else overlap
            prefill = (num_tokens - sign * held) / (1 if per_token else block_size)
            decode = (active_blocks[engine] if load else 0) + request_blocks
            if weighted == "prefill":
                return overlap_score_weight * prefill + decode
            if weighted == "decode":
                return prefill + overlap_score_weight * decode
            return prefill + decode

        engines = list(active_blocks) if every_engine else list(overlaps)
        if sort:
            engines.sort(reverse=not lowest)
        return pick(engines, key=cost)

    return choose_engine


_ties_to_the_highest = _named("_ties_to_the_highest", _choose(lowest=False))
_ties_in_dict_order = _named("_ties_in_dict_order", _choose(sort=False))
_weight_left_out = _named("_weight_left_out", _choose(weighted="none"))
_weight_on_decode = _named("_weight_on_decode", _choose(weighted="decode"))
_prefill_in_tokens = _named("_prefill_in_tokens", _choose(per_token=True))
_overlap_as_tokens = _named("_overlap_as_tokens", _choose(times_size=False))
_load_left_out = _named("_load_left_out", _choose(load=False))
_overlap_adds_prefill = _named("_overlap_adds_prefill", _choose(sign=-1))
_highest_cost = _named("_highest_cost", _choose(pick=max))
_missing_engine_looked_up = _named("_missing_engine_looked_up", _choose(lookup="index"))
_only_engines_with_overlaps = _named("_only_engines_with_overlaps",
                                     _choose(every_engine=False))


MUTANTS = {
    "hash_block_tokens": [
        (_parent_last, "the parent first"),
        (_pickled, "pickle's bytes are Python's own"),
        (_json_encoded, "JSON is not CBOR"),
        (_hex_digest, "not its hexdigest()"),
        (_extra_keys_dropped, "The extra keys are the triple's third item"),
        (_empty_tuple_for_none, "not an empty tuple"),
        (_parts_joined, "one CBOR array of three items"),
        (_numpy_ints_kept, "CBOR knows no NumPy integer"),
        (_parent_always_the_none_hash, "The parent is the one given"),
        (_encoding_not_hashed, "not the encoding itself"),
        (_extra_keys_sorted, "in that order"),
    ],
    "request_block_hashes": [
        (_partial_block_hashed, "A partial last block has no hash"),
        (_last_full_block_missed, "expected one per full block"),
        (_not_chained, "the hash of the block before it"),
        (_first_parent_ignored, "Block 0's parent is first_parent, the one given"),
        (_salt_on_every_block, "an extra key of block 0 only"),
        (_salt_before_lora, "lora_name comes first"),
        (_empty_tuple_without_keys, "not an empty tuple"),
        (_lora_on_block_0_only, "an extra key of every block: its K/V differ"),
        (_lora_left_out, "lora_name, when given, is an extra key of every block"),
        (_salt_left_out, "cache_salt, when given, is an extra key of block 0"),
        (_lone_key_not_a_tuple, "extra keys are a tuple, even of one"),
        (_hashes_as_a_tuple, "it promises a list of block hashes"),
    ],
    "apply_batch": [
        (AppliesPastAGap, "A batch past a gap (seq > last_seq + 1) is not applied"),
        (GapReturnsTheLastApplied, "it returned 1, expected 2"),
        (ReappliesOldBatches, "A batch already applied (seq <= last_seq) is ignored"),
        (RestartIgnored, "Batch 0 starts a publisher's life"),
        (RestartKeepsBlocks, "Batch 0 starts a publisher's life"),
        (ClearedClearsEveryEngine, "the other engines keep theirs"),
        (LeavesEmptySets, "no empty set stays behind"),
        (RemovesFromEveryEngine, "engine 1 holds {C}, expected {A, C}"),
        (RemovesUnknownBlocks, "raised KeyError"),
        (StoresBeforeRemovals, "Its events apply in their order"),
        (LastSeqNeverAdvances, "last_seq[0] is -1, expected 0"),
        (BlocksWithoutEngines, "engines and blocks always agree"),
        (GapMovesLastSeq, "and changes nothing"),
        (GapReturnsTheOneBefore, "the first missing sequence number, last_seq + 1"),
    ],
    "overlap_blocks": [
        (CountsEveryBlockHeld, "A block held after the engine's first miss does not count"),
        (LeavesOutEnginesWithNone, "Every engine the index knows has an entry"),
        (StopsAtAnyEnginesMiss, "Each engine stops at its own first miss"),
        (CountsFromZero, "has an overlap of k blocks"),
        (NarrowsTheIndexItself, "a lookup only reads the index"),
        (NumbersEnginesFromZero, "For every engine the index knows (each key of blocks)"),
    ],
    "choose_engine": [
        (_ties_to_the_highest, "Among equal costs, the lowest engine number wins."),
        (_ties_in_dict_order, "Among equal costs, the lowest engine number wins."),
        (_weight_left_out, "overlap_score_weight multiplies prefill_blocks: a larger weight"),
        (_weight_on_decode, "not decode_blocks"),
        (_prefill_in_tokens, "not in tokens"),
        (_overlap_as_tokens, "the tokens it saves are overlap x block_size"),
        (_load_left_out, "a busy engine costs more"),
        (_overlap_adds_prefill, "An overlap saves prefill"),
        (_highest_cost, "The lowest cost wins."),
        (_missing_engine_looked_up, "raised KeyError"),
        (_only_engines_with_overlaps, "Every engine of active_blocks is a candidate"),
    ],
}

RULES = [
    # hash_block_tokens: its docstring, and chapter 14's prose on the encoding
    Rule("the triple (``parent_block_hash``, the block's ``token_ids`` as a tuple of Python "
         "ints, ``extra_keys``), in that order.", "hash_block_tokens",
         ("_parent_last", "_extra_keys_dropped", "_parts_joined", "_numpy_ints_kept",
          "_extra_keys_sorted", "_parent_always_the_none_hash")),
    Rule("The hash of one full block: ``sha256_cbor`` of the triple", "hash_block_tokens",
         ("_pickled", "_json_encoded", "_hex_digest", "_encoding_not_hashed")),
    Rule("``None`` (not an empty tuple) when there are none", "hash_block_tokens",
         ("_empty_tuple_for_none",)),
    # request_block_hashes: its docstring
    Rule("The chained hashes of the full blocks of ``token_ids`` (a partial last block has "
         "none)", "request_block_hashes",
         ("_partial_block_hashed", "_last_full_block_missed", "_hashes_as_a_tuple")),
    Rule("block 0's parent is ``first_parent`` (``none_hash(seed)``), each later block's "
         "parent the block before it.", "request_block_hashes",
         ("_not_chained", "_first_parent_ignored")),
    Rule("A block's extra keys are ``lora_name`` (every block, when given), then "
         "``cache_salt`` (block 0 only, when given), as a tuple;", "request_block_hashes",
         ("_salt_on_every_block", "_salt_before_lora", "_lora_on_block_0_only",
          "_lora_left_out", "_salt_left_out", "_lone_key_not_a_tuple")),
    Rule("``None`` when a block has none.", "request_block_hashes",
         ("_empty_tuple_without_keys",)),
    # apply_batch: the index's rules (the module's, which the notebook states) and docstring
    Rule("batch ``last + 1`` is applied, in order of its events;", "apply_batch",
         ("StoresBeforeRemovals", "LastSeqNeverAdvances")),
    Rule("a batch already applied (``seq <= last``) is ignored: replays can repeat one;",
         "apply_batch", ("ReappliesOldBatches",)),
    Rule("a batch past a gap is not applied: the batches missing come first", "apply_batch",
         ("AppliesPastAGap", "GapMovesLastSeq")),
    Rule("or, past a gap, the first missing sequence number (nothing applied)", "apply_batch",
         ("GapReturnsTheLastApplied", "GapReturnsTheOneBefore")),
    Rule("batch 0 starts a publisher's life: the engine has (re)started, and what the index "
         "held for it is forgotten before the batch is applied.", "apply_batch",
         ("RestartIgnored", "RestartKeepsBlocks")),
    Rule("``BlockStored`` adds each of its hashes to the engine's, ``BlockRemoved`` drops each "
         "of its, ``AllBlocksCleared`` drops them all;", "apply_batch",
         ("ClearedClearsEveryEngine", "RemovesFromEveryEngine", "RemovesUnknownBlocks")),
    Rule("``engines`` and ``blocks`` always agree, and a hash no engine holds is not in "
         "``engines``.", "apply_batch", ("LeavesEmptySets", "BlocksWithoutEngines")),
    # overlap_blocks: its docstring and the class's
    Rule("For every engine the index knows, how many of ``block_hashes`` (a request's chained "
         "hashes, first block first) it holds from the first on, up to its first miss.",
         "overlap_blocks", ("CountsEveryBlockHeld", "LeavesOutEnginesWithNone",
                            "StopsAtAnyEnginesMiss", "CountsFromZero",
                            "NumbersEnginesFromZero")),
    Rule("``engines[h]``: the engines holding block hash ``h``", "overlap_blocks",
         ("NarrowsTheIndexItself",)),
    # choose_engine: its docstring and the module's formula
    Rule("among equal costs, the lowest engine number.", "choose_engine",
         ("_ties_to_the_highest", "_ties_in_dict_order")),
    Rule("cost(e)           = overlap_score_weight * prefill_blocks(e) + decode_blocks(e)",
         "choose_engine", ("_weight_left_out", "_weight_on_decode")),
    Rule("prefill_blocks(e) = (num_tokens - overlap(e) * block_size) / block_size",
         "choose_engine", ("_prefill_in_tokens", "_overlap_as_tokens", "_overlap_adds_prefill")),
    Rule("decode_blocks(e)  = active_blocks(e) + ceil(num_tokens / block_size)",
         "choose_engine", ("_load_left_out",)),
    Rule("The engine of lowest cost (the module's formula)", "choose_engine",
         ("_highest_cost",)),
    Rule("``overlaps[e]`` is engine ``e``'s overlap in blocks (an engine missing from it holds "
         "none), ``active_blocks`` has every engine.", "choose_engine",
         ("_missing_engine_looked_up", "_only_engines_with_overlaps")),
]
