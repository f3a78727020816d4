"""Speculative decoding (``course.v1.spec_decode``).

* Prompt lookup against a second implementation written from vLLM's description (a
  prefix-function scan of the reversed tokens); greedy acceptance against its definition.
* The rejection sampler against the target's own distribution, measured on a tiny vocabulary;
  two wrong samplers are caught by the same measure.
* What it buys (``course.experiments.spec_decode_cost``): the expected tokens per step against
  greedy verification's mean, and the roofline's speedup: the expected tokens while memory-bound,
  never more as the batch grows, and a batch past which it loses where the FLOPs' roof is near.
* The KV side in a hypothesis state machine: chapter 9's scheduling step with
  ``schedule_lookahead`` over full-attention and sliding-window groups, drafts kept or
  rejected as drawn and ``rollback`` after each step, the model's writes into the slots
  played by the machine. Every computed token sits in its slot, every cached block holds the
  tokens its key names, the pool's books balance; each rule broken is caught.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from mutants.ch12 import (
    _blocks_kept,
    _drafts_cleared_before_counting,
    _pulls_back_the_accepted,
    _room_asked_from_the_chunks_end,
)

from course.experiments.kv_sizing import num_gpu_blocks
from course.experiments.serving_sim import opt13b_a100_40gb
from course.experiments.spec_decode_cost import (
    ACTIVATION_PEAK,
    break_even_batch,
    expected_tokens,
    largest_batch,
    llama3_8b_h100,
    lookahead_blocks,
    speculation,
)
from course.v0.prefix_cache import prefix_keys
from course.v1.chunked_scheduler import ChunkedRequest, ChunkedScheduler, schedule_step
from course.v1.hybrid_coordinator import HybridKVCacheCoordinator
from course.v1.kv_coordinator import NULL_BLOCK, KVCacheCoordinator
from course.v1.spec_decode import (
    accept_greedy,
    ngram_propose,
    rejection_sample,
    rollback,
    schedule_lookahead,
)

FIXED = {"derandomize": True, "database": None}  # the same examples on every run


def _lookup_by_prefix_function(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Prompt lookup as vLLM computes it: reverse the tokens, so the n-gram that ends them is a
    prefix, and scan with the prefix function (Knuth-Morris-Pratt) for where the longest prefix
    of at most ``max_n`` tokens ends again; the last place in the reversed tokens is the first
    in the tokens."""
    reverse = tokens[::-1]
    lps = [0] * max_n  # the prefix function of the reversed tokens' first max_n places
    longest, place, matched, i = 0, 0, 0, 1
    while i < len(reverse):
        if reverse[matched] == reverse[i]:
            matched += 1
            if matched >= longest:
                longest, place = matched, i
            if i < max_n:
                lps[i] = matched
            if matched == max_n:
                matched = lps[max_n - 1]
            i += 1
        elif matched:
            matched = lps[matched - 1]
        else:
            i += 1
    if longest < min_n:
        return []
    start = len(tokens) - 1 - place + longest
    return tokens[start:start + k]


def test_prompt_lookup_proposes_what_followed_the_longest_earlier_match():
    # vLLM's own example: [4, 2, 3] does not occur earlier, [2, 3] does, and three tokens follow
    assert ngram_propose([1, 2, 3, 4, 2, 3], min_n=2, max_n=3, k=4) == [4, 2, 3]
    assert ngram_propose([1, 2, 3, 4, 2, 3], min_n=3, max_n=3, k=4) == []
    # two earlier occurrences of [5, 6]: the first one's followers
    assert ngram_propose([5, 6, 1, 5, 6, 2, 5, 6], min_n=1, max_n=2, k=2) == [1, 5]
    # an occurrence that overlaps the n-gram it matches: [7, 7] after [7, 7, 7]
    assert ngram_propose([7, 7, 7], min_n=2, max_n=2, k=3) == [7]
    assert ngram_propose([1, 2], min_n=1, max_n=3, k=2) == []
    assert ngram_propose([3, 1, 3], min_n=1, max_n=1, k=0) == []


@settings(max_examples=400, deadline=None, **FIXED)
@given(tokens=st.lists(st.integers(0, 3), max_size=24), min_n=st.integers(1, 4),
       extra=st.integers(0, 3), k=st.integers(0, 5))
def test_prompt_lookup_agrees_with_the_prefix_function_scan(tokens, min_n, extra, k):
    max_n = min_n + extra
    assert ngram_propose(tokens, min_n, max_n, k) == \
        _lookup_by_prefix_function(tokens, min_n, max_n, k)


def test_prompt_lookup_refuses_an_empty_range_of_n():
    with pytest.raises(ValueError, match="min_n <= max_n"):
        ngram_propose([1, 2, 3], min_n=3, max_n=2, k=2)


@settings(max_examples=200, deadline=None, **FIXED)
@given(pairs=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2)), max_size=6),
       last=st.integers(0, 2))
def test_greedy_verification_emits_the_agreeing_drafts_then_the_targets_token(pairs, last):
    drafts, target = [d for d, _ in pairs], [t for _, t in pairs] + [last]
    emitted = accept_greedy(drafts, target)
    accepted = len(emitted) - 1
    assert emitted[:accepted] == drafts[:accepted] == target[:accepted]
    assert emitted[-1] == target[accepted]
    assert accepted == len(drafts) or drafts[accepted] != target[accepted]


VOCAB, SAMPLES = 4, 20_000


def _distributions(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    target = torch.softmax(torch.randn(3, VOCAB, generator=gen) * 1.5, dim=-1).double()
    draft = torch.softmax(torch.randn(2, VOCAB, generator=gen) * 1.5, dim=-1).double()
    return target, draft


def _distance(counts: torch.Tensor, expected: torch.Tensor) -> float:
    """Total variation between the counts' frequencies and ``expected``."""
    return 0.5 * float((counts / counts.sum() - expected).abs().sum())


def _first_and_second(emitted: list[list[int]], first_draft: int) -> tuple:
    first = torch.bincount(torch.tensor([e[0] for e in emitted]), minlength=VOCAB).double()
    second = torch.bincount(torch.tensor([e[1] for e in emitted
                                          if e[0] == first_draft and len(e) > 1]),
                            minlength=VOCAB).double()
    return first, second


# With 20,000 samples over 4 tokens an exact sampler's frequencies are within a total variation
# of about 0.005 of the target's (0.003 to 0.005 measured on these seeds); 0.03 leaves 6x room,
# and the wrong samplers below land 0.15 or more away.
TOLERANCE = 0.03


def _drafted_from(draft: torch.Tensor):
    def drafts_of(gen: torch.Generator) -> list[int]:
        return [int(torch.multinomial(draft[i], 1, generator=gen)) for i in range(2)]
    return drafts_of


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampled_verification_keeps_the_targets_distribution(seed):
    """The first token emitted is distributed as the target's first place, and the second,
    where the first draft was kept, as its second place: whatever the drafts were. (A token
    drawn at a rejection is never the draft it replaces: ``max(0, p - q)`` is 0 there.)"""
    target, draft = _distributions(seed)
    gen = torch.Generator().manual_seed(99)
    drafts_of = _drafted_from(draft)
    runs = [(drafts, rejection_sample(drafts, draft, target, gen))
            for drafts in (drafts_of(gen) for _ in range(SAMPLES))]
    first = torch.bincount(torch.tensor([e[0] for _, e in runs]), minlength=VOCAB).double()
    second = torch.bincount(torch.tensor([e[1] for d, e in runs if e[0] == d[0]]),
                            minlength=VOCAB).double()
    assert _distance(first, target[0]) < TOLERANCE
    assert second.sum() > 2000 and _distance(second, target[1]) < 2 * TOLERANCE
    assert {len(e) for _, e in runs} <= {1, 2, 3}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_prompt_lookup_drafts_are_verified_to_the_targets_distribution(seed):
    """A proposer with no distribution (all its mass on its draft): the same guarantee, at the
    first place and at the second where the first draft was kept."""
    target, _ = _distributions(seed)
    gen = torch.Generator().manual_seed(7)
    fixed = [int(target[0].argmax()), int(target[1].argmin())]
    emitted = [rejection_sample(fixed, None, target, gen) for _ in range(SAMPLES)]
    first, second = _first_and_second(emitted, fixed[0])
    assert _distance(first, target[0]) < TOLERANCE
    assert second.sum() > 1000 and _distance(second, target[1]) < 2 * TOLERANCE


def _resamples_from_the_target(drafts, draft_probs, target_probs, generator):
    """Wrong: at a rejection it draws from the target's ``p``, not from ``max(0, p - q)``,
    so the draft's likely tokens come out too often."""
    for place, token in enumerate(drafts):
        p, q = target_probs[place], draft_probs[place]
        if float(torch.rand((), generator=generator)) < min(1.0, float(p[token] / q[token])):
            continue
        return [*drafts[:place], int(torch.multinomial(p, 1, generator=generator))]
    return [*drafts, int(torch.multinomial(target_probs[-1], 1, generator=generator))]


def _accepts_every_draft(drafts, draft_probs, target_probs, generator):
    """Wrong: keeps every draft, so the tokens follow the proposer's distribution."""
    return [*drafts, int(torch.multinomial(target_probs[-1], 1, generator=generator))]


@pytest.mark.parametrize("wrong", [_resamples_from_the_target, _accepts_every_draft],
                         ids=["resamples-from-p", "accepts-every-draft"])
def test_the_measure_catches_a_sampler_that_shifts_the_distribution(wrong):
    target, draft = _distributions(0)
    gen = torch.Generator().manual_seed(99)
    drafts_of = _drafted_from(draft)
    emitted = [wrong(drafts_of(gen), draft, target, gen) for _ in range(SAMPLES)]
    first = torch.bincount(torch.tensor([e[0] for e in emitted]), minlength=VOCAB).double()
    assert _distance(first, target[0]) > 2 * TOLERANCE


# --- the KV side: drafts scheduled, verified and rolled back, in a state machine -----------


class SpeculativeServing(RuleBasedStateMachine):
    """Chapter 9's scheduling step and ``schedule_lookahead`` over a KV cache of drawn groups
    (full attention and sliding windows), the model played by the machine: what a step
    computes is written, token by token, into a copy of the pool's slots; a request that
    samples keeps a drawn number of its drafts and one token more (``rollback`` the rest),
    and is proposed new drafts. After every step, each running request's computed tokens are
    in its blocks, every slot its next token reads holding that token (so no cached block, no
    hit and no window ever holds a rejected draft), and the pool's books balance."""

    seen: Counter = Counter()  # how often each path was taken, over every example

    def __init__(self) -> None:
        super().__init__()
        self.scheduler: ChunkedScheduler | None = None

    @initialize(windows=st.lists(st.sampled_from([None, None, 3, 6]), min_size=1, max_size=2),
                block_size=st.sampled_from([2, 4]), num_blocks=st.integers(12, 40),
                budget=st.integers(4, 16))
    def start(self, windows, block_size, num_blocks, budget):
        kv = HybridKVCacheCoordinator(num_blocks, block_size, windows)
        self.scheduler = ChunkedScheduler(num_blocks, block_size, budget, kv_cache=kv)
        self.slots = [dict() for _ in windows]  # group -> slot -> the token written there
        self.named: dict[str, list[int]] = {}  # prefix key -> the tokens of its block
        self.next_id = 0
        self.finished = 0

    @rule(prompt=st.lists(st.integers(0, 2), min_size=1, max_size=10),
          output_len=st.integers(1, 8))
    def arrive(self, prompt, output_len):
        try:
            self.scheduler.add(ChunkedRequest(self.next_id, prompt, output_len))
        except ValueError:
            return  # the pool could never hold it, run alone
        self.next_id += 1

    @rule(accepted=st.lists(st.integers(0, 3), min_size=8, max_size=8),
          drafts=st.lists(st.lists(st.integers(0, 2), max_size=4), min_size=8, max_size=8))
    def step(self, accepted, drafts):
        s = self.scheduler
        proposed = {r.id: len(r.spec_token_ids) for r in s.running}
        plan = s.step(lambda scheduler: schedule_lookahead(scheduler, schedule_step(scheduler)))
        kv = s.kv_cache
        for chunk in plan.chunks:
            asked = proposed.get(chunk.request.id, 0)
            kept = len(chunk.request.spec_token_ids)
            self.seen["drafts scheduled"] += kept > 0
            self.seen["drafts dropped"] += 0 < asked and kept < asked
        self.name_blocks([chunk.request for chunk in plan.chunks])
        for chunk in plan.chunks:  # the model writes each computed token's K/V
            request = chunk.request
            for group, manager in enumerate(kv.managers):
                table = manager.tables[request.id]
                for p in range(chunk.start, chunk.end):
                    block = table[p // kv.block_size]
                    assert block != NULL_BLOCK, f"position {p} of a step in a null block"
                    self.slots[group][block * kv.block_size + p % kv.block_size] = \
                        request.tokens_with_spec[p]
        for i, chunk in enumerate(plan.chunks):
            request = chunk.request
            if chunk.end < request.num_tokens:
                continue  # a prefill chunk short of the prompt's end samples nothing
            kept = min(accepted[i % 8], len(request.spec_token_ids))
            self.seen["drafts rejected"] += kept < len(request.spec_token_ids)
            truth = request.spec_token_ids[:kept] + [3]  # 3: a token no draft ever is
            room = request.output_len - len(request.output)
            for token in truth[:room]:
                request.emit(token)
            rollback(s, request, kept)
        for request in list(s.running):
            if request.done:
                s.finish(request)
                self.finished += 1
        for i, request in enumerate(s.running):
            room = request.output_len - len(request.output) - 1
            request.spec_token_ids = drafts[i % 8][:max(room, 0)]

    @invariant()
    def computed_tokens_are_in_their_blocks(self):
        if self.scheduler is None:
            return
        kv = self.scheduler.kv_cache
        for request in self.scheduler.running:
            assert request.num_computed_tokens <= request.num_tokens
            for group, manager in enumerate(kv.managers):
                table = manager.tables[request.id]
                assert len(table) == -(-request.num_computed_tokens // kv.block_size)
                seen_from = (0 if manager.window is None else
                             max(0, request.num_computed_tokens - manager.window + 1))
                for p in range(seen_from, request.num_computed_tokens):
                    slot = table[p // kv.block_size] * kv.block_size + p % kv.block_size
                    assert table[p // kv.block_size] != NULL_BLOCK
                    assert self.slots[group].get(slot) == request.tokens[p], (
                        f"request {request.id}, group {group}: position {p} holds "
                        f"{self.slots[group].get(slot)}, its token is {request.tokens[p]}")

    def name_blocks(self, requests) -> None:
        size = self.scheduler.kv_cache.block_size
        for request in requests:
            tokens = request.tokens_with_spec
            for index, key in enumerate(prefix_keys(tokens, size)):
                self.named[key] = tokens[index * size:(index + 1) * size]

    @invariant()
    def cached_blocks_hold_their_tokens(self):
        """Every cached block holds the tokens its key names (keys of every sequence a
        request has had, drafts included, so that a key made of drafts is known too)."""
        if self.scheduler is None:
            return
        kv, size = self.scheduler.kv_cache, self.scheduler.kv_cache.block_size
        self.name_blocks([*self.scheduler.running, *self.scheduler.waiting])
        for (group, key), block in kv.pool.cached.items():
            written = [self.slots[group].get(block * size + o) for o in range(size)]
            assert written == self.named[key], (
                f"group {group}: block {block} is cached as {self.named[key]}, holds {written}")

    @invariant()
    def the_pools_books_balance(self):
        if self.scheduler is None:
            return
        kv = self.scheduler.kv_cache
        holders = Counter(b for m in kv.managers for t in m.tables.values() for b in t
                          if b != NULL_BLOCK)
        assert [holders[b] for b in range(1, kv.pool.num_blocks)] == kv.pool.ref_counts[1:]
        assert set(kv.pool.free_queue) == {b for b in range(1, kv.pool.num_blocks)
                                           if holders[b] == 0}
        if not self.scheduler.busy():
            assert kv.num_held() == 0


def test_drafts_are_scheduled_verified_and_rolled_back_without_a_wrong_slot():
    run_state_machine_as_test(SpeculativeServing, settings=settings(
        max_examples=150, stateful_step_count=30, deadline=None, **FIXED,
        suppress_health_check=[HealthCheck.too_slow], phases=[
            Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink]))
    # every path was taken, many times over: drafts given room, cut or refused, and rejected
    assert min(SpeculativeServing.seen[path] for path in (
        "drafts scheduled", "drafts dropped", "drafts rejected")) >= 20, SpeculativeServing.seen


# --- the KV side's rules broken one at a time: each is caught -------------------------------


def _cache_blocks_with_drafts(self, request):
    """Wrong: caches the request's blocks by its tokens and drafts together."""
    if self.enable_caching and request.id in self.managers[0].tables:
        tokens = request.tokens_with_spec
        full = min(request.num_computed_tokens, len(tokens)) // self.block_size
        keys = prefix_keys(tokens[:full * self.block_size], self.block_size)
        for manager in self.managers:
            manager.cache_blocks(request.id, keys)


@pytest.mark.parametrize("name, wrong", [
    ("schedule_lookahead", _room_asked_from_the_chunks_end),
    ("rollback", _drafts_cleared_before_counting),
    ("rollback", _pulls_back_the_accepted),
    ("rollback", _blocks_kept),
    ("cache_blocks", _cache_blocks_with_drafts),
], ids=["window-frees-past-the-first-token", "rollback-keeps-the-count",
        "rollback-pulls-back-the-accepted", "rollback-keeps-the-blocks", "drafts-cached"])
def test_each_rule_of_the_kv_side_broken_is_caught(name, wrong, monkeypatch):
    if name == "cache_blocks":
        monkeypatch.setattr(KVCacheCoordinator, "cache_blocks", _cache_blocks_with_drafts)
    else:
        monkeypatch.setitem(globals(), name, wrong)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(SpeculativeServing, settings=settings(
            max_examples=150, stateful_step_count=30, deadline=None, **FIXED,
            suppress_health_check=[HealthCheck.too_slow],
            phases=[Phase.explicit, Phase.generate]))


# --- what it buys: the expected tokens and the roofline ------------------------------------


@pytest.mark.parametrize(("alpha", "k"), [(0.3, 1), (0.6, 3), (0.9, 5)])
def test_the_expected_tokens_are_what_greedy_verification_emits_on_average(alpha, k):
    """Drafts the target agrees with independently, each with probability ``alpha``, verified
    by ``accept_greedy``: the mean number of tokens emitted is Leviathan et al.'s formula."""
    gen = torch.Generator().manual_seed(5)
    steps, emitted = 20_000, 0
    for _ in range(steps):
        agree = (torch.rand(k, generator=gen) < alpha).tolist()
        drafts = [1] * k
        target = [1 if a else 0 for a in agree] + [2]
        emitted += len(accept_greedy(drafts, target))
    assert emitted / steps == pytest.approx(expected_tokens(alpha, k), rel=0.02)


def test_the_expected_tokens_at_the_edges():
    assert expected_tokens(0.0, 4) == 1.0 and expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.7, 0) == 1.0
    with pytest.raises(ValueError):
        expected_tokens(1.5, 2)


@pytest.mark.parametrize("cost", [opt13b_a100_40gb(), llama3_8b_h100()],
                         ids=["opt-13b-a100", "llama-3-8b-h100"])
def test_speculation_pays_its_expected_tokens_while_memory_bound_and_less_as_the_batch_grows(
        cost):
    """At batch 1 a step is memory-bound whatever it verifies, so the speedup is the expected
    tokens, and each token emitted reads the KV divided among them; the speedup never grows
    with the batch."""
    for alpha, k in [(0.5, 2), (0.7, 4), (0.9, 8)]:
        assert speculation(cost, alpha, k, 1, 1024).speedup == pytest.approx(
            expected_tokens(alpha, k))
        plain = speculation(cost, alpha, 0, 1, 1024).kv_read_per_token
        assert plain == 1024 * cost.kv_bytes_per_token
        assert speculation(cost, alpha, k, 1, 1024).kv_read_per_token == pytest.approx(
            plain / expected_tokens(alpha, k))
        speedups = [speculation(cost, alpha, k, b, 1024).speedup for b in range(1, 400, 7)]
        assert all(a >= b - 1e-12 for a, b in zip(speedups, speedups[1:], strict=False))


def test_where_speculation_stops_paying_depends_on_the_kv_each_request_reads():
    """OPT-13B's KV (no grouped-query attention) keeps an A100 memory-bound at every batch its
    pool holds; Llama-3-8B on an H100 reaches the FLOPs' roof, where eight drafts at an
    acceptance of one half cost more than they bring, and one draft never does."""
    opt, llama = opt13b_a100_40gb(), llama3_8b_h100()
    assert break_even_batch(opt, 0.5, 8, 1024, largest_batch(opt, 40e9, 1024)) is None
    most = largest_batch(llama, 80e9, 1024)
    worse = break_even_batch(llama, 0.5, 8, 1024, most)
    assert worse is not None and worse < most
    assert speculation(llama, 0.5, 8, worse, 1024).speedup < 1 <= \
        speculation(llama, 0.5, 8, worse - 1, 1024).speedup
    assert break_even_batch(llama, 0.9, 1, 1024, most) is None


def test_the_pool_holds_the_requests_chapter_1_sizes():
    opt = opt13b_a100_40gb()
    blocks = num_gpu_blocks(40 * 10**9, 0.9, int(opt.weight_bytes), ACTIVATION_PEAK,
                            int(16 * opt.kv_bytes_per_token))
    assert largest_batch(opt, 40e9, 1024) == blocks // 64 > 0


@pytest.mark.parametrize(("alpha", "k"), [(0.5, 2), (0.8, 5)])
def test_the_blocks_lookahead_takes_and_gives_back_are_what_the_engines_rules_do(alpha, k):
    """One request decoding through chapter 9's step, ``schedule_lookahead`` and ``rollback``
    on a real KV cache, its drafts kept as drawn: the blocks its drafts took and gave back per
    step, on average, are ``lookahead_blocks``'s."""
    size, steps = 4, 6000
    scheduler = ChunkedScheduler(4 * steps, size, 64, kv_cache=KVCacheCoordinator(
        4 * steps, size, enable_caching=False))  # nothing to find: no keys to compute
    request = ChunkedRequest(0, [1, 2, 3], output_len=10 * steps)
    scheduler.add(request)
    gen = torch.Generator().manual_seed(3)
    taken = given_back = 0
    for _ in range(steps):
        request.spec_token_ids = [0] * k if request.output else []
        held = -(-(request.num_computed_tokens + 1) // size) if request.output else 0
        scheduler.step(lambda s: schedule_lookahead(s, schedule_step(s)))
        table = scheduler.kv_cache.block_table(0)
        if request.output:
            taken += len(table) - held
        kept = 0
        while kept < k and float(torch.rand((), generator=gen)) < alpha:
            kept += 1
        before = len(table)
        request.output += [9] * (kept + 1)  # the kept drafts, then the target's own token
        rollback(scheduler, request, min(kept, len(request.spec_token_ids)))
        given_back += before - len(scheduler.kv_cache.block_table(0))
    reserved, freed = lookahead_blocks(alpha, k, size)
    assert taken / (steps - 1) == pytest.approx(reserved, rel=0.05)
    assert given_back / steps == pytest.approx(freed, rel=0.08)
