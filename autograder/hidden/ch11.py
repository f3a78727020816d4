"""Chapter 11's hidden checks: drawn prompts, tiers and whole runs of the connector engine, each
checked against a second reading of the rules (a block-by-block lookup, a scheduler half that
keys a request's tokens afresh each call, an admission that sorts the queue in one pass), the
known mistakes a hint names, and the fault cases run through the tiny model: a failed load, a
prefill engine whose decode engine lets its lease run out, one whose decode engine never
reads.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from autograder.checks._contract import expect
from autograder.checks._helpers import for_all, mistakes
from autograder.checks._lending import one_bug_one_todo
from autograder.checks.ch11 import (
    ADMIT_IDEA,
    MATCH_IDEA,
    MATCHED,
    META_IDEA,
    METADATA_PARTS,
    SUBJECT,
    RoundFailed,
    describe_raised,
    describe_run,
    expect_admission,
    play_metadata,
    run_engine,
    scheduler_half,
)
from autograder.private import thorough
from course.notebook import connector_demo
from course.tiny_model import TinyModel
from course.v0.prefix_cache import prefix_keys
from course.v1.chunked_scheduler import Chunk
from course.v1.connector_engine import admit_with_connector
from course.v1.kv_connector import KVConnectorMetadata
from course.v1.offloading_connector import BlockCopy, OffloadingConnectorScheduler

_TODOS = ("get_num_new_matched_tokens", "build_connector_meta")


# --- get_num_new_matched_tokens ----------------------------------------------------------------


def _found(prompt_len: int, hit: int, block_size: int, ready: set[int]) -> int:
    """Blocks the tier can give, counted one by one: from the hit's end while held, never the
    block of the last token."""
    count, index = 0, hit // block_size
    while (index + 1) * block_size <= prompt_len - 1 and index in ready:
        count, index = count + 1, index + 1
    return count


def _wrong_match(prompt_extra: int = 0, from_start: bool = False, per_block: int | None = None,
                 writing_counts: bool = False, always_async: bool = False,
                 prompt_only: bool = False) -> Callable:
    """A known mistake's answer: the lookup from block 0, past the last token's block, in
    blocks, counting blocks being written, asynchronous with nothing to load, or bounded by
    the prompt rather than every token."""

    def wrong(prompt, num_computed_tokens, block_size, tier_holds, being_stored, output=()):
        held = set(tier_holds) | (set(being_stored) if writing_counts else set())
        tokens = len(prompt) + (0 if prompt_only else len(output))
        found = _found(tokens + prompt_extra * block_size,
                       0 if from_start else num_computed_tokens, block_size, held)
        return found * (per_block or block_size), found > 0 or always_async

    return wrong


_MATCH_MISTAKES = [
    (_wrong_match(from_start=True),
     "The GPU's hit is computed already: ask the tier about the blocks after it only."),
    (_wrong_match(prompt_extra=1),
     "The block that holds the last token is never loaded: the last token is computed for its "
     "logits (chapter 4's rule)."),
    (_wrong_match(per_block=1), "It returns tokens, not blocks: each block is block_size "
                                "tokens."),
    (_wrong_match(writing_counts=True),
     "A block still being written cannot be loaded yet: tier.lookup counts only those stored."),
    (_wrong_match(always_async=True),
     "With nothing to load there is nothing to wait for: (0, False)."),
    (_wrong_match(prompt_only=True),
     "A request can come back with generated tokens (after a preemption): its candidates run "
     "to the block of its last token, (request.num_tokens - 1) // block_size, over "
     "request.tokens (the prompt, then every token generated), not the prompt's last."),
]


def match_case(**case: Any) -> tuple:
    tokens = len(case["prompt"]) + len(case.get("output", ()))
    found = _found(tokens, case["num_computed_tokens"], case["block_size"],
                   set(case["tier_holds"]))
    return (found * case["block_size"], found > 0), mistakes(_MATCH_MISTAKES, case)


@st.composite
def _match_cases(draw) -> dict:
    block_size = draw(st.integers(1, 6))
    prompt_len = draw(st.integers(1, 40))
    generated = draw(st.sampled_from([0, 0, 1, block_size, 2 * block_size + 1]))
    tokens = prompt_len + generated  # a request back after a preemption has generated some
    hit = block_size * draw(st.integers(0, (tokens - 1) // block_size))
    blocks = list(range(tokens // block_size)) or [0]
    holds = draw(st.sets(st.sampled_from(blocks))) if tokens >= block_size else set()
    writing = (draw(st.sets(st.sampled_from(blocks))) - holds) if holds or \
        tokens >= block_size else set()
    sequence = [(7 * i + 3) % 50 for i in range(tokens)]
    return dict(prompt=sequence[:prompt_len], num_computed_tokens=hit, block_size=block_size,
                tier_holds=sorted(holds), being_stored=sorted(writing),
                output=sequence[prompt_len:])


@thorough
def check_get_num_new_matched_tokens_thoroughly(subject: Any) -> None:
    """Drawn prompts of 1 to 40 tokens in blocks of 1 to 6, some with tokens generated
    before a preemption, GPU hits, held and half-written blocks."""
    from autograder.checks.ch11 import matching

    fn = matching(subject)

    def check(case: dict) -> None:
        expected, known = match_case(**case)
        expect(fn, case, expected, MATCH_IDEA, known, rel_tol=0, promise=MATCHED)

    for_all(_match_cases(), check, max_examples=150)


# --- build_connector_meta ----------------------------------------------------------------------


class _OracleHalf(OffloadingConnectorScheduler):
    """The scheduler half read another way: a request's keys made afresh from its tokens each
    call, blocks walked one at a time."""

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        keys = prefix_keys(request.tokens, self.block_size)
        found = _found(request.num_tokens, num_computed_tokens, self.block_size,
                       {i for i, key in enumerate(keys) if key in self.tier.ready})
        return found * self.block_size, found > 0

    def build_connector_meta(self, schedule, block_ids):
        loads, self.pending = self.pending, {}
        self.loading.update({r: [copy.key for copy in copies] for r, copies in loads.items()})
        saves = {}
        for chunk in schedule.chunks:
            keys = prefix_keys(chunk.request.tokens, self.block_size)
            completed = range(chunk.start // self.block_size, chunk.end // self.block_size)
            room = self.tier.prepare_store([keys[i] for i in completed])
            if room is None:
                continue
            index_of = {keys[i]: i for i in completed}
            copies = [BlockCopy(block_ids[chunk.request.id][index_of[key]], cpu, key)
                      for key, cpu in room[0]]
            if copies:
                saves[chunk.request.id] = copies
        return KVConnectorMetadata(loads=loads, saves=saves)


def metadata_outcomes(prompts, block_size, capacity, held, steps) -> list[dict]:
    return [event[1] for event in play_metadata(_OracleHalf, prompts, block_size, capacity,
                                                held, steps) if event[0] == "seen"]


def _requests(seed: int, count: int, conversations: int) -> list[tuple]:
    return [(r.id, r.prompt, r.output_len, r.arrival)
            for r in connector_demo.conversations(count, seed, conversations)]


@st.composite
def _runs(draw, late: bool = False, sources: tuple = ("tier",)) -> dict:
    """A drawn run: conversations whose turns come back to their prefixes, a GPU pool that
    fits the longest request (and 0 to 3 blocks more, and the null block), a tier of 4 to 40
    blocks, loads of 1 to 3 steps, some failing."""
    seed = draw(st.integers(0, 10_000))
    block_size = draw(st.sampled_from([1, 2, 4]))
    requests = _requests(seed, draw(st.integers(3, 10)), draw(st.integers(2, 4)))
    longest = max(-(-(len(prompt) + out) // block_size) for _, prompt, out, _ in requests)
    rng = random.Random(seed)
    blocks = sorted({(r[0], i) for r in requests for i in range(len(r[1]) // block_size)})
    share = draw(st.sampled_from([0.0, 0.0, 0.3]))
    run = dict(num_blocks=longest + 1 + draw(st.integers(0, 3)), block_size=block_size,
               budget=draw(st.integers(2, 24)), max_num_seqs=draw(st.integers(1, 4)),
               cpu_blocks=draw(st.integers(4, 40)), load_steps=draw(st.integers(1, 3)),
               requests=requests, failing=[b for b in blocks if rng.random() < share])
    if late:
        run["late"] = {r[0]: rng.randint(1, 2) for r in requests if rng.random() < 0.3}
    source = draw(st.sampled_from(sources))
    if source != "tier":
        run |= {"source": source, "failing": [r[0] for r in requests if rng.random() < share]}
    return run


def _same_metadata(half: type, run: dict) -> None:
    """The run with ``half`` as the scheduler half shows, step by step, the oracle's
    metadata."""
    name = "build_connector_meta"
    expected = run_engine(admit_with_connector, **run, half=_OracleHalf)
    try:
        seen = run_engine(admit_with_connector, **run, half=half)
    except NotImplementedError:
        from autograder.checks._helpers import not_written

        raise AssertionError(not_written(name)) from None
    except Exception as exc:
        exc = exc.exc if isinstance(exc, RoundFailed) else exc
        raise AssertionError(
            f"With {describe_run(run)}, the engine with your {SUBJECT} raised "
            f"{describe_raised(exc)}: what build_connector_meta handed the worker, or kept "
            f"of it, did not add up for the tier (a load handed over twice, a load's keys not "
            f"kept in self.loading, a block saved before it is full). {META_IDEA}") from None
    for step, (mine, want) in enumerate(zip(seen, expected, strict=False)):
        for part, words in METADATA_PARTS:
            if mine["metadata"][part] != want["metadata"][part]:
                raise AssertionError(
                    f"With {describe_run(run)}, at step {step} (chunks as (request, first "
                    f"token, tokens): {want['chunks']}) {name}(schedule, block_ids) gave "
                    f"{words} {mine['metadata'][part]}, expected {want['metadata'][part]} "
                    "(copies as (GPU block, CPU block, (request, block index))).")
    assert len(seen) == len(expected), (
        f"With {describe_run(run)}, your {SUBJECT} served the requests in {len(seen)} steps, "
        f"expected {len(expected)}.")


@thorough
def check_build_connector_meta_thoroughly(subject: Any) -> None:
    """Drawn runs of the engine (the course's admission) with the learner's scheduler half:
    every step's loads, saves and tier against the oracle's. Where it fails, again with the
    course's ``get_num_new_matched_tokens`` lent."""
    cls = scheduler_half(subject, "build_connector_meta")

    def check(half: type) -> None:
        for_all(_runs(), lambda run: _same_metadata(half, run), max_examples=100)

    one_bug_one_todo(check, cls, OffloadingConnectorScheduler, _TODOS,
                     ("get_num_new_matched_tokens",))


# --- admit_with_connector ----------------------------------------------------------------------


def _admit_in_one_pass(scheduler, plan) -> None:
    """The admission read another way: the queue sorted in one pass into those that run and
    those that stay, in order; a new request's hit, load and room worked out before any of
    it is written on the request."""
    kv, connector = scheduler.kv_cache, scheduler.connector
    left = scheduler.max_num_batched_tokens - plan.total_num_scheduled_tokens
    queue, stay, new_fit = list(scheduler.waiting), [], True
    scheduler.waiting.clear()
    for position, request in enumerate(queue):
        if plan.preempted or left <= 0 or len(scheduler.running) >= scheduler.max_num_seqs:
            stay += queue[position:]
            break
        if request.id in scheduler.loading and request.id not in scheduler.received:
            stay.append(request)
            continue
        if request.id in scheduler.loading:
            scheduler.loading.discard(request.id)
            scheduler.received.discard(request.id)
            kv.cache_blocks(request)
        elif not new_fit:
            stay.append(request)
            continue
        else:
            hit = kv.get_computed_tokens(request)
            request.num_computed_tokens = hit
            loadable, _ = connector.get_num_new_matched_tokens(request, hit)
            if loadable is None or not kv.allocate_slots(
                    request, request.num_tokens - hit if loadable
                    else min(request.num_tokens - hit, left)):
                new_fit = new_fit and loadable is None
                request.num_computed_tokens = 0
                stay.append(request)
                continue
            connector.update_state_after_alloc(request, kv.block_table(request.id), loadable)
            if loadable:
                request.num_computed_tokens = hit + loadable
                scheduler.loading.add(request.id)
                stay.append(request)
                continue
        take = min(request.num_tokens - request.num_computed_tokens, left)
        plan.chunks.append(Chunk(request, request.num_computed_tokens, take))
        request.num_computed_tokens += take
        left -= take
        scheduler.running.append(request)
    scheduler.waiting.extend(stay)


def admission_outcomes(**scenario: Any) -> list[dict]:
    return run_engine(_admit_in_one_pass, **scenario)


def _loading_run(block_size: int, num_blocks: int, load_steps: int) -> dict:
    """Two conversations whose blocks a long prompt evicts from the GPU, their second turns
    loading them from the tier while new requests come, and a third turn arriving as the
    first one's load lands (it finds the loaded blocks on the GPU, if they were cached
    as it ran)."""
    chat_a, chat_b = list(range(500, 510)), list(range(540, 549))
    return dict(num_blocks=num_blocks, block_size=block_size, budget=24, max_num_seqs=4,
                cpu_blocks=64, load_steps=load_steps, requests=[
                    (0, chat_a, 2, 0), (1, chat_b, 2, 0), (2, list(range(600, 656)), 1, 3),
                    (3, [*chat_a, 10, 11, 12, 13, 14], 2, 7), (4, [*chat_b, 49, 50, 51, 52], 1, 7),
                    (5, list(range(700, 724)), 1, 8), (7, list(range(800, 806)), 1, 8),
                    (6, [*chat_a, *range(10, 18)], 1, 7 + load_steps)])


_LOADING_RUNS = [_loading_run(2, 32, 2), _loading_run(4, 16, 3)]


_MODEL: dict[str, TinyModel] = {}


def _faults_survived(fn: Callable) -> None:
    """Through the tiny model: loads that fail, a prefill engine whose lease runs out before
    the decode engine reads, one whose decode engine never reads. Every token as contiguous
    generation gives it, every block back in its pool."""
    try:
        _faults_served(fn)
    except AssertionError:
        raise
    except Exception as exc:
        raise AssertionError(f"Serving conversation turns through the tiny model with "
                             f"admit_with_connector(scheduler, plan): {type(exc).__name__}: "
                             f"{exc}. {ADMIT_IDEA}") from None


def _faults_served(fn: Callable) -> None:
    model = _MODEL.setdefault("tiny", TinyModel())
    name = "admit_with_connector"
    for label in ("failed loads", "preemption and failures"):
        row = connector_demo.offload_row(model, connector_demo.OFFLOAD_SCENARIOS[label],
                                         admit=fn, scheduler_half=_OracleHalf)
        assert row["identical"] == row["requests"] == 12 and row["settled"], (
            f"Serving 12 conversation turns through the tiny model with a CPU tier whose loads "
            f"partly fail ({label}), {name}(scheduler, plan) gave {row}; expected 12 of 12 "
            f"identical to contiguous generation and settled (every block back in its pool, "
            f"nothing in flight). {ADMIT_IDEA}")
    row = connector_demo.pair_row(model, connector_demo.PAIR_SCENARIOS[
        "lease shorter than the load"], admit=fn)
    assert row["identical"] == row["requests"] == 12 and row["settled"], (
        f"A prefill engine and a decode engine whose loads outlast the prefill engine's lease, "
        f"both admitting with {name}(scheduler, plan), gave {row}; expected 12 of 12 "
        f"identical and both pools empty at the end. {ADMIT_IDEA}")
    row = connector_demo.abandoned_prefill(model, admit=fn)
    assert row == {"requests": 6, "blocks_held": 0, "still_sending": 0, "released": 6}, (
        f"A prefill engine whose decode engine never reads its KV, admitting with "
        f"{name}(scheduler, plan), ended with {row}; expected every request finished and "
        f"every block freed once its lease ran out. {ADMIT_IDEA}")


@thorough
def check_admit_with_connector_thoroughly(fn: Callable) -> None:
    """Two runs that load while new requests come (blocks of 2, loads of 3 steps), then drawn
    runs (tight pools, budgets of 2 tokens and more, max_num_seqs of 1 and more, slow and
    failing loads, a connector that asks to be asked again), step by step against the oracle;
    then the fault cases through the tiny model."""
    for run in _LOADING_RUNS:
        expect_admission("admit_with_connector", fn, run | {"half": _OracleHalf},
                         admission_outcomes(**run, half=_OracleHalf))
    for_all(_runs(late=True, sources=("tier", "prefill engine")), lambda run: expect_admission(
        "admit_with_connector", fn, run | {"half": _OracleHalf},
        admission_outcomes(**run, half=_OracleHalf)), max_examples=200)
    _faults_survived(fn)

