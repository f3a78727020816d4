"""Visible checks for chapter 12, speculative decoding's KV side: each TODO's readable cases.
Expected values, and what known mistakes give, come from the chapter's hidden module
(``autograder.private``), where the thorough checks are.

The two function TODOs are held to their contracts case by case (``_contract.expect``). The
KV side is played on a real KV cache from a scenario written as plain data (``Scenario``):
requests brought to decoding by chapter 9's scheduling step, drafts given, then the step
under test; what a correct step leaves is read in terms every correct answer shows alike
(chunks, computed tokens, drafts, where each table's blocks and null blocks stand, the free
blocks, and which of a table's blocks went back in what order), never which block ids the
pool happened to hand out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from autograder.checks._contract import LIST_OF_INTS, expect_cases
from autograder.checks._helpers import learner_call
from autograder.private import private, visible
from course.v1.chunked_scheduler import ChunkedRequest, ChunkedScheduler, Schedule, schedule_step
from course.v1.hybrid_coordinator import HybridKVCacheCoordinator
from course.v1.kv_coordinator import NULL_BLOCK

LOOKUP_IDEA = ("Try the longest n first (max_n, and below len(tokens)), down to min_n; for "
               "each, look for the last n tokens at every start before len(tokens) - n (an "
               "occurrence may overlap them), take the first occurrence of the longest n that "
               "has one, and propose at most k of the tokens that followed it.")
ACCEPT_IDEA = ("Accept drafts from the first while each equals the target's choice at its "
               "place (target[i] for draft i); at the first that differs, stop. Then one "
               "token more, the target's own at that place: target[accepted].")
LOOKAHEAD_IDEA = ("For each chunk, in the plan's order, whose request has drafts and which "
                  "ends at its last known token: keep only the drafts the budget the plan left "
                  "holds; ask allocate_slots for the chunk and its drafts with "
                  "num_computed_tokens set back to chunk.start; made: the chunk grows by the "
                  "drafts and they come off the budget; refused: the drafts become [] and the "
                  "chunk stays; either way num_computed_tokens is the chunk's end.")
ROLLBACK_IDEA = ("num_computed_tokens pulls back by the drafts rejected, len(spec_token_ids) - "
                 "num_accepted; then the request has no drafts; in every group its table keeps "
                 "ceil(num_computed_tokens / block_size) blocks and gives the rest back to the "
                 "pool, last first.")


# --- ngram_propose and accept_greedy ----------------------------------------------------------


def _lookup(tokens: list[int], min_n: int, max_n: int, k: int) -> dict:
    return dict(tokens=tokens, min_n=min_n, max_n=max_n, k=k)


@visible
def check_ngram_propose(fn: Callable) -> None:
    """[1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3]: the trigram 1 2 3 first at 0, so 9 1 (k = 2);
    [5, 4, 6, 3, 4, 7, 6, 3, 4]: the longest n wins (6 3 4, then 7 6); [7, 7, 7, 7]: an
    occurrence overlapping the n-gram (7 7 7 at 0); [1, 2, 3]: nothing found; k = 0;
    min_n = 2 where only one token repeats."""
    cases = [_lookup([1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3], 1, 3, 2),
             _lookup([5, 4, 6, 3, 4, 7, 6, 3, 4], 1, 3, 3),
             _lookup([7, 7, 7, 7], 1, 3, 3),
             _lookup([1, 2, 3], 1, 3, 4),
             _lookup([4, 5, 4, 5], 1, 2, 0),
             _lookup([1, 2, 5, 1], 2, 3, 2)]
    expect_cases(fn, cases, private("12").lookup_case, LOOKUP_IDEA, rel_tol=0,
                 promise=LIST_OF_INTS)


def _accept(drafts: list[int], target: list[int]) -> dict:
    return dict(drafts=drafts, target=target)


@visible
def check_accept_greedy(fn: Callable) -> None:
    """Drafts 4 7 9 against the target's 4 7 2 5 (two accepted, then 2); every draft accepted
    (then the bonus token); the first rejected; no drafts; a draft that agrees after one that
    did not (it does not count)."""
    cases = [_accept([4, 7, 9], [4, 7, 2, 5]), _accept([4, 7], [4, 7, 8]),
             _accept([4, 7], [5, 7, 8]), _accept([], [3]), _accept([4, 7, 9], [4, 1, 9, 6])]
    expect_cases(fn, cases, private("12").accept_case, ACCEPT_IDEA, rel_tol=0,
                 promise=LIST_OF_INTS)


# --- the KV side: scenarios on a real KV cache ------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """A KV cache of ``windows`` (None: full attention) in blocks of ``block_size``, a pool of
    ``num_blocks``, a step budget of ``budget``. Each request is ``(prompt length, tokens it
    has generated)``; chapter 9's scheduling step brings them all to decoding (every token
    computed but the newest), then ``drafts[i]`` is request i's drafts. ``late``: a request
    that arrives for the step under test with ``late`` prompt tokens (its prefill shares the
    step). ``accepted[i]``: drafts of request i a verification kept (rollback's scenarios)."""

    text: str
    windows: tuple[int | None, ...]
    block_size: int
    num_blocks: int
    budget: int
    requests: tuple[tuple[int, int], ...]
    drafts: tuple[tuple[int, ...], ...]
    late: int = 0
    accepted: tuple[int, ...] = field(default_factory=tuple)


def prepare(s: Scenario) -> ChunkedScheduler:
    """The scheduler of scenario ``s``, its requests decoding with their drafts given: built
    with chapter 9's scheduling step, tokens scripted (request i's tokens are 100 i + 0, 1,
    ...: no two requests share a block). A request that has generated its tokens waits
    aside until the others have, so that nothing more is computed for it."""
    kv = HybridKVCacheCoordinator(s.num_blocks, s.block_size, list(s.windows))
    scheduler = ChunkedScheduler(s.num_blocks, s.block_size, s.budget, kv_cache=kv)
    requests = [ChunkedRequest(i, [100 * i + t for t in range(prompt)], generated + 8)
                for i, (prompt, generated) in enumerate(s.requests)]
    for request in requests:
        scheduler.add(request)
    wanted = {r.id: generated for r, (_, generated) in zip(requests, s.requests, strict=True)}
    aside: list[ChunkedRequest] = []
    for _ in range(500):
        if len(aside) == len(requests):
            break
        plan = scheduler.step(schedule_step)
        if plan.preempted:
            raise RuntimeError(f"the checks' scenario preempted a request: {s.text}")
        for chunk in plan.chunks:
            r = chunk.request
            if chunk.end == r.num_tokens:
                r.emit(r.prompt[0] + len(r.prompt) + len(r.output))
            if len(r.output) == wanted[r.id]:
                scheduler.running.remove(r)
                aside.append(r)
    else:
        raise RuntimeError(f"the checks' scenario never settled: {s.text}")
    scheduler.running = sorted(aside, key=lambda r: r.id)
    late = [ChunkedRequest(len(requests), [900 + t for t in range(s.late)], 4)] if s.late \
        else []
    for request, drafts in zip([*requests, *late], s.drafts, strict=False):
        request.spec_token_ids = list(drafts)
    for request in late:
        scheduler.add(request)
    return scheduler


def read_state(scheduler: ChunkedScheduler, freed: dict[int, list[int]] | None = None
               ) -> dict:
    """What a step leaves, in terms every correct answer shows alike: per request its
    computed tokens, drafts, and each table as # (a block) and . (the null block); per
    request, which places of its tables went back to the pool, in order; the free blocks."""
    kv = scheduler.kv_cache
    state: dict = {}
    for r in sorted([*scheduler.running, *scheduler.waiting], key=lambda r: r.id):
        tables = ["-" if m.tables.get(r.id) is None else
                  "".join("." if b == NULL_BLOCK else "#" for b in m.tables[r.id])
                  for m in kv.managers]
        state[("request", r.id)] = (r.num_computed_tokens, list(r.spec_token_ids), tables)
    for request_id, places in (freed or {}).items():
        state[("freed", request_id)] = places
    state["free"] = kv.num_free()
    return state


def run_lookahead(fn: Callable, s: Scenario) -> dict:
    """Scenario ``s``'s step: chapter 9's scheduling step, then ``fn``; the plan and the state
    it leaves."""
    scheduler = prepare(s)

    def step(sched: ChunkedScheduler) -> Schedule:
        plan = schedule_step(sched)
        returned = learner_call("schedule_lookahead", fn, sched, plan)
        if returned is not plan:
            raise AssertionError(f"`schedule_lookahead(scheduler, plan)` on {s.text} returned "
                                 f"{type(returned).__name__}, not the plan it was given: "
                                 "change the plan's chunks in place and return it.")
        return plan

    plan = scheduler.step(step)
    return {"chunks": [(c.request.id, c.start, c.num_tokens) for c in plan.chunks],
            **read_state(scheduler)}


def run_rollback(fn: Callable, s: Scenario) -> dict:
    """Scenario ``s`` after a verification: each request's drafts given room and computed
    (what a step with them leaves), ``accepted[i]`` of them and one token more emitted, then
    ``fn`` for each request in turn; the state it leaves, and which places of each request's
    tables went back to the pool, in the order they went."""
    scheduler = prepare(s)
    kv = scheduler.kv_cache
    before: dict[int, list[list[int]]] = {}
    for request in scheduler.running:
        drafts = request.spec_token_ids
        if not kv.allocate_slots(request, 1 + len(drafts)):
            raise RuntimeError(f"the checks' scenario has no room for its drafts: {s.text}")
        request.num_computed_tokens += 1 + len(drafts)
        before[request.id] = [list(m.tables[request.id]) for m in kv.managers]
    queue_before = list(kv.pool.free_queue)
    for request in sorted(scheduler.running, key=lambda r: r.id):
        kept = s.accepted[request.id]
        for token in [*request.spec_token_ids[:kept], 1]:
            request.emit(token)
        learner_call("rollback", fn, scheduler, request, kept)
    returned = [b for b in kv.pool.free_queue if b not in queue_before]
    freed = {request_id: [table.index(b) for b in returned for table in tables if b in table]
             for request_id, tables in before.items()}
    return read_state(scheduler, freed)


def _request_words(state: tuple) -> str:
    computed, drafts, tables = state
    return f"{computed} tokens computed, drafts {drafts}, tables {tables}"


def difference(got: dict, expected: dict) -> str:
    """The first thing ``got`` says otherwise than ``expected``, in words."""
    key = next((k for k in expected if got.get(k) != expected[k]), None)
    if key is None:
        unexpected = next(k for k in got if k not in expected)
        return f"it left {unexpected} behind, which no correct step leaves"
    if key == "free":
        return f"{got.get(key)} blocks are free after it, expected {expected[key]}"
    if key == "chunks":
        return (f"the plan's chunks (request, start, tokens) are {got.get(key)}, expected "
                f"{expected[key]}")
    if key[0] == "request":
        left = _request_words(got[key]) if key in got else "gone"
        return (f"request {key[1]} is left with {left}; expected "
                f"{_request_words(expected[key])}")
    return (f"the places of request {key[1]}'s tables given back, in order, are "
            f"{got.get(key)}, expected {expected[key]}")


def compare(todo: str, s: Scenario, got: dict,
            answers: tuple[dict, list[tuple[dict, str]]], idea: str) -> None:
    """``got`` against the expected state; the first difference, with the known mistake that
    leaves exactly this state, else the idea."""
    expected, known = answers
    if got == expected:
        return
    found = difference(got, expected)
    said = next((text for state, text in known if state == got), idea)
    if todo == "schedule_lookahead":
        raise AssertionError(f"`schedule_lookahead(scheduler, plan)` on {s.text}: {found}. "
                             f"{said}")
    raise AssertionError(f"`rollback(scheduler, request, num_accepted)` on {s.text}: {found}. "
                         f"{said}")


LOOKAHEAD_SCENARIOS = [
    Scenario("three requests decoding with 5, 7 and 3 drafts, a budget of 9 (3 taken by "
             "their own tokens: 6 left for drafts), blocks of 4, a roomy pool", (None,), 4, 40,
             9, ((5, 2), (3, 1), (6, 3)),
             ((11, 12, 13, 14, 15), (21, 22, 23, 24, 25, 26, 27), (31, 32, 33))),
    Scenario("a pool with one block free: request 0's 5 drafts need two new blocks, request "
             "1's draft fits in its own", (None,), 4, 6, 16, ((7, 1), (6, 1)),
             ((1, 2, 3, 4, 5), (4,))),
    Scenario("a sliding window of 3 in blocks of 2, one request at 6 tokens with 2 drafts",
             (3,), 2, 20, 16, ((4, 2),), ((5, 6),)),
    Scenario("a request decoding with 2 drafts and a new prompt of 6 (with 3 drafts of its "
             "own) in the same step, a budget of 6: nothing left for drafts", (None,), 4, 40, 6,
             ((3, 1),),
             ((7, 8), (5, 5, 5)), late=6),
]


@visible
def check_schedule_lookahead(fn: Callable) -> None:
    """Drafts cut to what the budget leaves, in the plan's order; all-or-none room (one
    request refused, the next granted); a sliding window asked from the chunk's first
    token; a chunk of a new prompt beside a request with drafts."""
    for s in LOOKAHEAD_SCENARIOS:
        answers = private("12").lookahead_case(s)
        compare("schedule_lookahead", s, run_lookahead(fn, s), answers, LOOKAHEAD_IDEA)


ROLLBACK_SCENARIOS = [
    Scenario("blocks of 4: request 0 at 7 tokens keeps 1 of its 4 drafts, request 1 at 4 "
             "keeps 2 of 2", (None,), 4, 40, 16, ((5, 2), (3, 1)), ((1, 2, 3, 4), (5, 6)),
             accepted=(1, 2)),
    Scenario("blocks of 1, a full and a sliding group (window 2): 0 of 3 drafts kept",
             (None, 2), 1, 60, 16, ((3, 2),), ((7, 8, 9),), accepted=(0,)),
    Scenario("blocks of 2: 1 of 5 drafts kept, two blocks past the computed tokens", (None,),
             2, 40, 16, ((2, 1),), ((4, 5, 6, 7, 8),), accepted=(1,)),
]


@visible
def check_rollback(fn: Callable) -> None:
    """Drafts partly kept, every one kept, none kept (in a full and a sliding group, blocks of
    1), and two blocks given back (last first)."""
    for s in ROLLBACK_SCENARIOS:
        answers = private("12").rollback_case(s)
        compare("rollback", s, run_rollback(fn, s), answers, ROLLBACK_IDEA)
