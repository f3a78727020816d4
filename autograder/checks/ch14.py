"""Visible checks for chapter 14, a fleet of engines: each TODO's readable cases. Expected
values, and what known mistakes give, come from the chapter's hidden module
(``autograder.private``), asked with the inputs the checks build, before the code under test
runs; the thorough checks are there too.

Block hashes are compared byte for byte, and shown as their first bytes in hex. The index
(``KVIndexer``, a class built in two steps) is driven through short scripted runs of event
batches, each step's return and what the index then holds (``blocks``, ``engines``,
``last_seq``) read back as plain data and compared with what the rules leave; its lookup is
asked of an index restored from a snapshot (the class's own ``restore``), so that it never
depends on the other method. The router's choice is held to its contract case by case.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Callable

import numpy as np

from autograder.checks._contract import INT, _raised_by, expect_cases
from autograder.checks._harness import Harness
from autograder.checks._helpers import LearnerRaised, learner_call
from autograder.private import private, visible
from course.v1.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

SUBJECT = "KVIndexer"  # the index's checks take the learner's class
SUBJECT_CHECKS = {"apply_batch", "overlap_blocks"}

HASH_IDEA = ("A block's hash is sha256 over the canonical CBOR encoding of one triple, "
             "(parent_block_hash, the block's token ids as a tuple of Python ints, "
             "extra_keys), in that order: the digest's 32 bytes, as vLLM's sha256_cbor gives "
             "them, so that every engine and the router name a block alike.")
CHAIN_IDEA = ("Only full blocks have a hash: block i holds tokens [i x block_size, (i + 1) x "
              "block_size). Block 0's parent is first_parent, each later block's parent the "
              "hash of the block before it. A block's extra keys are lora_name (every block, "
              "when given), then cache_salt (block 0 only, when given), as a tuple; None when "
              "a block has none.")
EVENTS_IDEA = ("Its events apply in their order: BlockStored adds each of its hashes to the "
               "engine's, BlockRemoved drops each of its (a hash the engine does not hold: "
               "nothing), AllBlocksCleared drops all of that engine's.")
BATCH_IDEA = ("Batch last_seq + 1 is applied. " + EVENTS_IDEA + " Then last_seq is that "
              "batch's number, and it returns None.")
OTHERS_IDEA = ("A batch changes only what its own engine holds: the other engines keep theirs "
               "(through an AllBlocksCleared too).")
DUPLICATE_IDEA = ("A batch already applied (seq <= last_seq) is ignored: replays can repeat "
                  "one. It returns None and changes nothing.")
GAP_IDEA = ("A batch past a gap (seq > last_seq + 1) is not applied: the batches missing come "
            "first. It returns the first missing sequence number, last_seq + 1, and changes "
            "nothing.")
RESTART_IDEA = ("Batch 0 starts a publisher's life: the engine has (re)started, so what the "
                "index held for it is forgotten (its blocks, and its last_seq) before the "
                "batch is applied; last_seq is 0 after it. " + EVENTS_IDEA)
AGREE_IDEA = ("engines and blocks always agree: engines[h] holds engine e exactly when "
              "blocks[e] holds h, and a hash no engine holds is not in engines (no empty set "
              "stays behind).")
OVERLAP_IDEA = ("For every engine the index knows (each key of blocks), count the request's "
                "hashes it holds from the first on, stopping at its own first miss: a hash "
                "names its whole prefix, so a block held after a miss is another prefix's. An "
                "engine that holds none of them has 0.")
CHOOSE_IDEA = ("cost(e) = overlap_score_weight x prefill_blocks(e) + decode_blocks(e), where "
               "prefill_blocks(e) = (num_tokens - overlap(e) x block_size) / block_size and "
               "decode_blocks(e) = active_blocks[e] + ceil(num_tokens / block_size); overlap(e) "
               "is 0 for an engine missing from overlaps, every engine of active_blocks is a "
               "candidate, the lowest cost wins, and the lowest engine number among equals.")

# --- showing hashes ---------------------------------------------------------------------------


def hex_of(value: bytes) -> str:
    """A hash as a hint shows it: its first 4 bytes in hex."""
    return value[:4].hex() + "..."


def shown(value: object) -> str:
    """What came back, short: bytes as hex, a list of bytes as a list of those."""
    if type(value) is bytes:
        return f"{len(value)} bytes {hex_of(value)}" if len(value) != 32 else hex_of(value)
    if type(value) in (list, tuple) and all(type(v) is bytes for v in value):
        items = ", ".join(hex_of(v) for v in value)
        return f"[{items}]" if type(value) is list else f"({items})"
    text = repr(value)
    return text if len(text) <= 80 else f"an object of type {type(value).__name__}"


def _said(got: object, known: list[tuple[object, str]], idea: str) -> str:
    """The known mistake that gives exactly ``got`` (compared as plain bytes), else ``idea``."""
    found = [text for value, text in known if value is not None and _equal(got, value)]
    if not found:
        return idea
    return ("Perhaps: " if len(found) > 1 else "") + " Or: ".join(found)


def _equal(got: object, want: object) -> bool:
    """``got`` is ``want``: bytes, or a list of bytes, by type and value (never the learner's
    own equality)."""
    if type(want) is bytes:
        return type(got) is bytes and bytes.__eq__(got, want) is True
    if type(want) is list:
        return type(got) is list and len(got) == len(want) and all(
            _equal(g, w) for g, w in zip(got, want, strict=True))
    return False


def _a_hash(call: str, got: object, idea: str) -> str | None:
    """Why ``got`` is not a block hash (32 bytes), or None."""
    if type(got) is bytes and len(got) == 32:
        return None
    if isinstance(got, str):
        return (f"{call} returned the string {shown(got)}: a block hash is sha256's digest(), "
                "32 bytes, not its hexdigest(). " + idea)
    if type(got) is bytes and len(got) > 32:
        return (f"{call} returned {len(got)} bytes, {hex_of(got)}: a block hash is the sha256 "
                "of the encoding, 32 bytes, not the encoding itself. " + idea)
    if type(got) is bytes:
        return (f"{call} returned {len(got)} bytes, {hex_of(got)}: a block hash is sha256's "
                "digest, 32 bytes. " + idea)
    return f"{call} returned {shown(got)}, a {type(got).__name__}; a block hash is 32 bytes. " \
        + idea


# --- hash_block_tokens ------------------------------------------------------------------------


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


NONE_HASH_0 = "none_hash('0')"  # how a hint names each parent the cases use
PARENTS = {"a parent hash": _digest("a parent")}


def parent_bytes(name: str) -> bytes:
    """A parent the cases name: the seed's none hash (the course's given ``none_hash``), or a
    fixed 32 bytes."""
    from course.v1.block_hash import none_hash

    if name.startswith("none_hash("):
        return none_hash(name.split("'")[1])
    return PARENTS[name]


def _hash_case(parent: str, tokens: list[int], extra: tuple | None, text: str,
               numpy: bool = False) -> dict:
    return dict(parent=parent, tokens=tokens, extra=extra, text=text, numpy=numpy)


HASH_CASES = [
    _hash_case(NONE_HASH_0, [1, 2, 3, 4], None, "a prompt's first block, no extra keys"),
    _hash_case("a parent hash", [23, 24, 255, 256, 65535, 65536, 100000, 0], None,
               "token ids where CBOR's integer header grows: 23 and 24, 255 and 256, 65535 "
               "and 65536"),
    _hash_case(NONE_HASH_0, [5, 6, 7, 8], ("sql-lora",), "a LoRA adapter's name as extra key"),
    _hash_case(NONE_HASH_0, [5, 6, 7, 8], ("sql-lora", "tenant-42"),
               "a LoRA adapter's name, then a cache salt"),
    _hash_case(NONE_HASH_0, [1, 2, 3, 4], None,
               "the first case's block given as a NumPy array of int64, as a tokenizer may "
               "give it", numpy=True),
]


def hash_call(case: dict) -> str:
    tokens = f"np.array({case['tokens']})" if case["numpy"] else str(case["tokens"])
    return f"hash_block_tokens({case['parent']}, {tokens}, {case['extra']!r})"


def run_hash(fn: Callable, case: dict, answers: tuple) -> None:
    """``fn`` on ``case`` against ``answers`` (the hash, what the known mistakes give)."""
    tokens = np.array(case["tokens"], dtype=np.int64) if case["numpy"] else list(case["tokens"])
    expect_hash(fn, f"{hash_call(case)} ({case['text']})", parent_bytes(case["parent"]), tokens,
                case["extra"], answers)


def expect_hash(fn: Callable, call: str, parent: bytes, tokens: object, extra: object,
                answers: tuple) -> None:
    """``fn(parent, tokens, extra)``, shown as ``call``, against ``answers`` (the hash, what
    the known mistakes give)."""
    expected, known = answers
    try:
        got = learner_call("hash_block_tokens", fn, parent, tokens, extra)
    except LearnerRaised as failure:
        python = (" Token ids go in as Python ints, int(t): CBOR knows no NumPy integer."
                  if isinstance(tokens, np.ndarray) else "")
        raise AssertionError(f"{failure}, when called as {call}.{python} {HASH_IDEA}"
                             ) from None
    wrong = _a_hash(call, got, HASH_IDEA)
    if wrong:
        raise AssertionError(wrong)
    if not _equal(got, expected):
        raise AssertionError(f"{call} returned {hex_of(got)}, expected {hex_of(expected)}. "
                             f"{_said(got, known, HASH_IDEA)}")


def hash_answers(case: dict) -> tuple:
    """Asked of the hidden module: the hash of ``case``, and what known mistakes give."""
    return private("14").hash_case(parent_bytes(case["parent"]), list(case["tokens"]),
                                   case["extra"])


@visible
def check_hash_block_tokens(fn: Callable) -> None:
    """A first block with no extra keys; token ids where CBOR's integer header grows (23/24,
    255/256, 65535/65536); a LoRA name as extra key; a LoRA name and a salt; the first block
    given as a NumPy array."""
    answers = [hash_answers(case) for case in HASH_CASES]  # asked first
    for case, answer in zip(HASH_CASES, answers, strict=True):
        run_hash(fn, case, answer)


# --- request_block_hashes ---------------------------------------------------------------------


def _chain_case(tokens: list[int], block_size: int, parent: str = NONE_HASH_0,
                lora_name: str | None = None, cache_salt: str | None = None,
                text: str = "") -> dict:
    return dict(tokens=tokens, block_size=block_size, parent=parent, lora_name=lora_name,
                cache_salt=cache_salt, text=text)


CHAIN_CASES = [
    _chain_case(list(range(1, 11)), 4, text="10 tokens in blocks of 4: the last 2 are a "
                "partial block"),
    _chain_case(list(range(1, 9)), 4, text="8 tokens: two full blocks"),
    _chain_case([7, 8, 9], 4, text="3 tokens: no full block"),
    _chain_case(list(range(1, 13)), 4, parent="none_hash('1')",
                text="another seed's none hash as first parent"),
    _chain_case(list(range(1, 13)), 4, lora_name="sql-lora", text="a LoRA adapter"),
    _chain_case(list(range(1, 13)), 4, cache_salt="tenant-42", text="a cache salt"),
    _chain_case(list(range(1, 13)), 4, lora_name="sql-lora", cache_salt="tenant-42",
                text="a LoRA adapter and a cache salt"),
]


def chain_call(case: dict) -> str:
    extra = "".join(f", {name}={case[name]!r}" for name in ("lora_name", "cache_salt")
                    if case[name] is not None)
    return (f"request_block_hashes({case['tokens']}, {case['block_size']}, {case['parent']}"
            f"{extra})")


def chain_answers(case: dict) -> tuple:
    """Asked of the hidden module: the hashes of ``case``, and what known mistakes give."""
    return private("14").chain_case(list(case["tokens"]), case["block_size"],
                                    parent_bytes(case["parent"]), case["lora_name"],
                                    case["cache_salt"])


def _earlier_wrong(fn: Callable, probe: tuple[dict, tuple]) -> str | None:
    """Where the ``hash_block_tokens`` beside ``fn`` (the notebook's, which it calls by name)
    is unwritten or wrong on the ``probe`` case (and its answers): the hint that says to fix
    it first."""
    other = getattr(fn, "__globals__", {}).get("hash_block_tokens")
    if not callable(other) or other is fn:
        return None
    try:
        run_hash(other, *probe)
    except AssertionError as failed:
        if isinstance(failed.__context__, NotImplementedError):
            return ("hash_block_tokens, which it builds on, is not written yet: write "
                    "hash_block_tokens first, then run this test again.")
        return ("hash_block_tokens, which it builds on, fails its own test: fix "
                "hash_block_tokens first, then run this test again.")
    return None


def run_chain(fn: Callable, case: dict, answers: tuple, probe: tuple[dict, tuple]) -> None:
    """``fn`` on ``case`` against ``answers``; where it fails and the notebook's
    ``hash_block_tokens`` is wrong on ``probe``, the hint says to fix that first."""
    expected, known = answers
    call = f"{chain_call(case)} ({case['text']})"
    try:
        got = learner_call("request_block_hashes", fn, list(case["tokens"]),
                           case["block_size"], parent_bytes(case["parent"]),
                           lora_name=case["lora_name"], cache_salt=case["cache_salt"])
    except LearnerRaised as failure:
        raise AssertionError(f"{failure}, when called as {call}. "
                             f"{_earlier_wrong(fn, probe) or CHAIN_IDEA}") from None
    except AssertionError as failed:  # a stub's NotImplementedError: whose stub?
        stub = failed.__context__
        if isinstance(stub, NotImplementedError) and not _raised_by(fn, stub):
            raise AssertionError(_earlier_wrong(fn, probe) or str(failed)) from None
        raise
    full = len(case["tokens"]) // case["block_size"]
    if type(got) is not list:
        raise AssertionError(f"{call} returned {shown(got)}, a {type(got).__name__}; it "
                             f"promises a list of block hashes (bytes), one per full block: "
                             f"{full}.")
    if len(got) != len(expected):
        partial = " A partial last block has no hash: its tokens may still change." \
            if len(got) > full else ""
        raise AssertionError(f"{call} returned {len(got)} hashes, expected one per full "
                             f"block: {len(case['tokens'])} // {case['block_size']} = {full}."
                             f"{partial} {CHAIN_IDEA}")
    for place, (one, want) in enumerate(zip(got, expected, strict=True)):
        if _a_hash("", one, "") is not None:
            raise AssertionError(_a_hash(f"{call}: hash {place}", one,
                                         _earlier_wrong(fn, probe) or CHAIN_IDEA))
        if not _equal(one, want):
            said = _earlier_wrong(fn, probe) or _said(got, known, CHAIN_IDEA)
            raise AssertionError(f"{call} returned {shown(got)}, expected {shown(expected)}: "
                                 f"hash {place} (block {place}) is the first wrong. {said}")


@visible
def check_request_block_hashes(fn: Callable) -> None:
    """Blocks of 4: 10 tokens (two hashes; the last 2 tokens have none), 8 (two), 3 (none);
    another seed's none hash as first parent; a LoRA adapter; a cache salt; both."""
    probe = HASH_CASES[1]  # a parent not the none hash: a hash that ignores its parent shows
    asked = [chain_answers(case) for case in CHAIN_CASES]  # asked first
    probe_answers = hash_answers(probe)
    for case, answer in zip(CHAIN_CASES, asked, strict=True):
        run_chain(fn, case, answer, (probe, probe_answers))


# --- the index: scripted runs of event batches ------------------------------------------------

LABELS = "ABCDEFGH"
HASHES = {label: _digest(f"block {label}") for label in LABELS}  # a block's hash, by label
LABEL_OF = {value: label for label, value in HASHES.items()}


def label(value: object) -> str:
    """A hash as a hint names it: its label, else its first bytes."""
    if type(value) is bytes and value in LABEL_OF:
        return LABEL_OF[value]
    return hex_of(value) if type(value) is bytes else repr(value)


def event_text(event: tuple) -> str:
    """An event of a script, as code: ``("stored", "AB")`` is ``BlockStored([A, B])``."""
    kind, *rest = event
    if kind == "cleared":
        return "AllBlocksCleared()"
    name = "BlockStored" if kind == "stored" else "BlockRemoved"
    return f"{name}([{', '.join(rest[0])}])"


def make_event(event: tuple) -> object:
    kind, *rest = event
    if kind == "cleared":
        return AllBlocksCleared()
    hashes = [HASHES[x] for x in rest[0]]
    if kind == "removed":
        return BlockRemoved(block_hashes=hashes)
    return BlockStored(block_hashes=hashes, parent_block_hash=None,
                       token_ids=list(range(4 * len(hashes))), block_size=4)


def make_batch(events: list[tuple]) -> KVEventBatch:
    return KVEventBatch(ts=0.0, events=[make_event(e) for e in events])


def _set_text(values) -> str:
    return "{" + ", ".join(sorted(str(v) for v in values)) + "}"


class IndexHarness(Harness):
    """The learner's index, the operations so far, and each step's state read back as plain
    data: ``blocks`` (engine -> sorted labels), ``engines`` (label -> sorted engines),
    ``last_seq`` (engine -> int)."""

    def __init__(self, cls: type, engines: list[int],
                 holdings: dict[int, str] | None = None) -> None:
        """A fresh index that knows ``engines``; or, given ``holdings`` (engine -> labels), one
        restored from a snapshot where each engine holds those blocks."""
        super().__init__()
        self.known = list(engines)
        if holdings is not None:
            snapshot = {e: (0, [HASHES[x] for x in held]) for e, held in holdings.items()}
            self.index = self.call(f"index = KVIndexer.restore({snapshot_text(holdings)})",
                                   lambda: cls.restore(snapshot))
            return
        self.index = self.call("index = KVIndexer()", cls)
        for engine in engines:
            self.call(f"index.add_engine({engine})", lambda e=engine: self.index.add_engine(e))

    def call(self, text: str, action: Callable[[], object],
             allowed: tuple[type[BaseException], ...] = ()) -> object:
        """``Harness.call``, a ``KeyError`` naming a block by its label (A, B, ...), not by
        its 32 bytes."""
        try:
            return super().call(text, action, (KeyError, *allowed))
        except KeyError as exc:
            if KeyError in allowed:
                raise
            self.fail(f"{text} raised KeyError: {label(exc.args[0] if exc.args else None)}")

    def read(self) -> dict:
        """What the index holds, as plain data; a hint where it holds what no index can."""
        try:
            return self._read()
        except AssertionError:
            raise
        except Exception as exc:
            self.fail(f"its blocks, engines and last_seq could not be read ({type(exc).__name__}"
                      f": {exc}): blocks maps each engine to a set of hashes, engines each hash "
                      "to a set of engines, last_seq each engine to an int.")

    def _read(self) -> dict:
        index = self.index
        blocks: dict[int, list[str]] = {}
        for engine in self.known:
            held = index.blocks.get(engine)
            if held is None:
                self.fail(f"index.blocks has no entry for engine {engine}, which the index "
                          "knows: blocks[e] is the set of hashes engine e holds, empty when it "
                          "holds none.", RESTART_IDEA)
            items = list(held)
            if any(type(h) is not bytes for h in items):
                self.fail(f"index.blocks[{engine}] holds {shown(items)}: block hashes are "
                          "the events' bytes, kept as they came.")
            blocks[engine] = sorted(label(h) for h in items)
        engines: dict[str, list[int]] = {}
        for key, holders in list(index.engines.items()):
            members = list(holders)
            if type(key) is not bytes or any(type(e) is not int for e in members):
                self.fail(f"index.engines[{label(key)}] is {shown(members)}: engines maps each "
                          "block hash (bytes) to the set of engine numbers holding it.")
            engines[label(key)] = sorted(members)
        last = {}
        for engine in self.known:
            value = index.last_seq.get(engine)
            if type(value) is not int:
                self.fail(f"index.last_seq[{engine}] is {shown(value)}: the number of the last "
                          "batch of that engine applied (-1: none yet), an int.")
            last[engine] = value
        return {"blocks": blocks, "engines": engines, "last_seq": last}

    def agree(self, state: dict) -> None:
        """``engines`` and ``blocks`` say the same, with no empty set."""
        inverse: dict[str, list[int]] = {}
        for engine, held in state["blocks"].items():
            for block in held:
                inverse.setdefault(block, []).append(engine)
        for block, holders in state["engines"].items():
            if not holders:
                self.fail(f"index.engines[{block}] is an empty set.", AGREE_IDEA)
        for block in sorted(set(inverse) | set(state["engines"])):
            said = state["engines"].get(block)
            if said != sorted(inverse.get(block, [])):
                self.fail(f"index.engines[{block}] is "
                          f"{'missing' if said is None else _set_text(said)}, but the engines "
                          f"whose blocks hold {block} are {_set_text(inverse.get(block, []))}.",
                          AGREE_IDEA)

    def deliver(self, engine: int, seq: int, events: list[tuple], want: dict) -> None:
        """``index.apply_batch(engine, seq, batch)`` against ``want`` (what it returns, the
        blocks and last_seq it leaves, and which rule the batch meets)."""
        text = f"index.apply_batch({engine}, {seq}, [{', '.join(map(event_text, events))}])"
        got = self.call(text, lambda: self.index.apply_batch(engine, seq, make_batch(events)))
        idea = {"next": BATCH_IDEA, "duplicate": DUPLICATE_IDEA, "gap": GAP_IDEA,
                "restart": RESTART_IDEA}[want["kind"]]
        expected = want["returned"]
        right = got is None if expected is None else type(got) is int and got == expected
        if not right:
            self.fail(f"it returned {shown(got)}, expected {expected}.", idea)
        state = self.read()
        for engine_, held in sorted(want["blocks"].items(), key=lambda e: e[0] != engine):
            if state["blocks"][engine_] != held:
                self.fail(f"engine {engine_} holds {_set_text(state['blocks'][engine_])}, "
                          f"expected {_set_text(held)}.", idea if engine_ == engine
                          else OTHERS_IDEA)
        for engine_, last in want["last_seq"].items():
            if state["last_seq"][engine_] != last:
                self.fail(f"last_seq[{engine_}] is {state['last_seq'][engine_]}, expected "
                          f"{last}.", idea)
        self.agree(state)


def script(engines: list[int], *steps: tuple) -> dict:
    """A scripted run: the engines added, then each step ``(engine, seq, events)``."""
    return {"engines": list(engines), "steps": [list(step) for step in steps]}


def stored(blocks: str) -> tuple:
    return ("stored", blocks)


def removed(blocks: str) -> tuple:
    return ("removed", blocks)


CLEARED = ("cleared",)

BATCH_SCRIPTS = [
    ("two engines sharing block A", script(
        [0, 1],
        (0, 0, [stored("AB")]),
        (1, 0, [stored("AC")]),
        (0, 1, [removed("A")]),
        (1, 1, [removed("A")]),
        (0, 2, [removed("D")]),
        (1, 2, [stored("D"), removed("D"), removed("C"), stored("C")]))),
    ("batches repeated and a gap", script(
        [0],
        (0, 0, [stored("A")]),
        (0, 1, [stored("B")]),
        (0, 1, [stored("B")]),
        (0, 3, [removed("A")]),
        (0, 2, [stored("C"), removed("B")]),
        (0, 3, [removed("A")]),
        (0, 1, [stored("B")]))),
    ("a cleared cache and a restarted engine", script(
        [0, 1],
        (0, 0, [stored("AB")]),
        (1, 0, [stored("A")]),
        (0, 1, [CLEARED, stored("C")]),
        (0, 2, [stored("D")]),
        (0, 0, [stored("E")]),
        (0, 1, [stored("F")]))),
]


def run_script(cls: type, run: dict, answers: list[dict]) -> None:
    h = IndexHarness(cls, run["engines"])
    for (engine, seq, events), want in zip(run["steps"], answers, strict=True):
        h.deliver(engine, seq, events, want)


@visible
def check_apply_batch(cls: type) -> None:
    """Two engines sharing a block (one drops it, then the other; a removal of a block never
    stored; events applied in their order); batches repeated and one past a gap; a cache
    cleared and an engine restarted (its batch 0 again)."""
    answers = [private("14").batch_case(run) for _, run in BATCH_SCRIPTS]  # asked first
    for (_, run), answer in zip(BATCH_SCRIPTS, answers, strict=True):
        run_script(cls, run, answer)


# --- overlap_blocks ---------------------------------------------------------------------------


def snapshot_text(holdings: dict[int, str]) -> str:
    return "{" + ", ".join(f"{e}: (0, [{', '.join(held)}])" for e, held in holdings.items()) \
        + "}"


def plain_overlaps(got: object) -> dict[int, int] | None:
    """``got`` as a plain dict of int to int, or None where it is none."""
    if not isinstance(got, dict):
        return None
    plain = {}
    for key, value in list(got.items()):
        try:
            key, value = operator.index(key), operator.index(value)
        except TypeError:
            return None
        if type(key) is not int or type(value) is not int or isinstance(key, bool):
            return None
        plain[key] = value
    return plain


def run_overlaps(cls: type, holdings: dict[int, str], requests: list[str],
                 answers: list[tuple]) -> None:
    """An index restored to ``holdings`` (engine -> labels), each request (labels) looked up
    in turn, against ``answers`` (the overlaps, what known mistakes give); the index holds
    the same after them."""
    h = IndexHarness(cls, list(holdings), holdings)
    for request, (expected, known) in zip(requests, answers, strict=True):
        text = f"index.overlap_blocks([{', '.join(request)}])"
        got = h.call(text, lambda r=request: h.index.overlap_blocks([HASHES[x] for x in r]))
        plain = plain_overlaps(got)
        if plain is None:
            h.fail(f"it returned {shown(got)}; it promises a dict of engine number to overlap "
                   f"in blocks, here {expected}.", OVERLAP_IDEA)
        if plain != expected:
            found = [said for value, said in known if value == plain]
            h.fail(f"it returned {plain}, expected {expected}.",
                   ("Perhaps: " if len(found) > 1 else "") + " Or: ".join(found)
                   if found else OVERLAP_IDEA)
        _unchanged(h, holdings)


def _unchanged(h: IndexHarness, holdings: dict[int, str]) -> None:
    """The index still holds ``holdings``: a lookup only reads it."""
    state = h.read()
    engines: dict[str, list[int]] = {}
    for engine, held in holdings.items():
        for block in held:
            engines.setdefault(block, []).append(engine)
        if state["blocks"][engine] != sorted(held):
            h.fail(f"engine {engine} holds {_set_text(state['blocks'][engine])}, expected "
                   f"{_set_text(held)}: a lookup only reads the index, and changes nothing "
                   "it holds.")
    for block in sorted(set(engines) | set(state["engines"])):
        if state["engines"].get(block) != sorted(engines.get(block, [])):
            said = state["engines"].get(block)
            h.fail(f"index.engines[{block}] is {'missing' if said is None else _set_text(said)}"
                   f", expected {_set_text(engines.get(block, []))}: a lookup only reads the "
                   "index, and changes nothing it holds.")


OVERLAP_HOLDINGS = {0: "ABC", 1: "AC", 2: "", 3: "BC"}
OVERLAP_REQUESTS = ["ABCD", "BC", "A", "", "E"]


@visible
def check_overlap_blocks(cls: type) -> None:
    """Four engines: 0 holds A B C, 1 holds A and C (not B), 2 nothing, 3 B and C (not A);
    requests A B C D (engine 1 stops at B; 3 holds nothing from the first), B C, A, none, and
    E, which no engine holds."""
    answers = [private("14").overlap_case(OVERLAP_HOLDINGS, request)
               for request in OVERLAP_REQUESTS]  # asked first
    run_overlaps(cls, OVERLAP_HOLDINGS, OVERLAP_REQUESTS, answers)


# --- choose_engine ----------------------------------------------------------------------------


def _route(overlaps: dict, active: dict, num_tokens: int, block_size: int,
           weight: float = 1.0) -> dict:
    return dict(overlaps=overlaps, active_blocks=active, num_tokens=num_tokens,
                block_size=block_size, overlap_score_weight=weight)


CHOOSE_CASES = [
    _route({0: 2, 1: 2, 2: 0, 3: 0}, {0: 1, 1: 1, 2: 4, 3: 2}, 64, 16),
    _route({3: 0}, {0: 1, 1: 3, 2: 0, 3: 2}, 24, 4, 0.5),
    _route({0: 0, 1: 1, 2: 4, 3: 4}, {0: 5, 1: 1, 2: 5, 3: 3}, 99, 16, 0.0),
    _route({0: 0, 1: 2, 2: 5}, {0: 0, 1: 0, 2: 1}, 80, 16, 2.0),
    _route({0: 1, 1: 0, 2: 1}, {0: 5, 1: 0, 2: 2}, 15, 4),
    _route({}, {2: 3, 0: 3, 1: 5}, 20, 4),
]


@visible
def check_choose_engine(fn: Callable) -> None:
    """Engines 0 and 1 hold half the prompt, equally loaded (a tie: the lowest number wins);
    engines missing from overlaps (overlap 0), a weight of 0.5; a weight of 0 (least loaded,
    whatever the cache); a weight of 2 (the cache wins over some load); a prompt of 15
    tokens in blocks of 4; no overlaps at all, engines listed out of order, a tie."""
    expect_cases(fn, CHOOSE_CASES, private("14").choose_case, CHOOSE_IDEA, rel_tol=0,
                 promise=INT)
