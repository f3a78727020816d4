"""A CPU tier behind the GPU's prefix cache: blocks the GPU evicts are stored here, and a GPU miss
that this tier holds is loaded back instead of computed again (chapter 11).

The tier is a pool of ``num_blocks`` CPU blocks, each holding one GPU block's K/V, keyed by the
block's prefix key (chapter 4's ``prefix_keys``). Its interface follows vLLM's
``OffloadingManager`` (``vllm/v1/kv_offload/base.py``, vLLM 0.34.0, commit 62d4bc3c7), which
runs in the scheduler; vLLM looks a key up at a time (a ``LookupResult``) where this tier counts
a run of keys, and its policy hears of a request's uses (``CachePolicy.on_request_access``,
``vllm/v1/kv_offload/cpu/``) where this tier has ``touch``::

    lookup(keys)          how many of ``keys``, from the first, are stored (a load can start)
    prepare_load(keys)    the CPU blocks to read; protected from eviction until...
    complete_load(keys)   ...the load is done
    touch(keys)           they were used: the eviction policy hears of it
    prepare_store(keys)   room for the keys not stored yet, evicting what the policy picks
                          (never a protected block); None when there is no room
    complete_store(keys)  the copies are written: ``lookup`` finds them from now on

    GPU prefix cache evicts block k ──store──> CPU tier (LRU or ARC decides what it evicts)
    GPU miss on k, CPU tier has it ──load───> fresh GPU block, no prefill for its tokens

Two eviction policies, as vLLM's ``LRUCachePolicy`` and ``ARCCachePolicy``
(``vllm/v1/kv_offload/cpu/policies/``):
least recently used, and ARC (Megiddo and Modha, "ARC: A Self-Tuning, Low Overhead Replacement
Cache", FAST 2003), which splits the tier between blocks seen once (T1) and blocks seen again
(T2) and moves the split ``p`` toward whichever list's recently evicted keys (its ghosts, B1
and B2) come back.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence

Key = Hashable


class LRUPolicy:
    """Evicts the least recently used block."""

    def __init__(self, capacity: int) -> None:
        self.order: OrderedDict[Key, None] = OrderedDict()  # least recent first

    def coming(self, key: Key) -> None:
        """``key`` is about to be added (LRU has nothing to prepare)."""

    def added(self, key: Key) -> None:
        self.order[key] = None

    def used(self, key: Key) -> None:
        self.order.move_to_end(key)

    def victim(self, protected: set[Key]) -> Key | None:
        return next((key for key in self.order if key not in protected), None)

    def evicted(self, key: Key) -> None:
        del self.order[key]

    forget = evicted


class ARCPolicy:
    """Adaptive replacement, as the paper's pseudocode has it (its cases I to IV): T1 holds
    blocks seen once, T2 blocks seen again; B1 and B2 remember the keys each evicted last (no
    data); ``p``, T1's target size, grows when a B1 key comes back (recency was cut short) and
    shrinks for a B2 key::

        T1 (seen once)  <-- p -->  T2 (seen again)      B1, B2: ghosts, keys only
        evict from T1 when |T1| > p (or = p and the key comes back from B2), else from T2
    """

    def __init__(self, capacity: int) -> None:
        self.capacity, self.p = capacity, 0.0
        self.t1: OrderedDict[Key, None] = OrderedDict()  # least recent first
        self.t2: OrderedDict[Key, None] = OrderedDict()
        self.b1: OrderedDict[Key, None] = OrderedDict()
        self.b2: OrderedDict[Key, None] = OrderedDict()
        self.incoming: Key | None = None
        self.drop_from_t1 = False  # case IV with T1 the whole of L1: its LRU leaves no ghost

    def coming(self, key: Key) -> None:
        """Before ``key`` is added: a ghost coming back moves ``p`` (cases II and III); a new
        key trims the ghosts so that L1 = T1 + B1 and L2 = T2 + B2 stay within their bounds
        (case IV)."""
        self.incoming, self.drop_from_t1 = key, False
        if key in self.b1:
            self.p = min(self.capacity, self.p + max(len(self.b2) / len(self.b1), 1))
        elif key in self.b2:
            self.p = max(0.0, self.p - max(len(self.b1) / len(self.b2), 1))
        else:
            l1, l2 = len(self.t1) + len(self.b1), len(self.t2) + len(self.b2)
            if l1 == self.capacity:
                if len(self.t1) < self.capacity:
                    self.b1.popitem(last=False)
                else:
                    self.drop_from_t1 = True
            elif l1 + l2 >= 2 * self.capacity and self.b2:
                self.b2.popitem(last=False)

    def added(self, key: Key) -> None:
        if key in self.b1 or key in self.b2:
            self.b1.pop(key, None)
            self.b2.pop(key, None)
            self.t2[key] = None  # it came back: seen again
        else:
            self.t1[key] = None
        self.incoming, self.drop_from_t1 = None, False

    def used(self, key: Key) -> None:
        (self.t1 if key in self.t1 else self.t2).pop(key)
        self.t2[key] = None  # case I: seen again

    def victim(self, protected: set[Key]) -> Key | None:
        from_t1 = bool(self.t1) and (self.drop_from_t1 or len(self.t1) > self.p or
                                     (self.incoming in self.b2 and len(self.t1) == self.p))
        first, second = (self.t1, self.t2) if from_t1 else (self.t2, self.t1)
        for lru in (first, second):  # a protected block stays: the next in line goes
            found = next((key for key in lru if key not in protected), None)
            if found is not None:
                return found
        return None

    def evicted(self, key: Key) -> None:
        if key in self.t1:
            del self.t1[key]
            if not self.drop_from_t1:
                self.b1[key] = None
        else:
            del self.t2[key]
            self.b2[key] = None

    def forget(self, key: Key) -> None:
        """``key`` was never stored after all (its write failed): no ghost remembers it."""
        self.t1.pop(key, None)
        self.t2.pop(key, None)


class CPUTier:
    """``num_blocks`` CPU blocks keyed by prefix key, evicted by ``policy`` ("lru" or "arc")."""

    def __init__(self, num_blocks: int, policy: str = "lru") -> None:
        if num_blocks < 1:
            raise ValueError(f"a CPU tier holds at least one block, got {num_blocks}")
        policies = {"lru": LRUPolicy, "arc": ARCPolicy}
        if policy not in policies:
            raise ValueError(f"policy must be one of {sorted(policies)}, got {policy!r}")
        self.policy = policies[policy](num_blocks)
        self.free_blocks = list(range(num_blocks))
        self.block_of: dict[Key, int] = {}  # key -> CPU block, stored or being stored
        self.ready: set[Key] = set()  # stored: a load may read them
        self.loading: dict[Key, int] = {}  # key -> loads in flight (protected)

    def lookup(self, keys: Sequence[Key]) -> int:
        count = 0
        while count < len(keys) and keys[count] in self.ready:
            count += 1
        return count

    def prepare_load(self, keys: Iterable[Key]) -> list[int]:
        blocks = []
        for key in keys:
            if key not in self.ready:
                raise KeyError(f"{key!r} is not stored in the CPU tier")
            self.loading[key] = self.loading.get(key, 0) + 1
            blocks.append(self.block_of[key])
        return blocks

    def complete_load(self, keys: Iterable[Key]) -> None:
        for key in keys:
            self.loading[key] -= 1
            if not self.loading[key]:
                del self.loading[key]

    def touch(self, keys: Iterable[Key]) -> None:
        for key in keys:
            if key in self.ready:
                self.policy.used(key)

    def prepare_store(self, keys: Sequence[Key]) -> tuple[list[tuple[Key, int]], list[Key]] | None:
        """Room for each of ``keys`` not held yet: (key, CPU block) to write, and the keys
        evicted to make room; None, and nothing changed, when the protected blocks leave too
        little room."""
        new = [key for key in dict.fromkeys(keys) if key not in self.block_of]
        protected = set(self.loading) | (set(self.block_of) - self.ready) | set(new)
        evictable = len(self.block_of) - len(protected & set(self.block_of))
        if len(new) > len(self.free_blocks) + evictable:
            return None
        stored, evicted = [], []
        for key in new:
            self.policy.coming(key)
            if not self.free_blocks:
                victim = self.policy.victim(protected)
                self.policy.evicted(victim)
                self.free_blocks.append(self.block_of.pop(victim))
                self.ready.discard(victim)
                evicted.append(victim)
            self.block_of[key] = self.free_blocks.pop()
            self.policy.added(key)
            stored.append((key, self.block_of[key]))
        return stored, evicted

    def complete_store(self, keys: Iterable[Key], success: bool = True) -> None:
        """The writes of ``keys`` are done (``success``) or failed: a failed one is dropped."""
        for key in keys:
            if key not in self.block_of or key in self.ready:
                continue
            if success:
                self.ready.add(key)
            else:
                self.free_blocks.append(self.block_of.pop(key))
                self.policy.forget(key)
