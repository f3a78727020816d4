"""Speculative decoding's proposals and verification (``course.v1.spec_decode``): prompt lookup
against a second implementation written from vLLM's description (a prefix-function scan of the
reversed tokens), greedy acceptance against its definition, and the rejection sampler against
the target's own distribution, measured on a tiny vocabulary; wrong samplers are caught by the
same measure."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course.v1.spec_decode import accept_greedy, ngram_propose, rejection_sample


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


@settings(max_examples=400, deadline=None)
@given(tokens=st.lists(st.integers(0, 3), max_size=24), min_n=st.integers(1, 4),
       extra=st.integers(0, 3), k=st.integers(0, 5))
def test_prompt_lookup_agrees_with_the_prefix_function_scan(tokens, min_n, extra, k):
    max_n = min_n + extra
    assert ngram_propose(tokens, min_n, max_n, k) == \
        _lookup_by_prefix_function(tokens, min_n, max_n, k)


def test_prompt_lookup_refuses_an_empty_range_of_n():
    with pytest.raises(ValueError, match="min_n <= max_n"):
        ngram_propose([1, 2, 3], min_n=3, max_n=2, k=2)


@settings(max_examples=200, deadline=None)
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
