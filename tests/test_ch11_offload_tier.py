"""The CPU tier behind the GPU prefix cache (``course.v1.offload_tier``): its eviction policies
against second readings of their rules (LRU as a list; ARC as the paper's pseudocode, its cases
I to IV and REPLACE, written out here), on drawn access traces; and the tier's own contracts:
a load's blocks are never evicted, a store that finds no room changes nothing, ``lookup`` counts
stored keys from the first, and a failed store leaves no trace."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course.v1.offload_tier import CPUTier


class PaperARC:
    """ARC(c) as Megiddo and Modha's Figure 4 states it; lists with their MRU end last."""

    def __init__(self, c: int) -> None:
        self.c, self.p = c, 0.0
        self.t1, self.t2, self.b1, self.b2 = [], [], [], []

    def _replace(self, x) -> None:
        if self.t1 and ((x in self.b2 and len(self.t1) == self.p) or len(self.t1) > self.p):
            self.b1.append(self.t1.pop(0))
        else:
            self.b2.append(self.t2.pop(0))

    def request(self, x) -> None:
        if x in self.t1 or x in self.t2:  # case I
            (self.t1 if x in self.t1 else self.t2).remove(x)
            self.t2.append(x)
        elif x in self.b1:  # case II
            self.p = min(self.p + (1 if len(self.b1) >= len(self.b2)
                                   else len(self.b2) / len(self.b1)), self.c)
            self._replace(x)
            self.b1.remove(x)
            self.t2.append(x)
        elif x in self.b2:  # case III
            self.p = max(self.p - (1 if len(self.b2) >= len(self.b1)
                                   else len(self.b1) / len(self.b2)), 0)
            self._replace(x)
            self.b2.remove(x)
            self.t2.append(x)
        else:  # case IV
            l1, l2 = len(self.t1) + len(self.b1), len(self.t2) + len(self.b2)
            if l1 == self.c:
                if len(self.t1) < self.c:
                    self.b1.pop(0)
                    self._replace(x)
                else:
                    self.t1.pop(0)
            elif l1 + l2 >= self.c:
                if l1 + l2 == 2 * self.c:
                    self.b2.pop(0)
                self._replace(x)
            self.t1.append(x)


def _access(tier: CPUTier, key) -> None:
    """A block used: a hit is touched; a miss is stored (the GPU evicted it, or computed it)."""
    if tier.lookup([key]):
        tier.touch([key])
    else:
        tier.complete_store([key for key, _ in tier.prepare_store([key])[0]])


traces = st.tuples(st.integers(1, 8), st.lists(st.integers(0, 20), max_size=120))


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(traces)
def test_arc_keeps_the_lists_and_the_target_that_the_paper_keeps(trace):
    capacity, keys = trace
    tier, paper = CPUTier(capacity, "arc"), PaperARC(capacity)
    arc = tier.policy
    for step, key in enumerate(keys):
        _access(tier, key)
        paper.request(key)
        assert ([list(arc.t1), list(arc.t2), list(arc.b1), list(arc.b2), arc.p]
                == [paper.t1, paper.t2, paper.b1, paper.b2, paper.p]), (step, key)
        assert set(tier.block_of) == set(paper.t1) | set(paper.t2)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(traces)
def test_lru_evicts_the_least_recently_used(trace):
    capacity, keys = trace
    tier, recent = CPUTier(capacity, "lru"), []
    for key in keys:
        _access(tier, key)
        if key in recent:
            recent.remove(key)
        recent.append(key)
        del recent[:-capacity]
        assert set(tier.block_of) == set(recent)
        assert len(set(tier.block_of.values())) == len(tier.block_of) <= capacity


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_a_block_being_loaded_is_never_evicted(policy):
    rng = random.Random(3)
    tier = CPUTier(4, policy)
    for key in "abcd":
        _access(tier, key)
    blocks = tier.prepare_load(["a", "b"])
    assert blocks == [tier.block_of["a"], tier.block_of["b"]]
    for _ in range(40):
        _access(tier, rng.choice("efghij"))
        assert {"a", "b"} <= set(tier.block_of) and tier.lookup(["a", "b"]) == 2
    tier.complete_load(["a", "b"])
    for key in "klmn":
        _access(tier, key)
    assert not {"a", "b"} & set(tier.block_of)  # once loaded, they may go


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_a_store_without_room_changes_nothing(policy):
    tier = CPUTier(3, policy)
    for key in "abc":
        _access(tier, key)
    tier.prepare_load(["a", "b"])
    before = (dict(tier.block_of), set(tier.ready), list(tier.free_blocks))
    assert tier.prepare_store(["x", "y"]) is None  # only c may go: one block of room
    assert (dict(tier.block_of), set(tier.ready), list(tier.free_blocks)) == before
    stored, evicted = tier.prepare_store(["x"])
    assert evicted == ["c"] and stored == [("x", before[0]["c"])]


def test_lookup_counts_stored_keys_from_the_first_and_a_pending_store_is_not_found():
    tier = CPUTier(8)
    stored, _ = tier.prepare_store(["a", "b", "c"])
    assert tier.lookup(["a", "b", "c"]) == 0  # written, not complete
    tier.complete_store(["a", "c"])
    assert tier.lookup(["a", "b", "c"]) == 1 and tier.lookup(["c"]) == 1
    with pytest.raises(KeyError):
        tier.prepare_load(["b"])


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_a_failed_store_leaves_no_trace(policy):
    tier = CPUTier(2, policy)
    tier.prepare_store(["a"])
    tier.complete_store(["a"], success=False)
    assert tier.block_of == {} and len(tier.free_blocks) == 2 and tier.lookup(["a"]) == 0
    if policy == "arc":
        assert not (tier.policy.t1 or tier.policy.b1)  # no ghost: it was never stored


def test_bad_tiers_are_refused():
    with pytest.raises(ValueError, match="at least one block"):
        CPUTier(0)
    with pytest.raises(ValueError, match="policy"):
        CPUTier(4, "fifo")
