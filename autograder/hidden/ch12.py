"""Chapter 12's hidden checks: drawn token lists, drafts and targets, and drawn scenarios on a
real KV cache, each checked against an oracle written another way (every n-gram and start
listed and the best one picked, drafts compared place by place, the step's budget and room
worked out chunk by chunk), with the known mistakes a hint names; then the tiny model served
with the learner's function in the speculative engine, token for token against greedy
generation.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace

from hypothesis import strategies as st

from autograder.checks._contract import LIST_OF_INTS, expect_cases
from autograder.checks._helpers import for_all, mistakes
from autograder.checks.ch12 import (
    ACCEPT_IDEA,
    LOOKAHEAD_IDEA,
    LOOKUP_IDEA,
    ROLLBACK_IDEA,
    Scenario,
    _accept,
    _lookup,
    compare,
    prepare,
    run_lookahead,
    run_rollback,
)
from autograder.private import thorough
from course.v1.chunked_scheduler import Chunk, ChunkedScheduler, Schedule

SEED = 2026  # random cases are seeded: grading a notebook twice gives the same score


# --- ngram_propose ----------------------------------------------------------------------------


def _lookup_with(longest: bool = True, first: bool = True, overlap: bool = True,
                 own_place: bool = False, cap: bool = True, from_min: bool = True) -> Callable:
    """Prompt lookup over every (n, start) listed, the best picked by the rules given."""

    def lookup(tokens, min_n, max_n, k):
        size = len(tokens)
        found = [(n, start) for n in range(min_n if from_min else 1, max_n + 1)
                 for start in range(size)
                 if n < size and (start <= size - n if own_place else start < size - n)
                 and (overlap or start + n <= size - n)
                 and tokens[start:start + n] == tokens[size - n:]]
        if not found:
            return []
        n, start = max(found, key=lambda f: (f[0] if longest else -f[0],
                                            -f[1] if first else f[1]))
        return tokens[start + n:start + n + k] if cap else tokens[start + n:]

    return lookup


_LOOKUP_MISTAKES = [
    (_lookup_with(longest=False), "The longest n that has an occurrence wins: try max_n "
     "first, then shorter n-grams."),
    (_lookup_with(first=False), "Of the longest n-gram's earlier occurrences, take the first "
     "(the lowest start), not the latest."),
    (_lookup_with(overlap=False), "An earlier occurrence may overlap the n-gram itself: every "
     "start before len(tokens) - n counts."),
    (_lookup_with(own_place=True), "The n-gram's own place (start len(tokens) - n) is no "
     "earlier occurrence: the starts stop before it, else every lookup finds itself and "
     "proposes nothing."),
    (_lookup_with(cap=False), "Propose at most k drafts."),
    (_lookup_with(from_min=False), "n never goes below min_n: a shorter match proposes "
     "nothing."),
]


def lookup_case(**case) -> tuple:
    return _lookup_with()(**case), mistakes(_LOOKUP_MISTAKES, case)


@st.composite
def _lookups(draw):
    tokens = draw(st.lists(st.integers(0, 3), min_size=1, max_size=24))
    min_n = draw(st.integers(1, 3))
    return _lookup(tokens, min_n, draw(st.integers(min_n, 5)), draw(st.integers(0, 6)))


@thorough
def check_ngram_propose_thoroughly(fn: Callable) -> None:
    """Drawn token lists of 1 to 24 tokens over 4 ids (repeats everywhere), n-grams of 1 to
    5 tokens, 0 to 6 drafts."""
    for_all(_lookups(), lambda case: expect_cases(fn, [case], lookup_case, LOOKUP_IDEA,
                                                  rel_tol=0, promise=LIST_OF_INTS), 300)


# --- accept_greedy ----------------------------------------------------------------------------


def _accepted(drafts, target) -> int:
    places = [i for i, (d, t) in enumerate(zip(drafts, target, strict=False)) if d != t]
    return places[0] if places else len(drafts)


_ACCEPT_MISTAKES = [
    (lambda drafts, target: list(drafts[:_accepted(drafts, target)]),
     "One token more follows the accepted drafts: the target's choice at the first draft "
     "rejected, or the bonus token after the last."),
    (lambda drafts, target: [*drafts[:_accepted(drafts, target)], target[-1]],
     "The token after the accepted drafts is the target's choice at that place, "
     "target[accepted], not its last."),
    (lambda drafts, target: (lambda kept: [*kept, target[len(kept)]])(
        [d for d, t in zip(drafts, target, strict=False) if d == t]),
     "Acceptance stops at the first draft that differs: a later draft that agrees was "
     "drafted after a wrong token, so it does not count."),
    (lambda drafts, target: [*drafts[:_accepted(drafts, target) + 1]]
     if _accepted(drafts, target) < len(drafts) else [*drafts, target[-1]],
     "At the first draft rejected the target's own choice is emitted, not the draft."),
    (lambda drafts, target: (lambda a: [*drafts[:a], target[a]])(
        next((i for i in range(len(drafts)) if drafts[i] != target[i + 1]), len(drafts))),
     "Draft i is compared with target[i], the target's choice at its own place (after the "
     "drafts before it)."),
]


def accept_case(**case) -> tuple:
    drafts, target = case["drafts"], case["target"]
    a = _accepted(drafts, target)
    return [*drafts[:a], target[a]], mistakes(_ACCEPT_MISTAKES, case)


@st.composite
def _verifications(draw):
    k = draw(st.integers(0, 6))
    target = draw(st.lists(st.integers(0, 4), min_size=k + 1, max_size=k + 1))
    agree = draw(st.lists(st.booleans(), min_size=k, max_size=k))
    drafts = [t if a else draw(st.integers(0, 4).filter(lambda x, t=t: x != t))
              for t, a in zip(target, agree, strict=False)]
    return _accept(drafts, target)


@thorough
def check_accept_greedy_thoroughly(fn: Callable) -> None:
    """Drawn drafts of 0 to 6 tokens, each agreeing with the target's choice or not."""
    for_all(_verifications(), lambda case: expect_cases(fn, [case], accept_case, ACCEPT_IDEA,
                                                        rel_tol=0, promise=LIST_OF_INTS), 300)


# --- schedule_lookahead -----------------------------------------------------------------------


def _lookahead_with(cut: bool = True, from_start: bool = True, all_or_none: bool = True,
                    drop: bool = True, at_end_only: bool = True, settle: bool = True,
                    spend: bool = True) -> Callable:
    """The lookahead, worked out chunk by chunk; each flag False is one rule broken."""

    def lookahead(scheduler: ChunkedScheduler, plan: Schedule) -> Schedule:
        kv = scheduler.kv_cache
        left = scheduler.max_num_batched_tokens - sum(c.num_tokens for c in plan.chunks)
        for place in range(len(plan.chunks)):
            chunk = plan.chunks[place]
            request = chunk.request
            if not request.spec_token_ids or (at_end_only and
                                              chunk.end != request.num_tokens):
                continue
            wanted = request.spec_token_ids[:left] if cut else list(request.spec_token_ids)
            request.spec_token_ids = wanted
            if not wanted:
                continue
            granted = 0
            for count in ([len(wanted)] if all_or_none else range(len(wanted), 0, -1)):
                request.num_computed_tokens = chunk.start if from_start else chunk.end
                asked = chunk.num_tokens + count if from_start else count
                if kv.allocate_slots(request, asked):
                    granted = count
                    break
            if granted:
                request.spec_token_ids = wanted[:granted]
                plan.chunks[place] = Chunk(request, chunk.start, chunk.num_tokens + granted)
                left -= granted if spend else 0
            elif drop:
                request.spec_token_ids = []
            request.num_computed_tokens = plan.chunks[place].end if settle else chunk.start
        return plan

    return lookahead


_LOOKAHEAD_MISTAKES = [
    (_lookahead_with(cut=False), "Drafts take only what the plan left of the budget: keep "
     "spec_token_ids[:budget]."),
    (_lookahead_with(spend=False), "The drafts a request is given come off the budget before "
     "the next chunk's are cut."),
    (_lookahead_with(from_start=False), "Room is asked from the chunk's first token "
     "(num_computed_tokens = chunk.start, then allocate_slots for the chunk and its drafts): "
     "asked from its end, a sliding window frees blocks the chunk's first token still "
     "reads."),
    (_lookahead_with(all_or_none=False), "All or none: a request whose drafts do not all find "
     "room gets none of them, not as many as fit."),
    (_lookahead_with(drop=False), "A request refused room keeps no drafts: its "
     "spec_token_ids become [] (verification would read slots it does not have)."),
    (_lookahead_with(at_end_only=False), "Only a chunk that ends at its request's last known "
     "token takes drafts: a prompt still in prefill has no token to verify them after."),
    (_lookahead_with(settle=False), "Either way, num_computed_tokens ends at the chunk's end "
     "(the tokens the step computes, drafts included)."),
]


def lookahead_case(s: Scenario) -> tuple:
    expected = run_lookahead(_lookahead_with(), s)
    return expected, [(run_lookahead(wrong, s), text) for wrong, text in _LOOKAHEAD_MISTAKES]


@st.composite
def _scenarios(draw, rolled_back: bool = False):
    windows = tuple(draw(st.lists(st.sampled_from([None, None, 2, 3, 5]), min_size=1,
                                  max_size=2)))
    count = draw(st.integers(1, 4))
    requests = tuple((draw(st.integers(1, 9)), draw(st.integers(1, 4))) for _ in range(count))
    drafts = tuple(tuple(draw(st.lists(st.integers(0, 9), max_size=5)))
                   for _ in range(count + 1))
    late = 0 if rolled_back else draw(st.sampled_from([0, 0, 3, 7]))
    accepted = tuple(draw(st.integers(0, len(d))) for d in drafts[:count])
    s = Scenario("a drawn scenario", windows, draw(st.sampled_from([1, 2, 4])),
                 draw(st.integers(8, 60)), draw(st.integers(count, 20)), requests,
                 drafts, late, accepted)
    return replace(s, text=_describe(s))


def _describe(s: Scenario) -> str:
    groups = ", ".join("full" if w is None else f"window {w}" for w in s.windows)
    asked = "; ".join(f"request {i}: prompt {p}, {g} generated, drafts {list(d)}"
                      for i, ((p, g), d) in enumerate(zip(s.requests, s.drafts, strict=False)))
    extra = f"; a new prompt of {s.late}" if s.late else ""
    kept = f"; drafts kept {list(s.accepted)}" if s.accepted else ""
    return (f"groups ({groups}), blocks of {s.block_size}, a pool of {s.num_blocks}, a budget "
            f"of {s.budget}; {asked}{extra}{kept}")


def _playable(s: Scenario, rolled_back: bool) -> bool:
    """Whether the scenario's requests reach decoding (and, for rollback, their drafts find
    room) in its pool."""
    try:
        scheduler = prepare(s)
    except (RuntimeError, ValueError):
        return False
    if rolled_back:
        kv = scheduler.kv_cache
        for request in scheduler.running:
            if not kv.allocate_slots(request, 1 + len(request.spec_token_ids)):
                return False
            request.num_computed_tokens += 1 + len(request.spec_token_ids)
    return True


@thorough
def check_schedule_lookahead_thoroughly(fn: Callable) -> None:
    """Drawn scenarios: one or two groups (full, windows of 2, 3 and 5), blocks of 1, 2 and
    4, pools from roomy to full, budgets from one token per request up, a new prompt in the
    same step; then the tiny model served with it, token for token."""
    for_all(_scenarios().filter(lambda s: _playable(s, False)),
            lambda s: compare("schedule_lookahead", s, run_lookahead(fn, s),
                              lookahead_case(s), LOOKAHEAD_IDEA), 120)
    serve_exactly("schedule_lookahead", lookahead=fn)


# --- rollback ---------------------------------------------------------------------------------


def _rollback_with(pull: str = "rejected", clear: bool = True, give_back: bool = True,
                   last_first: bool = True, every_group: bool = True,
                   keep: Callable[[int, int], int] = lambda n, size: -(-n // size)) -> Callable:

    def rollback(scheduler, request, num_accepted):
        drafts = len(request.spec_token_ids)
        request.num_computed_tokens -= {"rejected": drafts - num_accepted,
                                        "accepted": num_accepted, "none": 0}[pull]
        if clear:
            request.spec_token_ids = []
        kv = scheduler.kv_cache
        kept = keep(request.num_computed_tokens, kv.block_size)
        for manager in kv.managers[:None if every_group else 1]:
            table = manager.tables[request.id]
            past = table[kept:]
            if give_back:
                kv.pool.free_blocks(past[::-1] if last_first else past)
                del table[kept:]

    return rollback


_ROLLBACK_MISTAKES = [
    (_rollback_with(pull="accepted"), "The computed tokens pull back by the drafts rejected, "
     "len(spec_token_ids) - num_accepted, not by those accepted."),
    (_rollback_with(pull="none"), "The rejected drafts' tokens are no longer computed: pull "
     "num_computed_tokens back by them (before emptying spec_token_ids)."),
    (_rollback_with(clear=False), "After the verification the request has no drafts left: "
     "spec_token_ids = []."),
    (_rollback_with(give_back=False), "The blocks past the computed tokens hold only rejected "
     "drafts: give them back to the pool and take them out of the table."),
    (_rollback_with(last_first=False), "Give the blocks back last first, as a finished "
     "request's are: the pool then evicts a table's tail before its head."),
    (_rollback_with(every_group=False), "Every group holds the drafts' blocks: give them back "
     "in each of kv.managers."),
    (_rollback_with(keep=lambda n, size: n // size), "A table keeps ceil(num_computed_tokens "
     "/ block_size) blocks: a block partly filled by computed tokens stays."),
]


def rollback_case(s: Scenario) -> tuple:
    expected = run_rollback(_rollback_with(), s)
    return expected, [(run_rollback(wrong, s), text) for wrong, text in _ROLLBACK_MISTAKES]


@thorough
def check_rollback_thoroughly(fn: Callable) -> None:
    """Drawn scenarios (as schedule_lookahead's) with drawn drafts kept, every request rolled
    back in turn; then the tiny model served with it, token for token."""
    for_all(_scenarios(rolled_back=True).filter(lambda s: _playable(s, True)),
            lambda s: compare("rollback", s, run_rollback(fn, s), rollback_case(s),
                              ROLLBACK_IDEA), 120)
    serve_exactly("rollback", roll_back=fn)


# --- the tiny model, served with the learner's function ---------------------------------------


def serve_exactly(name: str, **given: Callable) -> None:
    """The tiny model served by the speculative engine with ``given`` in place of the
    course's (blocks of 2, a budget of 10, a pool of 40: drafts cut and refused), drafts
    from a proposer that knows the continuation and errs one time in three; every request's
    tokens against greedy generation, every block back."""
    from course.tiny_model import TinyModel, generate_contiguous
    from course.v1.chunked_engine import engine_requests, serve_chunked
    from course.v1.speculative_engine import SpeculativeEngine

    rng = random.Random(SEED)
    model = TinyModel(seed=SEED)
    specs = [([rng.randrange(128) for _ in range(rng.randint(2, 10))], rng.randint(4, 14),
              rng.randint(0, 3)) for _ in range(5)]
    truth = [generate_contiguous(model, prompt, n)[0] for prompt, n, _ in specs]

    def propose(request, k):
        right = truth[request.id][len(request.output):len(request.output) + k]
        return [t if rng.random() > 1 / 3 else (t + 1) % 128 for t in right]

    engine = SpeculativeEngine(model, 40, 2, 10, 4, propose=propose, **given)
    label = f"the tiny model served with speculation and your {name} (blocks of 2, a " \
            "budget of 10, 4 drafts a step)"
    try:
        served = serve_chunked(engine, engine_requests(specs), max_steps=400)
    except (AssertionError, ValueError, IndexError, KeyError, RuntimeError) as error:
        raise AssertionError(f"{label}: serving stopped: {type(error).__name__}: "
                             f"{error}") from None
    for request in sorted(served, key=lambda r: r.id):
        if request.output != truth[request.id]:
            raise AssertionError(f"{label}: request {request.id} generated {request.output}, "
                                 f"greedy generation {truth[request.id]}: a draft rejected "
                                 "left its K/V where a real token was then read, or a real "
                                 "token's slot was lost.")
    if engine.kv_cache.num_held():
        raise AssertionError(f"{label}: after serving, {engine.kv_cache.num_held()} blocks "
                             "are still held.")
