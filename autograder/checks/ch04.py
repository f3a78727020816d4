"""Visible checks for chapter 4, prefix caching: each TODO's readable cases.

``block_key`` and ``prefix_keys`` are checked on their properties (deterministic, sensitive to
the parent key, every token, their order and the extra keys; a partial block has no key;
wide enough not to collide), never on a particular encoding.

The manager is driven through short scripted scenarios. After every operation, what it holds
(block tables, reference counts, which blocks are cached, the evictable blocks in LRU order)
is compared with what the contract expects, which the chapter's hidden module says
(``autograder.private``): the contract fixes the eviction order (least recently used), so
every block table is known exactly. A sentinel KV pool runs alongside: every computed
position is written with a marker naming its whole prefix, so a cache hit must hand back KV
computed for exactly that prefix. The thorough, stateful checks are in the hidden module.
"""

from __future__ import annotations

from collections.abc import Callable

from autograder.checks._harness import Harness, blame_where_due, unwritten
from autograder.checks._helpers import not_written
from autograder.private import private, visible
from course.v0.block_manager import NoFreeBlocksError
from course.v0.prefix_cache import ROOT_KEY

SUBJECT = "PrefixCachingBlockManager"  # the manager checks take the learner's class
SUBJECT_CHECKS = {"take_block", "allocate", "append_slot", "free"}
ROOT = "ROOT"

# --- block_key and prefix_keys -------------------------------------------------------------

_KEY_IDEA = ("A block's key must name everything its K and V depend on: the parent block's key "
             "(the whole prefix before it), its own tokens in order, and the extra keys; and be "
             "a strong hash (sha256 of a canonical encoding, as a hex string), not Python's "
             "hash().")


def _key(fn: Callable, parent: str, tokens: list[int], extra: tuple = ()) -> str:
    args = dict(parent_key=parent, tokens=tokens, extra_keys=extra)
    try:
        key = fn(**args)
    except NotImplementedError:
        raise AssertionError(not_written("block_key")) from None
    except Exception as exc:
        raise AssertionError(f"block_key({parent!r}, {tokens}, {extra}) raised "
                             f"{type(exc).__name__}: {exc}. {_KEY_IDEA}") from exc
    if isinstance(key, bytes):  # its repr would be noise: say what it is
        raise AssertionError(f"block_key({parent!r}, {tokens}, {extra}) returned {len(key)} "
                             "bytes, not a str: a key is a hex digest, as a string (hexdigest(), "
                             "not digest()). " + _KEY_IDEA)
    if not isinstance(key, str) or len(key) < 32:
        raise AssertionError(f"block_key({parent!r}, {tokens}, {extra}) returned {key!r}: a key "
                             "must be a hex digest of at least 128 bits (sha256 gives 256). "
                             + _KEY_IDEA)
    return key


def _differ(fn: Callable, a: tuple, b: tuple, why: str) -> None:
    if _key(fn, *a) == _key(fn, *b):
        raise AssertionError(f"block_key{a} and block_key{b} are equal: {why} {_KEY_IDEA}")


@visible
def check_block_key(fn: Callable) -> None:
    """The same block after a different prefix, tokens in another order, another extra key,
    and [1, 23] against [12, 3] must all get different keys; the same inputs the same key."""
    if _key(fn, ROOT, [1, 2, 3]) != _key(fn, ROOT, [1, 2, 3]):
        raise AssertionError("block_key gave two keys for the same inputs: it must be "
                             "deterministic. " + _KEY_IDEA)
    _differ(fn, ("parent-a", [5, 6, 7]), ("parent-b", [5, 6, 7]),
            "the same tokens after a different prefix have different K and V (hashing a block's "
            "tokens alone reuses the wrong cache).")
    _differ(fn, (ROOT, [1, 2, 3]), (ROOT, [3, 2, 1]), "token order matters.")
    _differ(fn, (ROOT, [1, 23]), (ROOT, [12, 3]), "an encoding that runs tokens together "
            "(\"1\" + \"23\" == \"12\" + \"3\") collides: separate them.")
    _differ(fn, (ROOT, [1, 2], ("lora-1",)), (ROOT, [1, 2], ("lora-2",)),
            "the extra keys (a LoRA adapter, a cache salt) change the K and V.")
    _differ(fn, (ROOT, [1, 2], ("3",)), (ROOT, [1], ("2", "3")),
            "a value that moved from the tokens into the extra keys is a different input: "
            "the encoding must keep the two apart.")
    _same_in_every_process(fn, ROOT, [1, 2, 3], ("lora-1",))


class _OtherProcess(str):
    """A string whose hash() differs on every call, as a string's does from one process to the
    next (PYTHONHASHSEED): everything else about it is the same string."""

    _calls = 0

    def __hash__(self) -> int:
        _OtherProcess._calls += 1
        return hash((str(self), _OtherProcess._calls))


def _same_in_every_process(fn: Callable, parent: str, tokens: list[int], extra: tuple) -> None:
    """Equal inputs get equal keys even when Python's string hashes change, as they do in
    another process: a key built on hash() could not name a block another process cached."""
    keys = {_key(fn, _OtherProcess(parent), list(tokens),
                 tuple(_OtherProcess(e) for e in extra)) for _ in range(3)}
    if len(keys) > 1:
        raise AssertionError(
            f"block_key({parent!r}, {tokens}, {extra}) gave {len(keys)} different keys when "
            "Python's string hashes changed between calls, as they do from one process to the "
            "next (PYTHONHASHSEED): the key depends on hash(). Another process (or tomorrow's "
            "run) must get the same key for the same block. " + _KEY_IDEA)


_PREFIX_IDEA = ("prefix_keys chains block_key from ROOT_KEY: key 0 = block_key(ROOT_KEY, block "
                "0, extra), key i = block_key(key i-1, block i, extra); only full blocks have "
                "keys. So key i names the whole prefix up to the end of block i.")


def _keys(fn: Callable, tokens: list[int], block_size: int, extra: tuple = ()) -> list:
    call = f"prefix_keys({tokens}, {block_size}{', ' + repr(extra) if extra else ''})"
    try:
        keys = fn(tokens=list(tokens), block_size=block_size, extra_keys=extra)
    except NotImplementedError:
        raise AssertionError(not_written("prefix_keys")) from None
    except Exception as exc:
        raise AssertionError(f"{call} raised {type(exc).__name__}: {exc}. {_PREFIX_IDEA}") \
            from exc
    keys = list(keys)
    if len(keys) != len(tokens) // block_size:
        hint = (" A partial last block has no key: it will still change as tokens arrive."
                if len(keys) > len(tokens) // block_size else "")
        raise AssertionError(f"{call} returned {len(keys)} keys, expected one per full block: "
                             f"{len(tokens)} // {block_size} = {len(tokens) // block_size}."
                             f"{hint} {_PREFIX_IDEA}")
    return keys


def _check_prefix(fn: Callable, tokens: list[int], block_size: int, extra: tuple) -> None:
    keys = _keys(fn, tokens, block_size, extra)
    longer = _keys(fn, tokens + [7, 7, 7], block_size, extra)
    if longer[:len(keys)] != keys:
        raise AssertionError(f"prefix_keys({tokens}, {block_size}) and the same tokens with "
                             "more after them disagree on the earlier blocks' keys: a key may "
                             f"depend only on the tokens up to its block's end. {_PREFIX_IDEA}")
    if len(set(keys)) != len(keys):
        raise AssertionError(f"prefix_keys({tokens}, {block_size}) gave two blocks the same key:"
                             " equal blocks at different depths have different prefixes. "
                             + _PREFIX_IDEA)
    if len(keys) >= 2:  # change the first token: every key must change (they all chain it)
        changed = _keys(fn, [tokens[0] + 1] + tokens[1:], block_size, extra)
        same = [i for i in range(len(keys)) if changed[i] == keys[i]]
        if same:
            raise AssertionError(
                f"changing only token 0 of {tokens} (block size {block_size}) left key(s) "
                f"{same} unchanged: each key must chain its parent's key, so a change "
                f"anywhere in the prefix changes every key after it. {_PREFIX_IDEA}")
    if keys and _keys(fn, tokens, block_size, extra + ("other",))[0] == keys[0]:
        raise AssertionError(f"prefix_keys ignored the extra keys for {tokens}: pass them to "
                             f"block_key. {_PREFIX_IDEA}")
    _chained_from_the_root(fn, tokens, block_size, extra, keys)


def _chained_from_the_root(fn: Callable, tokens: list[int], block_size: int, extra: tuple,
                           keys: list) -> None:
    """Each key is block_key of its parent (ROOT_KEY for the first), its block and ``extra``,
    by the block_key ``fn`` finds by name (the notebook's, which its skeleton's
    _cache_full_blocks keys blocks with: keys made otherwise would never be found there)."""
    block_key = getattr(fn, "__globals__", {}).get("block_key")
    if block_key is None:  # no block_key beside it: nothing to chain with
        return
    parent = ROOT_KEY
    for i, key in enumerate(keys):
        block = tokens[i * block_size:(i + 1) * block_size]
        try:
            expected = block_key(parent, block, extra)
        except Exception:  # a stub or a broken block_key: block_key's own test says so
            return
        if key != expected:
            if i == 0:
                raise AssertionError(f"key 0 of prefix_keys({tokens}, {block_size}) is not "
                                     f"block_key(ROOT_KEY, {block}, {extra}): the chain starts "
                                     f"from ROOT_KEY. {_PREFIX_IDEA}")
            raise AssertionError(f"key {i} of prefix_keys({tokens}, {block_size}) is not "
                                 f"block_key(key {i - 1}, {block}, {extra}). {_PREFIX_IDEA}")
        parent = key


@visible
def check_prefix_keys(fn: Callable) -> None:
    """Ten tokens in blocks of 4 (two keys, the last two tokens have none), eight tokens (two),
    three (none), and ten with a cache salt."""
    for tokens, extra in [(list(range(10)), ()), (list(range(8)), ()), ([7, 8, 9], ()),
                          (list(range(10)), ("salt",))]:
        _check_prefix(fn, tokens, 4, extra)


# --- the manager -------------------------------------------------------------------------

class _Harness(Harness):
    """The learner's manager, a sentinel KV pool, and what the contract expects after each
    operation: ``model`` (by default the hidden module's, asked through ``private``) is told
    every operation that succeeds and says what the manager should hold then. What the
    harness asks it never depends on the learner's answers up to the first failure: it asks
    before it looks, and a failing step's hint uses only what it already asked."""

    shown = 10

    def __init__(self, cls: type, num_blocks: int, block_size: int, model=None,
                 blame: str | None = None) -> None:
        super().__init__(blame)
        self.size, self.num_blocks = block_size, num_blocks
        self.model = model if model is not None else private("04").model(num_blocks, block_size)
        self.expected = self.model.view()  # tables, refs, cached, evictable (LRU first), free
        # the skeleton's constructor: its own errors pass as they are
        self.bm = self.call(f"bm = PrefixCachingBlockManager({num_blocks}, {block_size})",
                            lambda: cls(num_blocks, block_size), allowed=(Exception,))
        self.tokens: dict[int, list[int]] = {}  # each live sequence's tokens, as given
        self.extra: dict[int, tuple] = {}
        self.pool: dict[int, tuple] = {}

    def _state(self) -> tuple:
        seqs = sorted(self.tokens)
        return ({s: self.bm.block_table(s) for s in seqs},
                [self.bm.ref_count(b) for b in range(self.num_blocks)],
                self.bm.num_free_blocks(), list(self.bm.evictable_blocks()))

    def _marker(self, seq: int, position: int) -> tuple:
        return (self.extra[seq], tuple(self.tokens[seq][:position + 1]))

    def _write(self, seq: int, positions) -> None:
        table = self.bm.block_table(seq)
        for p in positions:
            self.pool[table[p // self.size] * self.size + p % self.size] = self._marker(seq, p)

    def _told(self) -> None:
        """What the manager should hold now that the model was told the last operation."""
        self.expected = self.model.view()

    def verify(self) -> None:
        expected = self.expected
        for seq, table in expected["tables"].items():
            got = self.bm.block_table(seq)
            if got != table:
                self.fail(f"sequence {seq}'s block table is {got}, expected {table}.",
                          "Hits come first (the cached blocks of the longest cached prefix), "
                          "then fresh blocks, each the least recently used free block.")
        for block, refs in enumerate(expected["refs"]):
            if self.bm.ref_count(block) != refs:
                self.fail(f"block {block}'s reference count is {self.bm.ref_count(block)}, "
                          f"expected {refs}.")
            if self.bm.is_cached(block) != (block in expected["cached"]):
                state = "cached" if self.bm.is_cached(block) else "not cached"
                self.fail(f"block {block} is {state}; expected the opposite.",
                          "A block is cached once it is full; it loses its key only when it "
                          "is evicted (taken for new content). An evicted block must forget "
                          "its key, or a later prompt would reuse KV of another prefix.")
        for block in self.bm.evictable_blocks():
            if expected["refs"][block] > 0:
                holder = next(s for s, t in expected["tables"].items() if block in t)
                self.fail(f"block {block} is evictable while sequence {holder} still uses it.",
                          "Only a block whose reference count reached zero may be evicted.")
        evictable = expected["evictable"]
        if list(self.bm.evictable_blocks()) != evictable or \
                self.bm.num_free_blocks() != expected["free"]:
            self.fail(f"free blocks {self.bm.num_free_blocks()} and evictable (LRU first) "
                      f"{list(self.bm.evictable_blocks())}; expected {expected['free']} and "
                      f"{evictable}.", "Freed blocks join the LRU end, a sequence's tail "
                      "first, so its prefix outlives its tail; a revived block leaves the "
                      "free queue.")
        for seq, tokens in self.tokens.items():
            table = self.bm.block_table(seq)
            for p in range(len(tokens)):
                found = self.pool.get(table[p // self.size] * self.size + p % self.size)
                if found != self._marker(seq, p):
                    self.fail(f"sequence {seq}'s position {p} reads KV computed for another "
                              "prefix.", "A hit must return exactly this prefix's KV.")

    def _unchanged(self, before: tuple, operation: str) -> None:
        if self._state() != before:
            self.fail(f"{operation} raised NoFreeBlocksError but changed the pool.",
                      "Check capacity first: fresh blocks plus revived cached blocks (they "
                      "leave the free queue too) must fit in the free blocks; all or nothing.")

    def allocate(self, seq: int, tokens: list[int], extra: tuple = ()) -> None:
        text = f"bm.allocate({seq}, {tokens}{', ' + repr(extra) if extra else ''})"
        self.log.append(text)
        admits = self.model.admits(tokens, extra)  # asked first, whatever the manager does
        expected = len(self.model.hits(tokens, extra)) * self.size
        before = self._state()
        try:
            hits = self.bm.allocate(seq, list(tokens), extra)
        except NotImplementedError:
            raise unwritten(text) from None
        except NoFreeBlocksError:
            if admits:
                self.fail("it raised NoFreeBlocksError, but the prompt fits.")
            self._unchanged(before, "allocate")
            return
        except AssertionError:
            raise
        except Exception as exc:
            self.fail(f"{text} raised {type(exc).__name__}: {exc}.",
                      "" if admits else "This prompt does not fit: raise NoFreeBlocksError "
                      "before changing anything (count revived cached blocks as taken).")
        cap = ((len(tokens) - 1) // self.size if tokens else 0) * self.size
        if not admits:
            self.fail("it allocated a prompt that does not fit.",
                      f"It counted {hits} hit tokens, more than the {cap} allowed: at most "
                      "(n - 1) // block_size blocks may hit, so the last token is always "
                      "computed (its logits are needed)." if isinstance(hits, int) and hits > cap
                      else "Revived cached blocks leave the free queue: count them against the "
                      "free blocks along with the fresh ones.")
        if hits != expected:
            if hits > cap:
                why = ("At most (n - 1) // block_size blocks may hit, so the last token is "
                       "always computed (its logits are needed).")
            elif hits * self.size == expected:
                why = ("allocate returns how many prompt tokens were hits: the hit blocks "
                       "times block_size, not the number of hit blocks.")
            else:
                why = ("Hits are the longest run of cached full blocks from the start of the "
                       "prompt, stopping at the first miss.")
            self.fail(f"it returned {hits} hit tokens, expected {expected}.", why)
        for block in self.bm.block_table(seq)[expected // self.size:]:
            if before[1][block] > 0:
                self.fail(f"it took block {block} for new content while another sequence "
                          "still holds it.", "Only blocks with no reference can be evicted.")
        self.model.allocate(seq, tokens, extra)
        self._told()
        self.tokens[seq], self.extra[seq] = list(tokens), extra
        self._write(seq, range(expected, len(tokens)))
        self.verify()

    def allocate_again(self, seq: int, tokens: list[int]) -> None:
        """Allocate the live sequence ``seq`` again: it must raise ValueError."""
        text = f"bm.allocate({seq}, {tokens})"
        self.log.append(text)
        try:
            self.bm.allocate(seq, list(tokens))
        except NotImplementedError:
            raise unwritten(text) from None
        except (ValueError, KeyError):
            return
        except Exception as exc:
            self.fail(f"it raised {type(exc).__name__}: {exc}; expected ValueError.",
                      _ID_IN_USE)
        self.fail(f"sequence {seq} already has blocks, yet it was allocated again; expected "
                  "ValueError.", _ID_IN_USE)

    def append(self, seq: int, token: int) -> None:
        text = f"bm.append_slot({seq}, {token})"
        self.log.append(text)
        before = self._state()
        room = len(self.tokens[seq]) % self.size != 0 or self.expected["free"] > 0
        try:
            got = self.bm.append_slot(seq, token)
        except NotImplementedError:
            raise unwritten(text) from None
        except NoFreeBlocksError:
            if room:
                self.fail("it raised NoFreeBlocksError with room to spare.")
            self._unchanged(before, "append_slot")
            return
        except AssertionError:
            raise
        except Exception as exc:
            self.fail(f"{text} raised {type(exc).__name__}: {exc}.")
        if not room:
            self.fail("it appended with no free block at all.")
        self.model.append(seq, token)
        self._told()
        self.tokens[seq].append(token)
        position = len(self.tokens[seq]) - 1
        table = self.expected["tables"][seq]
        expected = (table[position // self.size], position % self.size)
        if tuple(got) != expected:
            self.fail(f"it returned {tuple(got)}, expected {expected}.")
        held = len(self.bm.block_table(seq))
        if held != len(table):
            self.fail(f"sequence {seq} holds {held} blocks for {position + 1} tokens, expected "
                      f"{len(table)}.", "A token takes a fresh block only when the last block "
                      "is full: when the token finds no room in it, not when it fills it.")
        self._write(seq, [position])
        self.verify()

    def free(self, seq: int) -> None:
        self.call(f"bm.free({seq})", lambda: self.bm.free(seq))
        self.model.free(seq)
        self._told()
        del self.tokens[seq], self.extra[seq]
        self.verify()


_ID_IN_USE = "An id that already has blocks is an error: allocate raises ValueError."

SYSTEM = [101, 102, 103, 104, 105, 106, 107, 108]  # a two-block system prompt (block size 4)


def _take_block_cases(cls: type) -> None:
    bm = cls(3, 4)
    bm.cache, bm.keys = {"k0": 0, "k2": 2}, {0: "k0", 2: "k2"}
    setup = "bm = PrefixCachingBlockManager(3, 4), blocks 0 and 2 cached; bm._take_block()"
    try:
        first = bm._take_block()
    except NotImplementedError:
        raise AssertionError(not_written("_take_block")) from None
    if first != 0:
        raise AssertionError(f"After {setup}: it returned {first} from free blocks [0, 1, 2] "
                             "(least recently used first); expected 0.")
    if bm.is_cached(0) or "k0" in bm.cache:
        raise AssertionError(f"After {setup}: block 0 was evicted but kept its key, so a later "
                             "prompt with that prefix would read new content. Forget the key.")
    if bm.ref_count(0) != 1 or bm.num_free_blocks() != 2:
        raise AssertionError(f"After {setup}: the block must have one reference and leave the "
                             "free blocks.")
    bm._take_block()
    bm._take_block()
    try:
        bm._take_block()
    except NoFreeBlocksError:
        return
    except Exception as exc:
        raise AssertionError(f"After {setup} three more times: an empty pool raised "
                             f"{type(exc).__name__}; expected NoFreeBlocksError.") from exc
    raise AssertionError(f"After {setup} three more times: an empty pool returned a block; "
                         "expected NoFreeBlocksError.")


_REVIVE_FIRST = ("Revive the hits first (they leave the free queue), then take the fresh "
                 "blocks: the least recently used free block may be one of the hits.")


def _eviction_cases(cls: type, blame: str | None = None) -> None:
    """Two prompts that meet cached blocks sitting in the free queue, set up with the
    skeleton's own ``_release_block`` (no ``free`` needed): a hit that is the least recently
    used free block, and a cached block whose parent was evicted."""
    h = Harness(blame)

    def release(bm, blocks: list[int], why: str) -> None:
        h.log.append(f"bm._release_block(b) for b in {blocks} ({why})")
        for block in blocks:
            bm._release_block(block)

    prefix = [11, 12, 13, 14, 15, 16, 17, 18]  # two full blocks of 4
    bm = h.call("bm = PrefixCachingBlockManager(4, 4)", lambda: cls(4, 4))
    h.call(f"bm.allocate(0, {prefix + [1]})", lambda: bm.allocate(0, prefix + [1]))
    h.call("bm.allocate(1, [5])", lambda: bm.allocate(1, [5]))
    release(bm, [2, 1, 0], "sequence 0's blocks, tail first, as free will")
    h.call("bm.allocate(2, [6])", lambda: bm.allocate(2, [6]))
    release(bm, [3], "sequence 1's block")
    text = f"bm.allocate(3, {prefix + [8]})"
    h.log.append(text)
    try:  # the free queue is [1, 0, 3]: block 1 is a hit and the least recently used
        hits = bm.allocate(3, prefix + [8])
    except NotImplementedError:
        raise unwritten(text) from None
    except Exception as exc:
        h.fail(f"it raised {type(exc).__name__}: {exc}, with free blocks [1, 0, 3] (least "
               "recently used first) and blocks 0 and 1 this prompt's two cached hits.",
               _REVIVE_FIRST)
    table = bm.block_table(3)
    if table != [0, 1, 3] or hits != 8:
        h.fail(f"it returned {hits} hit tokens and the table {table}; expected 8 and [0, 1, 3] "
               "(the free blocks were [1, 0, 3], least recently used first, and blocks 0 and 1 "
               "this prompt's cached hits).", _REVIVE_FIRST if set(table[2:]) & {0, 1} else
               "Hits come first, then fresh blocks, each the least recently used free block.")

    h.log.clear()
    bm = h.call("bm = PrefixCachingBlockManager(6, 4)", lambda: cls(6, 4))
    h.call(f"bm.allocate(0, {prefix + [1]})", lambda: bm.allocate(0, prefix + [1]))
    h.call("bm.allocate(1, [5] * 12)", lambda: bm.allocate(1, [5] * 12))
    release(bm, [0, 1, 2], "sequence 0's blocks, head first")
    h.call("bm.allocate(2, [6])", lambda: bm.allocate(2, [6]))  # takes block 0: its key goes
    release(bm, [3, 4, 5], "sequence 1's blocks")
    text = f"bm.allocate(3, {prefix + [9]})"
    h.log.append(text)
    try:  # block 1's key (the first 8 tokens) is cached, its parent's (the first 4) is not
        hits = bm.allocate(3, prefix + [9])
    except NotImplementedError:
        raise unwritten(text) from None
    except Exception as exc:
        h.fail(f"it raised {type(exc).__name__}: {exc}.")
    if hits != 0:
        h.fail(f"it returned {hits} hit tokens, expected 0: the prompt's first block (its first 4 "
               "tokens) was evicted, though the block after it is still cached.",
               "Hits are the longest run of cached blocks from the start of the prompt, stopping "
               "at the first miss: a block after a miss holds KV of a prefix this prompt does "
               "not have in the cache, and at another position.")


def _allocate_cases(cls: type, blame: str | None = None) -> None:
    h = _Harness(cls, 8, 4, blame=blame)
    h.allocate(0, SYSTEM + [1, 2, 3])
    h.allocate(1, SYSTEM + [4, 5])
    h.allocate(2, list(SYSTEM))
    h.allocate(3, SYSTEM + list(range(20)))
    h.allocate_again(1, SYSTEM + [4, 5])
    _eviction_cases(cls, blame)


def _append_slot_cases(cls: type, blame: str | None = None) -> None:
    h = _Harness(cls, 6, 4, blame=blame)
    h.allocate(0, [1, 2, 3])
    for token in [4, 5, 6, 7, 8]:
        h.append(0, token)
    h.allocate(1, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    for token in range(9):
        h.append(1, 20 + token)


def _revival_cases(cls: type, blame: str | None = None) -> None:
    """Revived blocks count against capacity: they leave the free queue as fresh ones do."""
    tight = _Harness(cls, 5, 4, blame=blame)  # reviving two cached and taking two fresh: no room
    tight.allocate(0, SYSTEM + [1])
    tight.allocate(9, [5] * 8)
    tight.free(0)
    tight.allocate(1, SYSTEM + [1, 2, 3, 4, 6])
    tight.allocate(2, SYSTEM + [2])  # fits: two revived blocks, one fresh
    tight.free(9)
    tight.allocate(3, SYSTEM + [3])  # shares the system prompt with sequence 2, evicts one
    tight.free(3)  # the shared blocks stay with sequence 2


def _free_cases(cls: type, blame: str | None = None) -> None:
    _revival_cases(cls, blame)
    h = _Harness(cls, 6, 4, blame=blame)
    h.allocate(0, SYSTEM + [1, 2, 3, 4, 9])
    h.free(0)
    h.allocate(1, SYSTEM + [1, 2, 3, 4, 5])
    h.free(1)
    h.allocate(2, [9] * 22)
    h.allocate(3, SYSTEM + [7])
    h.free(2)
    h.allocate(4, SYSTEM + [1, 2, 3, 4, 5])
    try:
        h.bm.free(99)
    except (KeyError, ValueError):
        return
    except Exception as exc:
        h.fail(f"bm.free(99) raised {type(exc).__name__}; expected KeyError.")
    h.fail("bm.free(99) of an unknown sequence raised nothing; expected KeyError.")


def _with_blame(cases: Callable, cls: type) -> None:
    """The check's cases, with the note that ``_take_block`` (which the manager's other methods
    take their blocks through) is at fault only where lending the course's ``_take_block``
    makes them pass (``_harness.blame_where_due``)."""
    from course.v0.prefix_cache import PrefixCachingBlockManager

    blame_where_due(cases, cls, {"_take_block": _take_block_cases}, PrefixCachingBlockManager,
                    "_take_block")


@visible
def check_take_block(cls: type) -> None:
    """Given free blocks in LRU order, some of them cached: the oldest is taken, its key is
    forgotten, and an empty pool raises NoFreeBlocksError."""
    _take_block_cases(cls)


@visible
def check_allocate(cls: type) -> None:
    """Block size 4: two prompts sharing an 8-token system prompt (the second hits 8 tokens);
    an 8-token prompt hits only 4 (the last token is computed); a prompt that does not fit; an
    id allocated twice; then hits waiting in the free queue: one the least recently used free
    block, and one whose parent block was evicted."""
    _with_blame(_allocate_cases, cls)


@visible
def check_append_slot(cls: type) -> None:
    """A decoded block is cached once full, so a later prompt that repeats the conversation
    hits it; running out raises and changes nothing."""
    _with_blame(_append_slot_cases, cls)


@visible
def check_free(cls: type) -> None:
    """Freed blocks stay cached and evictable, tail first; a new prompt revives them (and
    counts them against capacity); the least recently used is evicted first."""
    _with_blame(_free_cases, cls)
