"""Chapter 14's hidden checks, and the oracles the visible checks ask.

Each oracle is written another way than the answers: block hashes through a canonical CBOR
encoder written here by hand (RFC 8949's major types for integers, byte and text strings,
arrays and null, with the shortest header), never a CBOR library; the index as a log of every
event each engine's applied batches carried since its last restart, its holdings replayed
from that log at every step; the router's choice in exact fractions, every engine's cost
worked out and the lowest taken by a plain scan. The thorough checks draw their cases from
hypothesis, derandomized (the same cases at every grading), and play the index through a
state machine and long seeded runs of deliveries: in order, repeated, out of order past a
gap, engines restarted, caches cleared, removals of blocks never stored, engines sharing
blocks.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import random
from collections.abc import Callable
from fractions import Fraction

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from autograder.checks._contract import INT, expect_cases
from autograder.checks._helpers import (
    for_all,
    mistakes,
    run_stateful,
)
from autograder.checks._lending import one_bug_one_todo_of_function
from autograder.checks.ch14 import (
    BATCH_SCRIPTS,
    CHAIN_CASES,
    CHOOSE_CASES,
    CHOOSE_IDEA,
    HASH_CASES,
    OVERLAP_HOLDINGS,
    OVERLAP_REQUESTS,
    IndexHarness,
    expect_hash,
    hex_of,
    parent_bytes,
    run_chain,
    run_hash,
    run_overlaps,
    run_script,
)
from autograder.private import thorough

SEED = 2039  # random cases are seeded: grading a notebook twice gives the same score


# --- canonical CBOR, by hand ------------------------------------------------------------------


def _head(major: int, n: int) -> bytes:
    """A data item's head: major type and argument ``n``, in the fewest bytes (canonical)."""
    for limit, info, size in ((24, None, 0), (1 << 8, 24, 1), (1 << 16, 25, 2),
                              (1 << 32, 26, 4), (1 << 64, 27, 8)):
        if n < limit:
            if info is None:
                return bytes([major << 5 | n])
            return bytes([major << 5 | info]) + n.to_bytes(size, "big")
    raise ValueError(f"{n} needs a bignum")


def cbor(value: object) -> bytes:
    """RFC 8949's canonical encoding of None, a bool, an int, bytes, a str, or a list or tuple
    of those."""
    if value is None:
        return b"\xf6"  # major type 7, simple value 22
    if value is True or value is False:
        return b"\xf5" if value else b"\xf4"
    if isinstance(value, int):
        major, n = (0, value) if value >= 0 else (1, -1 - value)
        if n < 1 << 64:
            return _head(major, n)
        magnitude = n.to_bytes((n.bit_length() + 7) // 8, "big")  # a bignum: tag 2 or 3
        return bytes([0xC2 + major]) + _head(2, len(magnitude)) + magnitude
    if isinstance(value, bytes):
        return _head(2, len(value)) + value
    if isinstance(value, str):
        text = value.encode("utf-8")
        return _head(3, len(text)) + text
    if isinstance(value, list | tuple):
        return _head(4, len(value)) + b"".join(cbor(item) for item in value)
    raise TypeError(f"no CBOR here for {type(value).__name__}")


def digest(value: object) -> bytes:
    return hashlib.sha256(cbor(value)).digest()


def seed_hash(seed: str) -> bytes:
    """What ``none_hash(seed)`` is: the hash of the seed string."""
    return digest(seed)


# --- hash_block_tokens ------------------------------------------------------------------------

_ORDER = ("The triple is (parent_block_hash, the token ids, extra_keys), in that order: the "
          "parent first.")
_HASH_MISTAKES = [
    (lambda parent, tokens, extra: digest([list(tokens), extra, parent]), _ORDER),
    (lambda parent, tokens, extra: digest([list(tokens), parent, extra]), _ORDER),
    (lambda parent, tokens, extra: digest([parent, list(tokens)]),
     "The extra keys are the triple's third item, None when there are none: left out, a "
     "LoRA adapter's block and the base model's get one hash."),
    (lambda parent, tokens, extra: digest([parent, list(tokens), []]) if extra is None
     else None, "No extra keys is None (CBOR's null, byte 0xF6), not an empty tuple (an "
     "empty array, byte 0x80): the bytes differ, and so does the hash."),
    (lambda parent, tokens, extra: hashlib.sha256(pickle.dumps(
        (parent, tuple(tokens), extra))).digest(),
     "pickle's bytes are Python's own (its protocol, its types): the fleet hashes canonical "
     "CBOR, which every engine and the router write alike, in any language."),
    (lambda parent, tokens, extra: hashlib.sha256(json.dumps(
        [parent.hex(), list(tokens), extra]).encode()).digest(),
     "JSON is not CBOR: the fleet hashes the canonical CBOR of the triple (cbor2.dumps(..., "
     "canonical=True), or the given sha256_cbor)."),
    (lambda parent, tokens, extra: hashlib.sha256(
        parent + cbor(list(tokens)) + cbor(extra)).digest(),
     "The triple is encoded as one CBOR array of three items, not each part encoded and the "
     "bytes joined."),
    (lambda parent, tokens, extra: digest([seed_hash("0"), list(tokens), extra]),
     "The parent is the one given, parent_block_hash: only a prompt's first block has the "
     "none hash for parent."),
]


def hash_case(parent: bytes, tokens: list[int], extra: tuple | None) -> tuple:
    """The hash of one block, and what each known mistake gives."""
    return digest([parent, [int(t) for t in tokens], extra]), mistakes(
        _HASH_MISTAKES, dict(parent=parent, tokens=tokens, extra=extra))


_TOKENS = st.one_of(st.integers(0, 300), st.sampled_from(
    [23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 151_935]), st.integers(0, 2**40))
_EXTRAS = st.one_of(st.none(), st.tuples(st.text(min_size=1, max_size=30)),
                    st.tuples(st.sampled_from(["sql-lora", "x" * 24, "y" * 300, "tenant-ü"]),
                              st.sampled_from(["salt", "", "中文盐"])))


@st.composite
def _blocks(draw) -> tuple:
    parent = draw(st.one_of(st.sampled_from([seed_hash("0"), seed_hash("42")]),
                            st.binary(min_size=32, max_size=32)))
    tokens = draw(st.lists(_TOKENS, min_size=1, max_size=20))
    form = draw(st.sampled_from(["list", "tuple", "numpy"]))
    return parent, tokens, draw(_EXTRAS), form


def _drawn_hash(fn: Callable, block: tuple) -> None:
    import numpy as np

    parent, tokens, extra, form = block
    given = {"list": list, "tuple": tuple, "numpy": lambda t: np.array(t, dtype=np.int64)}
    expect_hash(fn, f"hash_block_tokens({hex_of(parent)}, {form} {tokens}, {extra!r})", parent,
                given[form](tokens), extra, hash_case(parent, tokens, extra))


@thorough
def check_hash_block_tokens_thoroughly(fn: Callable) -> None:
    """The visible cases, then drawn blocks: token ids from 0 to 2^40 (every CBOR integer
    header), given as a list, a tuple or a NumPy array; parents from other seeds or any 32
    bytes; extra keys none, one or two, texts long enough for a longer header, and not
    ASCII."""
    for case in HASH_CASES:
        run_hash(fn, case, _hash_answers(case))
    for_all(_blocks(), lambda block: _drawn_hash(fn, block), max_examples=100)


def _hash_answers(case: dict) -> tuple:
    return hash_case(parent_bytes(case["parent"]), list(case["tokens"]), case["extra"])


# --- request_block_hashes ---------------------------------------------------------------------


def _chain_with(partial: bool = False, last: bool = True, chained: bool = True,
                own_parent: bool = True, salt_every: bool = False, salt_first: bool = False,
                empty: bool = False, lora_every: bool = True, lora: bool = True,
                salt: bool = True, bare: bool = False) -> Callable:
    """The chain worked out block by block; each flag away from its default is one rule
    broken."""

    def chain(tokens, block_size, parent, lora_name, cache_salt):
        count = -(-len(tokens) // block_size) if partial else len(tokens) // block_size
        count -= 0 if last or count == 0 else 1
        first = parent if own_parent else seed_hash("0")
        hashes = []
        for i in range(count):
            keys = []
            if lora and lora_name and (lora_every or i == 0):
                keys.append(lora_name)
            if salt and cache_salt and (salt_every or i == 0):
                keys.insert(0 if salt_first else len(keys), cache_salt)
            extra = (keys[0] if bare and len(keys) == 1 else tuple(keys)) if keys else (
                () if empty else None)
            block = [int(t) for t in tokens[i * block_size:(i + 1) * block_size]]
            before = hashes[-1] if hashes and chained else first
            hashes.append(digest([before, block, extra]))
        return hashes

    return chain


_CHAIN_MISTAKES = [
    (_chain_with(partial=True), "A partial last block has no hash: its tokens may still "
     "change."),
    (_chain_with(last=False), "A block that ends at the last token is full: it has a hash."),
    (_chain_with(chained=False), "Each block's parent is the hash of the block before it "
     "(only block 0's is first_parent): so a hash names its whole prefix."),
    (_chain_with(own_parent=False), "Block 0's parent is first_parent, the one given (its "
     "seed's none hash), not none_hash() of the default seed."),
    (_chain_with(salt_every=True), "cache_salt is an extra key of block 0 only: every later "
     "hash chains from block 0's, so the salt reaches them all through it."),
    (_chain_with(salt_first=True), "lora_name comes first in a block's extra keys, then "
     "cache_salt."),
    (_chain_with(empty=True), "A block with no extra keys has None for them, not an empty "
     "tuple: CBOR writes the two differently."),
    (_chain_with(lora_every=False), "lora_name is an extra key of every block: its K/V differ "
     "from the base model's in every block."),
    (_chain_with(lora=False), "lora_name, when given, is an extra key of every block."),
    (_chain_with(salt=False), "cache_salt, when given, is an extra key of block 0."),
    (_chain_with(bare=True), "A block's extra keys are a tuple, even of one: (lora_name,), "
     "not the name alone."),
]


def chain_case(tokens: list[int], block_size: int, parent: bytes, lora_name: str | None,
               cache_salt: str | None) -> tuple:
    """The chained hashes of a request, and what each known mistake gives."""
    case = dict(tokens=tokens, block_size=block_size, parent=parent, lora_name=lora_name,
                cache_salt=cache_salt)
    return _chain_with()(**case), mistakes(_CHAIN_MISTAKES, case)


@st.composite
def _requests(draw) -> dict:
    return dict(tokens=draw(st.lists(st.integers(0, 70_000), max_size=40)),
                block_size=draw(st.sampled_from([1, 2, 3, 4, 16])),
                parent=draw(st.sampled_from(["none_hash('0')", "none_hash('1')",
                                             "a parent hash"])),
                lora_name=draw(st.sampled_from([None, None, "sql-lora", "lora-ü"])),
                cache_salt=draw(st.sampled_from([None, None, "tenant-42", "s"])),
                text="a drawn request")


@thorough
def check_request_block_hashes_thoroughly(fn: Callable) -> None:
    """The visible cases, then drawn requests: 0 to 40 tokens, blocks of 1 to 16 (lengths on
    and off block boundaries), seeds, LoRA names and salts. Where the learner's function fails
    them, again with the course's hash_block_tokens lent to it, so that a wrong
    hash_block_tokens costs that TODO alone."""
    from course.v1.block_hash import hash_block_tokens

    probe = (HASH_CASES[1], _hash_answers(HASH_CASES[1]))

    def answers(case: dict) -> tuple:
        return chain_case(list(case["tokens"]), case["block_size"],
                          parent_bytes(case["parent"]), case["lora_name"], case["cache_salt"])

    def check(subject: Callable) -> None:
        for case in CHAIN_CASES:
            run_chain(subject, case, answers(case), probe)
        for_all(_requests(), lambda case: run_chain(subject, case, answers(case), probe),
                max_examples=150)

    one_bug_one_todo_of_function(check, fn, {"hash_block_tokens": hash_block_tokens})


# --- apply_batch: the index as every engine's log of events ------------------------------------


class IndexModel:
    """The index's rules, written as logs: for each engine, every event of the batches applied
    since its last batch 0, and the last batch applied; what an engine holds is its log
    replayed from the start, at every step."""

    def __init__(self, engines: list[int]) -> None:
        self.logs: dict[int, list[tuple]] = {e: [] for e in engines}
        self.last = dict.fromkeys(engines, -1)

    def holds(self, engine: int) -> set[str]:
        held: set[str] = set()
        for kind, *rest in self.logs[engine]:
            if kind == "cleared":
                held = set()
            elif kind == "stored":
                held |= set(rest[0])
            else:
                held -= set(rest[0])
        return held

    def deliver(self, engine: int, seq: int, events: list[tuple]) -> dict:
        """What ``apply_batch(engine, seq, events)`` returns and leaves, and the rule it
        meets."""
        last, returned = self.last[engine], None
        if seq == 0:
            kind, self.logs[engine], self.last[engine] = "restart", [tuple(e) for e in events], 0
        elif seq <= last:
            kind = "duplicate"
        elif seq == last + 1:
            kind = "next"
            self.logs[engine] += [tuple(e) for e in events]
            self.last[engine] = seq
        else:
            kind, returned = "gap", last + 1
        return {"kind": kind, "returned": returned, "last_seq": dict(self.last),
                "blocks": {e: sorted(self.holds(e)) for e in self.logs}}


def batch_case(run: dict) -> list[dict]:
    """What each step of a scripted run returns and leaves."""
    model = IndexModel(run["engines"])
    return [model.deliver(*step) for step in run["steps"]]


_LABELS = st.lists(st.sampled_from("ABCDEF"), min_size=1, max_size=3).map("".join)
_EVENTS = st.lists(st.one_of(st.tuples(st.just("stored"), _LABELS),
                             st.tuples(st.just("removed"), _LABELS),
                             st.just(("cleared",))), max_size=3)


def _batch_machine(cls: type) -> type:

    class IndexMachine(RuleBasedStateMachine):
        """Engines publish batches; the index is handed them in order, again, past gaps,
        and from engines restarted."""

        h: IndexHarness

        @initialize(count=st.integers(1, 3))
        def start(self, count: int) -> None:
            engines = list(range(count))
            self.h, self.model = IndexHarness(cls, engines), IndexModel(engines)
            self.published: dict[int, list] = {e: [] for e in engines}

        def deliver(self, engine: int, seq: int) -> None:
            events = self.published[engine][seq]
            self.h.deliver(engine, seq, events, self.model.deliver(engine, seq, events))

        @rule(data=st.data(), events=_EVENTS)
        def publish_and_deliver(self, data: st.DataObject, events: list) -> None:
            engine = data.draw(st.sampled_from(sorted(self.published)))
            self.published[engine].append(events)
            if data.draw(st.booleans()):
                self.deliver(engine, len(self.published[engine]) - 1)

        @rule(data=st.data())
        def deliver_next(self, data: st.DataObject) -> None:
            engine = data.draw(st.sampled_from(sorted(self.published)))
            seq = self.model.last[engine] + 1
            if seq < len(self.published[engine]):
                self.deliver(engine, seq)

        @rule(data=st.data())
        def deliver_any(self, data: st.DataObject) -> None:
            engine = data.draw(st.sampled_from(sorted(self.published)))
            if self.published[engine]:
                self.deliver(engine, data.draw(
                    st.integers(0, len(self.published[engine]) - 1)))

        @rule(data=st.data(), events=_EVENTS)
        def restart(self, data: st.DataObject, events: list) -> None:
            engine = data.draw(st.sampled_from(sorted(self.published)))
            self.published[engine] = [events]
            if data.draw(st.booleans()):
                self.deliver(engine, 0)

    return IndexMachine


def _random_events(rng: random.Random) -> list[tuple]:
    events = []
    for _ in range(rng.randint(0, 3)):
        kind = rng.choices(["stored", "removed", "cleared"], [6, 4, 1])[0]
        labels = "".join(rng.sample("ABCDEFGH", rng.randint(1, 3)))
        events.append(("cleared",) if kind == "cleared" else (kind, labels))
    return events


def long_run(seed: int, engines: int, steps: int) -> dict:
    """A long seeded run of deliveries: mostly the next batch, else one again, one past a
    gap (then the ones missing), or an engine restarted."""
    rng = random.Random(seed)
    published = {e: [] for e in range(engines)}
    model = IndexModel(list(published))
    run: list[list] = []
    while len(run) < steps:
        engine = rng.randrange(engines)
        batches = published[engine]
        choice = rng.random()
        if choice < 0.06:
            batches[:] = [_random_events(rng)]
            seq = 0
        else:
            while len(batches) < model.last[engine] + 4:
                batches.append(_random_events(rng))
            if choice < 0.7:
                seq = model.last[engine] + 1
            elif choice < 0.85:
                seq = rng.randrange(model.last[engine] + 2, len(batches))
            else:
                seq = rng.randrange(0, max(1, model.last[engine] + 1))
        run.append([engine, seq, batches[seq]])
        model.deliver(engine, seq, batches[seq])
    return {"engines": list(published), "steps": run}


LONG_RUNS = [long_run(SEED + i, engines, 250) for i, engines in enumerate((3, 2, 4))]


@thorough
def check_apply_batch_thoroughly(cls: type) -> None:
    """The visible runs; then a state machine: one to three engines publishing batches of
    drawn events (stores, removals of blocks held or never stored, caches cleared) over
    blocks they share, the index handed them in order, again, past gaps, and from engines
    restarted; then three seeded runs of 250 deliveries. After every batch, what it returned,
    each engine's blocks and last_seq, and engines agreeing with blocks, no empty set left."""
    for _, run in BATCH_SCRIPTS:
        run_script(cls, run, batch_case(run))
    run_stateful(_batch_machine(cls), max_examples=50, steps=30)
    for run in LONG_RUNS:
        run_script(cls, run, batch_case(run))


# --- overlap_blocks ---------------------------------------------------------------------------


def _overlaps_with(leading: bool = True, every_engine: bool = True, own_miss: bool = True,
                   shift: int = 0) -> Callable:
    """Each engine's overlap, counted engine by engine; each flag away from its default is
    one rule broken."""

    def overlaps(holdings, request):
        found = {}
        stopped = len(request)
        if not own_miss:  # everyone stops at the first hash some engine misses
            stopped = next((i for i, x in enumerate(request)
                            if any(x not in held for held in holdings.values())), len(request))
        for engine, held in holdings.items():
            count = 0
            for x in request[:stopped]:
                if x in held:
                    count += 1
                elif leading:
                    break
            found[engine] = max(0, count - shift) if count else 0
        return found if every_engine else {e: n for e, n in found.items() if n}

    return overlaps


_OVERLAP_MISTAKES = [
    (_overlaps_with(leading=False), "A block held after the engine's first miss does not "
     "count: its hash names a prefix the request does not share with that engine."),
    (_overlaps_with(every_engine=False), "Every engine the index knows has an entry, 0 when "
     "it holds none of the request's first blocks: the router weighs each engine."),
    (_overlaps_with(own_miss=False), "Each engine stops at its own first miss: another "
     "engine's miss does not stop it."),
    (_overlaps_with(shift=1), "An engine that holds the request's first k hashes has an "
     "overlap of k blocks."),
]


def overlap_case(holdings: dict[int, str], request: str) -> tuple:
    """Each engine's overlap with ``request``, and what each known mistake gives."""
    case = dict(holdings=holdings, request=request)
    return _overlaps_with()(**case), mistakes(_OVERLAP_MISTAKES, case)


@st.composite
def _lookups(draw) -> tuple:
    engines = draw(st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True))
    pool = "ABCDEF"
    holdings = {e: "".join(sorted(draw(st.sets(st.sampled_from(pool))))) for e in engines}
    requests = draw(st.lists(st.lists(st.sampled_from(pool), max_size=6, unique=True).map(
        "".join), min_size=1, max_size=3))
    return holdings, requests


@thorough
def check_overlap_blocks_thoroughly(cls: type) -> None:
    """The visible lookups, then drawn indexes (one to four engines, numbered 0 to 7, each
    holding any of six blocks) and requests of up to six of them; after each lookup, the index
    holds what it held."""
    run_overlaps(cls, OVERLAP_HOLDINGS, OVERLAP_REQUESTS,
                 [overlap_case(OVERLAP_HOLDINGS, r) for r in OVERLAP_REQUESTS])
    for_all(_lookups(), lambda c: run_overlaps(cls, c[0], c[1], [
        overlap_case(c[0], r) for r in c[1]]), max_examples=200)


# --- choose_engine ----------------------------------------------------------------------------


def _choose_with(weight: str = "prefill", lowest: bool = True, missing: bool = True,
                 per_token: bool = False, times_size: bool = True, load: bool = True,
                 sign: int = 1, most: bool = False) -> Callable:
    """Every engine's cost in fractions, the best found by a scan; each flag away from its
    default is one rule broken."""

    def choose(overlaps, active_blocks, num_tokens, block_size, overlap_score_weight=1.0):
        w = Fraction(overlap_score_weight)
        request_blocks = -(-num_tokens // block_size)
        best = None
        for engine in sorted(active_blocks) if missing else sorted(overlaps):
            overlap = overlaps[engine] if engine in overlaps else 0
            held = overlap * block_size if times_size else overlap
            prefill = Fraction(num_tokens - sign * held) / (1 if per_token else block_size)
            decode = (active_blocks[engine] if load else 0) + request_blocks
            cost = {"prefill": w * prefill + decode, "decode": prefill + w * decode,
                    "none": prefill + decode}[weight]
            cost = -cost if most else cost
            if best is None or cost < best[0] or (cost == best[0] and not lowest):
                best = (cost, engine)
        return best[1]

    return choose


_CHOOSE_MISTAKES = [
    (_choose_with(lowest=False), "Among equal costs, the lowest engine number wins."),
    (_choose_with(weight="none"), "overlap_score_weight multiplies prefill_blocks: a larger "
     "weight follows the cache onto a busier engine, 0 is least loaded."),
    (_choose_with(weight="decode"), "overlap_score_weight multiplies prefill_blocks, not "
     "decode_blocks."),
    (_choose_with(per_token=True), "prefill_blocks is in blocks: (num_tokens - overlap x "
     "block_size) / block_size, not in tokens."),
    (_choose_with(times_size=False), "The overlap is in blocks: the tokens it saves are "
     "overlap x block_size."),
    (_choose_with(load=False), "decode_blocks counts the engine's active blocks: a busy "
     "engine costs more."),
    (_choose_with(sign=-1), "An overlap saves prefill: prefill_blocks is num_tokens minus the "
     "tokens the engine holds, over block_size."),
    (_choose_with(most=True), "The lowest cost wins."),
    (_choose_with(missing=False), "Every engine of active_blocks is a candidate: one missing "
     "from overlaps holds none of the request (overlap 0), and may still be the best."),
]


def choose_case(**case) -> tuple:
    """The engine chosen, and what each known mistake gives."""
    return _choose_with()(**case), mistakes(_CHOOSE_MISTAKES, case)


@st.composite
def _routes(draw) -> dict:
    engines = draw(st.permutations(range(draw(st.integers(1, 5)))))
    active = {e: draw(st.integers(0, 12)) for e in engines}
    overlaps = {e: draw(st.integers(0, 6)) for e in engines if draw(st.booleans())}
    # block sizes powers of two and dyadic weights: a float cost is exact, as the fractions
    return dict(overlaps=overlaps, active_blocks=active,
                num_tokens=draw(st.integers(1, 200)),
                block_size=draw(st.sampled_from([1, 2, 4, 8, 16, 32])),
                overlap_score_weight=draw(st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0])))


@thorough
def check_choose_engine_thoroughly(fn: Callable) -> None:
    """The visible cases, then drawn fleets of one to five engines (engines listed in any
    order, some missing from overlaps), loads, overlaps, prompt lengths, block sizes and
    weights, ties among them."""
    expect_cases(fn, CHOOSE_CASES, choose_case, CHOOSE_IDEA, rel_tol=0, promise=INT)
    for_all(_routes(), lambda case: expect_cases(fn, [case], choose_case, CHOOSE_IDEA,
                                                 rel_tol=0, promise=INT), max_examples=300)

