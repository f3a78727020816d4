"""Visible checks for chapter 11, KV beyond one GPU: each TODO's readable cases. Expected values
come from the chapter's hidden module (``autograder.private``), where the thorough checks are.

The scheduler half's methods are given plain data (prompts, which of a prompt's blocks the CPU
tier holds, the chunks of a step) and observed in terms any correct connector reports alike:
blocks by their index in the prompt, never a key's hash. The admission is played through
whole runs of an engine that computes no model (each request's tokens are scripted), and
compared step by step with what the hidden model of the rules admits.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autograder.checks._contract import TUPLE_OF_INTS, Promise, expect_cases
from autograder.checks._helpers import describe_call, not_written
from autograder.private import private, visible
from course.experiments.disagg_sim import DryDecodeWorker
from course.experiments.tier_sim import DryRunWorker
from course.notebook import connector_demo
from course.v0.prefix_cache import prefix_keys
from course.v1.chunked_scheduler import Chunk, ChunkedRequest, Schedule
from course.v1.connector_engine import ConnectorScheduler, connector_round, connector_schedule_step
from course.v1.disaggregated import DecodeConnectorScheduler, HandoffRequest, KVHandoff
from course.v1.kv_connector import KVConnectorOutput
from course.v1.offload_tier import CPUTier
from course.v1.offloading_connector import OffloadingConnectorScheduler

MATCH_IDEA = ("The tier is asked about the blocks after the GPU's hit (from block "
              "num_computed_tokens // block_size) up to, not including, the block that holds the "
              "last token (block (num_tokens - 1) // block_size); tier.lookup counts those it "
              "holds from the first; each is block_size tokens, and the load is asynchronous "
              "when there is one.")
META_IDEA = ("build_connector_meta hands over every load decided since the last step "
             "(self.pending, then emptied, its keys kept in self.loading), and saves the full "
             "blocks each chunk completes, chunk.start // block_size to chunk.end // "
             "block_size, where tier.prepare_store(keys) finds room (None: that chunk saves "
             "nothing); each copy's GPU block is the request's table at the block's index.")
ADMIT_IDEA = ("Waiting requests are taken from the front: one whose load is in flight is "
              "skipped (it keeps its place), one whose load is done has its blocks cached and "
              "runs, a new one starts from its GPU hit, asks the connector what it can load, "
              "then gets room (for every token it knows when it waits for a load, else for the "
              "tokens it runs now) and the connector is told its blocks: with tokens to load "
              "it waits, else it runs. Once a new request finds no room, no new request is "
              "admitted that step; admission stops when the step preempted, the budget is spent "
              "or max_num_seqs run.")

SUBJECT = "OffloadingConnectorScheduler"  # the scheduler half's checks take the learner's class
SUBJECT_CHECKS = {"get_num_new_matched_tokens", "build_connector_meta"}

MATCHED = Promise("a tuple (int, bool)", lambda value: (
    TUPLE_OF_INTS(value) if not isinstance(value, tuple) or len(value) != 2
    else None if isinstance(value[1], bool) else f"its item 1 is a {type(value[1]).__name__}"))


def scheduler_half(subject: Any, name: str) -> type:
    """The learner's class, or the course's with the learner's method ``name``."""
    if isinstance(subject, type):
        return subject
    return type(SUBJECT, (OffloadingConnectorScheduler,), {name: subject})


def tier_holding(prompts: dict[int, list[int]], block_size: int, capacity: int,
                 held: list[tuple[int, int]], being_stored: list[tuple[int, int]] = ()
                 ) -> CPUTier:
    """An LRU tier of ``capacity`` blocks holding (prompt, block index) ``held``, stored in
    that order, and ``being_stored``, whose writes are not done."""
    tier = CPUTier(capacity)
    for blocks, done in ((held, True), (being_stored, False)):
        for prompt, index in blocks:
            key = prefix_keys(prompts[prompt], block_size)[index]
            tier.prepare_store([key])
            if done:
                tier.complete_store([key])
    return tier


def describe_raised(exc: BaseException) -> str:
    """An exception from a run, in a learner's words: its type, its value with a block's
    64-character key cut short, and the function of the course's it left (what noticed the
    books were wrong)."""
    value = str(exc)
    value = re.sub(r"[0-9a-f]{16,}", lambda m: f"the block key {m.group(0)[:8]}...", value)
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" in {frames[-1].name}" if frames else ""
    return f"{type(exc).__name__}: {value}{where}"


# --- get_num_new_matched_tokens ----------------------------------------------------------------


def matching(subject: Any) -> Callable:
    """The method as a function of plain data: a request of ``prompt`` (and ``output``, the
    tokens it generated before a preemption) with a GPU hit of ``num_computed_tokens``, a tier
    holding ``tier_holds`` (block indices of its tokens) and ``being_stored``."""

    def get_num_new_matched_tokens(prompt: list[int], num_computed_tokens: int,
                                   block_size: int, tier_holds: list[int],
                                   being_stored: list[int] = (), output: list[int] = ()) -> Any:
        tier = tier_holding({0: [*prompt, *output]}, block_size, 64,
                            [(0, i) for i in tier_holds], [(0, i) for i in being_stored])
        half = scheduler_half(subject, "get_num_new_matched_tokens")(tier, block_size)
        request = ChunkedRequest(0, list(prompt), len(output) + 1, output=list(output),
                                 num_computed_tokens=num_computed_tokens)
        return half.get_num_new_matched_tokens(request, num_computed_tokens)

    return get_num_new_matched_tokens


def _match(prompt_len: int, hit: int, block_size: int, holds: list[int],
           being_stored: list[int] = (), generated: int = 0) -> dict:
    tokens = list(range(100, 100 + prompt_len + generated))
    return dict(prompt=tokens[:prompt_len], num_computed_tokens=hit, block_size=block_size,
                tier_holds=holds, being_stored=list(being_stored), output=tokens[prompt_len:])


@visible
def check_get_num_new_matched_tokens(subject: Any) -> None:
    """Blocks of 4: an 18-token prompt whose GPU hit is block 0 and whose blocks 1 to 3 the
    tier holds (12 tokens); blocks 1 and 3 held (4: a lookup stops at a miss); a 16-token
    prompt all of whose blocks are held (its last block holds its last token: 12); nothing
    held; a block still being written; a GPU hit that leaves nothing to load; a request back
    after a preemption with a 10-token prompt and 6 generated tokens, its blocks 0 to 3 held
    (12: the blocks run to its last token's, past the prompt's)."""
    cases = [_match(18, 4, 4, [1, 2, 3]), _match(18, 4, 4, [1, 3]),
             _match(16, 0, 4, [0, 1, 2, 3]), _match(18, 0, 4, []),
             _match(18, 4, 4, [1], [2]), _match(16, 12, 4, [0, 1, 2, 3]),
             _match(7, 0, 1, [0, 1, 2, 3, 4, 5, 6]), _match(10, 0, 4, [0, 1, 2, 3], [], 6)]
    expect_cases(matching(subject), cases, private("11").match_case, MATCH_IDEA,
                 rel_tol=0, promise=MATCHED)


# --- build_connector_meta ----------------------------------------------------------------------


def observe_metadata(metadata: Any, half: Any, keys: dict, tier: CPUTier) -> dict:
    """What any correct scheduler half shows after ``build_connector_meta``: loads and saves
    as (GPU block, CPU block, (prompt, block index)) per request, the loads it now has in
    flight, what is still pending, and which blocks the tier holds and is writing."""

    def copies(orders: dict) -> dict:
        return {r: [(c.gpu_block, c.cpu_block, keys.get(c.key)) for c in found]
                for r, found in sorted(orders.items())}

    return {"loads": copies(metadata.loads), "saves": copies(metadata.saves),
            "in_flight": {r: [keys.get(k) for k in found]
                          for r, found in sorted(half.loading.items())},
            "pending": sorted(half.pending),
            "tier": sorted(keys[k] for k in tier.ready),
            "tier_writing": sorted(keys[k] for k in set(tier.block_of) - tier.ready)}


def play_metadata(half_class: type, prompts: dict[int, list[int]], block_size: int,
                  capacity: int, held: list[tuple[int, int]], steps: list[tuple]):
    """Play ``steps`` on a scheduler half of ``half_class`` over a tier of ``capacity`` blocks
    holding ``held``: ("alloc", request, GPU hit, table, tokens to load) calls the given
    ``update_state_after_alloc``; ("step", [(request, start, tokens)], tables) calls
    ``build_connector_meta``; ("report", requests whose loads finished) tells it those loads
    are done and the last step's saves written. Yields ("call", what was done before, the
    call) before each ``build_connector_meta`` and ("seen", its observation) after it."""
    tier = tier_holding(prompts, block_size, capacity, held)
    half = half_class(tier, block_size)
    keys = {key: (p, i) for p, prompt in sorted(prompts.items())
            for i, key in enumerate(prefix_keys(prompt, block_size))}
    requests = {p: ChunkedRequest(p, list(prompt), 4) for p, prompt in prompts.items()}
    done, saved = [f"a tier of {capacity} blocks holding (request, block) {held}"], []
    for step in steps:
        if step[0] == "alloc":
            _, request, hit, table, count = step
            requests[request].num_computed_tokens = hit
            half.update_state_after_alloc(requests[request], table, count)
            done.append(f"update_state_after_alloc(request {request}, {table}, {count})")
        elif step[0] == "report":
            half.update_connector_output(KVConnectorOutput(finished_recving=set(step[1]),
                                                           worker_meta=saved))
            done.append(f"the loads of {sorted(step[1])} done, the saves written")
        else:
            _, chunks, tables = step
            schedule = Schedule([Chunk(requests[r], start, n) for r, start, n in chunks])
            call = describe_call(half.build_connector_meta, dict(chunks=chunks,
                                                                 block_ids=tables))
            yield "call", "After " + "; ".join(done) + ": ", call
            metadata = half.build_connector_meta(schedule, tables)
            saved = [c.key for found in metadata.saves.values() for c in found]
            yield "seen", observe_metadata(metadata, half, keys, tier)
            done.append(call)


METADATA_PARTS = (("loads", "the loads"), ("saves", "the saves"), ("in_flight", "self.loading"),
                  ("pending", "self.pending"), ("tier", "the tier's blocks"),
                  ("tier_writing", "the tier's blocks being written"))


def run_metadata(name: str, subject: Any, prompts: dict[int, list[int]], block_size: int,
                 capacity: int, held: list[tuple[int, int]], steps: list[tuple],
                 expected: list[dict]) -> None:
    """``play_metadata`` on the learner's class, each observation against ``expected``."""
    played = play_metadata(scheduler_half(subject, name), prompts, block_size, capacity, held,
                           steps)
    before, call, outcomes = "", "", iter(expected)
    while True:
        try:
            event = next(played)
        except StopIteration:
            return
        except NotImplementedError:
            raise AssertionError(not_written(name)) from None
        except Exception as exc:
            raise AssertionError(f"{before}{call} raised {type(exc).__name__}: {exc}. "
                                 f"{META_IDEA}") from None
        if event[0] == "call":
            _, before, call = event
            continue
        seen, want = event[1], next(outcomes)
        for part, words in METADATA_PARTS:
            if seen[part] != want[part]:
                raise AssertionError(
                    f"{before}{call}: {words} are {seen[part]}, expected {want[part]} (copies "
                    f"as (GPU block, CPU block, (request, block index))). {META_IDEA}")


PROMPTS = {0: list(range(14)), 1: [*range(8), 50, 51, 52, 53, 54], 2: list(range(60, 80))}
METADATA = (PROMPTS, 4, 6, [(0, 0), (0, 1)], [
    ("step", [(0, 0, 14)], {0: [7, 8, 9, 10]}),
    ("report", []),
    ("alloc", 1, 0, [11, 12, 13, 14], 8),
    ("step", [(0, 14, 1), (1, 8, 4)], {0: [7, 8, 9, 10], 1: [11, 12, 13, 14]}),
    ("step", [(2, 0, 20)], {0: [7, 8, 9, 10], 2: [1, 2, 3, 4, 5]}),
    ("report", [1]),
    ("step", [(2, 0, 20)], {0: [7, 8, 9, 10], 2: [1, 2, 3, 4, 5]}),
])


@visible
def check_build_connector_meta(subject: Any) -> None:
    """Blocks of 4, a tier of 6 holding request 0's blocks 0 and 1: request 0's 14-token
    prompt in one chunk (saves block 2 only); request 1's load of 2 blocks, handed over with
    a chunk that completes its block 2; request 2's 20 tokens while the load holds the tier
    (no room: nothing saved); then, the load done, again (room now)."""
    prompts, block_size, capacity, held, steps = METADATA
    expected = private("11").metadata_outcomes(prompts, block_size, capacity, held, steps)
    run_metadata("build_connector_meta", subject, prompts, block_size, capacity, held, steps,
                 expected)


# --- admit_with_connector ----------------------------------------------------------------------


def asking_again(half: type, late: dict[int, int]) -> type:
    """The scheduler half ``half``, answering ``(None, False)``, "ask me again later", to the
    first ``late[request]`` questions about each request in ``late``; the requests it so
    answered since the run last read them are in ``asked_later``."""

    class AskAgain(half):
        def get_num_new_matched_tokens(self, request: ChunkedRequest,
                                       num_computed_tokens: int) -> tuple[int | None, bool]:
            left = vars(self).setdefault("late", dict(late))
            if left.get(request.id, 0) > 0:
                left[request.id] -= 1
                vars(self).setdefault("asked_later", set()).add(request.id)
                return None, False
            return super().get_num_new_matched_tokens(request, num_computed_tokens)

    return AskAgain


class RecordingWorker(DryRunWorker):
    """The model-free worker, keeping each step's metadata."""

    def bind_connector_metadata(self, metadata: Any) -> None:
        super().bind_connector_metadata(metadata)
        self.last = metadata


ADMISSION_PARTS = ("chunks", "preempted", "running", "waiting", "loading", "received",
                   "free_blocks", "num_computed_tokens")


def observe_step(scheduler: ConnectorScheduler, plan: Schedule) -> dict:
    """What any correct admission shows after a step: the chunks (request, first token,
    tokens), the requests preempted, running and waiting (in order), those loading and those
    whose load is done but not yet admitted, the free GPU blocks, and each waiting request's
    num_computed_tokens (a loading one's hits and loaded tokens, less what failed; 0 for any
    other)."""
    return {"chunks": [(c.request.id, c.start, c.num_tokens) for c in plan.chunks],
            "preempted": list(plan.preempted),
            "running": [r.id for r in scheduler.running],
            "waiting": [r.id for r in scheduler.waiting],
            "loading": sorted(scheduler.loading),
            "received": sorted(scheduler.received),
            "free_blocks": scheduler.kv_cache.num_free(),
            "num_computed_tokens": {r.id: r.num_computed_tokens for r in scheduler.waiting}}


class RoundFailed(Exception):
    """The connector's part of a step raised ``exc``: at ``step``, after an admission that
    left ``observed`` (``observe_step``, before the connector's round)."""

    def __init__(self, exc: Exception, step: int, observed: dict) -> None:
        super().__init__(exc)
        self.exc, self.step, self.observed = exc, step, observed


def run_engine(admit: Callable, num_blocks: int, block_size: int, budget: int,
               max_num_seqs: int, cpu_blocks: int, load_steps: int,
               requests: list[tuple[int, list[int], int, int]], failing: list = (),
               late: dict[int, int] | None = None, half: type = OffloadingConnectorScheduler,
               source: str = "tier", max_steps: int = 400) -> list[dict]:
    """Serve ``requests`` ((id, prompt, output tokens, arrival step)) through the connector
    engine's step with ``admit`` and no model (each step's observation, ``observe_step``),
    the KV found elsewhere in one of two places (``source``):

    * ``"tier"``: a CPU tier of ``cpu_blocks`` behind a scheduler half of class ``half``,
      loads of (request, block index) ``failing`` failing; each observation has the step's
      metadata as ``observe_metadata`` shows it;
    * ``"prefill engine"``: every request handed over by a prefill engine (chapter 11's
      decode connector: all but its prompt's last token to load), the prefill engine having
      let go of the requests ``failing`` (their loads fail).

    The connector answers "ask again later" as ``late`` says; each observation names the
    requests it so answered that step (``asked_later``, not compared: it tells a hint which
    rule a difference breaks)."""
    keys = {}  # the blocks of every request's tokens, its scripted outputs after its prompt
    for request, prompt, output_len, _ in sorted(requests):
        tokens = [*prompt, *(7 + i for i in range(output_len))]
        for index, key in enumerate(prefix_keys(tokens, block_size)):
            keys.setdefault(key, (request, index))
    if source == "tier":
        prompts = {r[0]: r[1] for r in requests}
        failing_keys = {prefix_keys(prompts[r], block_size)[i] for r, i in failing}
        tier = CPUTier(cpu_blocks)
        connector = (asking_again(half, late) if late else half)(tier, block_size)
        worker = RecordingWorker(cpu_blocks, 1, load_steps, failing_keys)
    else:
        handoff = KVHandoff()
        handoff.released = set(failing)
        connector = (asking_again(DecodeConnectorScheduler, late) if late else
                     DecodeConnectorScheduler)(block_size)
        worker = DryDecodeWorker(handoff, load_steps, block_bytes=1)
    scheduler = ConnectorScheduler(num_blocks, block_size, budget, connector, max_num_seqs)
    pending = sorted(requests, key=lambda r: (r[3], r[0]))
    seen = []
    for step in range(max_steps):
        if not pending and not scheduler.busy():
            return seen
        while pending and pending[0][3] <= step:
            request, prompt, output_len, arrival = pending.pop(0)
            scheduler.add(HandoffRequest(request, list(prompt), output_len, arrival,
                                         kv_transfer_params=None if source == "tier" else {
                                             "remote_request_id": request,
                                             "remote_block_ids": list(range(len(prompt))),
                                             "num_prompt_tokens": len(prompt)}))
        plan = scheduler.step(lambda s: connector_schedule_step(s, admit=admit))
        try:
            connector_round(scheduler, worker, plan, lambda: None)
        except NotImplementedError:
            raise
        except Exception as exc:  # what the admission scheduled, for the hint
            raise RoundFailed(exc, step, observe_step(scheduler, plan)) from exc
        for chunk in plan.chunks:
            if chunk.end == chunk.request.num_tokens:  # a scripted token, as a model's
                chunk.request.emit(7 + len(chunk.request.output))
        for request in [r for r in scheduler.running if r.done]:
            scheduler.finish(request)
        observed = observe_step(scheduler, plan)
        observed["asked_later"] = sorted(vars(connector).pop("asked_later", ())) if late else []
        if source == "tier":
            observed["metadata"] = observe_metadata(worker.last, connector, keys, tier)
        seen.append(observed)
    raise RuntimeError(f"the run did not finish in {max_steps} steps")


def describe_run(scenario: dict) -> str:
    """A run's set-up in words."""
    handed = scenario.get("source", "tier") != "tier"
    place = "every request's KV handed over by a prefill engine" if handed else \
        f"a CPU tier of {scenario['cpu_blocks']} blocks"
    text = (f"{scenario['num_blocks']} GPU blocks of {scenario['block_size']}, budget "
            f"{scenario['budget']}, max_num_seqs {scenario['max_num_seqs']}, {place}, loads "
            f"of {scenario['load_steps']} step(s), requests (id, prompt length, output tokens, "
            f"arrival) {[(r[0], len(r[1]), r[2], r[3]) for r in scenario['requests']]}")
    if scenario.get("failing") and handed:
        text += f", the loads of requests {scenario['failing']} failing"
    elif scenario.get("failing"):
        text += f", loads of (request, block) {scenario['failing']} failing"
    if scenario.get("late"):
        text += f", the connector answering None first for (request, times) {scenario['late']}"
    return text


def expect_admission(name: str, admit: Callable, scenario: dict, expected: list[dict]) -> None:
    """``admit`` through ``scenario`` (``run_engine``'s arguments), step by step against
    ``expected``: the first step that differs is named with what came before it."""
    # the call joined from single words: a catalogue takes two words and a space for prose
    call, setup = name + "(" + ", ".join(("scheduler", "plan")) + ")", describe_run(scenario)

    def differs(step: int, part: str, mine: dict) -> AssertionError:
        want = expected[step]
        before = f" (the step before: {_without_metadata(expected[step - 1])})" if step else ""
        earlier = expected[step - 1] if step else None
        return AssertionError(
            f"With {setup}, at step {step} after {call}: {part} is {mine[part]}, "
            f"expected {want[part]} (chunks as (request, first token, tokens)){before}."
            f" {_admission_hint(earlier, mine, want, scenario)}{ADMIT_IDEA}")

    try:
        seen = run_engine(admit, **scenario)
    except NotImplementedError:
        raise AssertionError(not_written(name)) from None
    except Exception as exc:
        if isinstance(exc, RoundFailed):  # the chunks scheduled, if wrong, say more
            if exc.step < len(expected) and \
                    exc.observed["chunks"] != expected[exc.step]["chunks"]:
                raise differs(exc.step, "chunks", exc.observed) from None
            exc = exc.exc
        raise AssertionError(f"{call} raised {type(exc).__name__}: {exc} (in a run of {setup})."
                             f" {_raised_hint(exc)}{ADMIT_IDEA}") from None
    for step, (mine, want) in enumerate(zip(seen, expected, strict=False)):
        for part in ADMISSION_PARTS:
            if mine[part] != want[part]:
                raise differs(step, part, mine)
    if len(seen) != len(expected):
        raise AssertionError(f"{call} served every request in {len(seen)} steps, expected "
                             f"{len(expected)} (in a run of {setup}). {ADMIT_IDEA}")


LOAD_DONE_RUNS = ("A request whose load is done runs, even once a new request found no room: "
                  "it holds its blocks already, and waiting behind a request that cannot fit "
                  "while holding them would never end. ")
LOAD_IN_FLIGHT = ("A request whose load is in flight is skipped until the load is reported "
                  "done: it keeps its place at the front of waiting, and its blocks, and the "
                  "requests behind it are still looked at. ")
LEAVES_BOTH = ("A request whose load is done leaves both scheduler.loading and "
               "scheduler.received when it runs. ")
LOADED_CACHED = ("A request whose load is done has its computed tokens cached "
                 "(kv.cache_blocks(request)) before it runs: its hits and loaded blocks become "
                 "the prefix cache's, as a computed chunk's do, and a new request behind it in "
                 "the same step hits them. ")
NO_NEW_AFTER_FULL = ("Once kv.allocate_slots finds no room for a new request (False), no new "
                     "request is admitted that step, even one that would fit; only requests "
                     "whose load is done still run. ")
LOADED_COMPUTED = ("The tokens loaded are computed: num_computed_tokens grows by the n "
                   "tokens the connector loads (hits + n), and the request's chunk starts "
                   "there. ")
SKIPPED_ORDER = ("The requests skipped keep their order at the front of waiting. ")
ADMIT_LIMITS = ("Admission stops when the step preempted, the budget (max_num_batched_tokens "
                "less what the running requests took) is spent, or max_num_seqs requests run. ")
ASKED_LATER = ("A new request the connector asks to be asked again later (None) is skipped "
               "with its num_computed_tokens back to 0: it holds no blocks, and it starts "
               "from its hit again when it is next looked at. ")
NO_ROOM_BACK_TO_0 = ("A new request kv.allocate_slots finds no room for (False) is skipped "
                     "with its num_computed_tokens back to 0: it holds no blocks, and it "
                     "starts from its hit again when it is next looked at. ")
ROOM_FOR_EVERY_TOKEN = ("A new request that waits for its load gets room for every token it "
                        "knows after its hit (kv.allocate_slots(request, num_tokens - hits)): "
                        "its loaded tokens arrive while it waits, and once they have, it runs "
                        "on the blocks it holds without asking for more. ")
ROOM_FOR_NUM_NEW = ("A new request that runs now gets room for the num_new tokens it runs "
                    "(min(num_tokens - num_computed_tokens, budget)), as chapter 9's step "
                    "gives: its later chunks ask for their own. ")
TOLD_AFTER_ROOM = ("The connector is told a new request's blocks "
                   "(connector.update_state_after_alloc(request, kv.block_table(id), n)) once "
                   "kv.allocate_slots has made room: its loads go into those blocks, and a "
                   "request refused room has none. ")
FROM_THE_HIT = ("A new request starts from its GPU hit: num_computed_tokens = "
                "kv.get_computed_tokens(request) before the connector is asked (past that hit) "
                "and before kv.allocate_slots, which reads it as the hit; the n loaded tokens "
                "are added once its room is made. ")


def _raised_hint(exc: Exception) -> str:
    """The rule a run that raised most likely missed, read from where it raised: the KV cache
    refusing a new request whose computed tokens are not its hit, the connector given no
    blocks (or a new request's table asked for before it has one), the run never finishing
    (a request whose load is done never ran), a request's bookkeeping missing (one still
    loading when it runs)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = frames[-1].name if frames else ""
    caller = Path(frames[-2].filename).parent.name if len(frames) > 1 else ""
    if isinstance(exc, ValueError) and where == "allocate_slots":
        return FROM_THE_HIT
    if where == "update_state_after_alloc" or (where == "block_table" and caller != "course"):
        return TOLD_AFTER_ROOM  # the connector told, or a new request's table read, too soon
    if isinstance(exc, IndexError) and where == "build_connector_meta":
        return ROOM_FOR_EVERY_TOKEN  # a request ran tokens it has no blocks for
    if isinstance(exc, RuntimeError) and where == "run_engine":
        return LOAD_DONE_RUNS
    if isinstance(exc, KeyError):
        return LEAVES_BOTH
    return ""


def _admission_hint(before: dict | None, mine: dict, want: dict, scenario: dict) -> str:
    """The rule the first step that differs breaks, read from what it did ('' where no one
    rule stands out)."""
    before = before or {"received": [], "loading": [], "running": []}
    received, loading = set(before["received"]), set(before["loading"])
    started = (set(mine["loading"]) - loading) | (set(mine["running"]) - set(before["running"])
                                                    - received)
    if sum(n for _, _, n in mine["chunks"]) > scenario["budget"] or \
            len(mine["running"]) > scenario["max_num_seqs"] or \
            (want["preempted"] and len(mine["chunks"]) > len(want["chunks"])) or \
            (len(want["running"]) >= scenario["max_num_seqs"] and
             started - set(want["loading"]) - set(want["running"])):
        return ADMIT_LIMITS
    if set(mine["running"]) & (set(want["loading"]) - set(want["received"])):
        return LOAD_IN_FLIGHT
    if (set(want["running"]) - set(mine["running"])) & received:
        return LOAD_DONE_RUNS
    if loading - received and set(want["running"]) - set(mine["running"]) - set(
            before["running"]):
        return LOAD_IN_FLIGHT  # it stopped at a request still loading
    if set(mine["loading"]) & set(mine["running"]):
        return LEAVES_BOTH
    starts = {request: start for request, start, _ in want["chunks"]}
    if any(request in starts and start < starts[request] and request in received
           for request, start, _ in mine["chunks"]):
        return LOADED_COMPUTED
    if sorted(mine["waiting"]) == sorted(want["waiting"]) and mine["waiting"] != want["waiting"]:
        return SKIPPED_ORDER
    if started - set(want["loading"]) - set(want["running"]):
        return NO_NEW_AFTER_FULL
    if set(want["loading"]) - set(mine["loading"]) - loading:
        return LOAD_IN_FLIGHT
    moved = any(request in starts and start != starts[request]
                for request, start, _ in mine["chunks"])
    if moved or mine["free_blocks"] != want["free_blocks"]:
        fewer = moved or mine["free_blocks"] < want["free_blocks"]
        new_loads = set(want["loading"]) - loading
        if fewer and received & set(want["running"]):
            return LOADED_CACHED  # a new request behind it missed its blocks
        if not fewer and new_loads:
            return ROOM_FOR_EVERY_TOKEN
        if fewer and not moved and not new_loads:
            return ROOM_FOR_NUM_NEW
        return FROM_THE_HIT
    wrong = {r for r, n in want["num_computed_tokens"].items()
             if mine["num_computed_tokens"].get(r) != n}
    if wrong & set(want["loading"]):
        return LOADED_COMPUTED
    if wrong & set(want.get("asked_later", ())):
        return ASKED_LATER
    if wrong:
        return NO_ROOM_BACK_TO_0
    return ""


def _without_metadata(observed: dict) -> dict:
    return {k: v for k, v in observed.items() if k not in ("metadata", "asked_later")}


def turns(count: int, seed: int, conversations: int) -> list[tuple]:
    """``count`` turns of ``conversations`` conversations (``course.notebook.connector_demo``), each
    as (id, prompt, output tokens, arrival step)."""
    return [(r.id, r.prompt, r.output_len, r.arrival)
            for r in connector_demo.conversations(count, seed, conversations)]


ADMISSION = [
    # two requests handed over by a prefill engine whose prompts share 8 tokens, the second
    # arriving while the first decodes: it hits the first one's blocks and loads the rest
    dict(num_blocks=16, block_size=2, budget=8, max_num_seqs=2, cpu_blocks=0, load_steps=2,
         requests=[(0, list(range(20, 29)), 6, 0), (1, [*range(20, 28), *range(40, 47)], 2, 4)],
         source="prefill engine"),
    # six turns of one conversation, each handed over by a prefill engine: loads of two
    # steps, the prefill engine letting go of request 1 before it is read, the connector
    # asking once to be asked again about request 3
    dict(num_blocks=17, block_size=2, budget=8, max_num_seqs=2, cpu_blocks=0, load_steps=2,
         requests=turns(6, 6364, 1), source="prefill engine", failing=[1], late={3: 1}),
    # six turns of three conversations in a pool of 12 blocks: loads of three steps, requests
    # that do not fit
    dict(num_blocks=12, block_size=2, budget=12, max_num_seqs=3, cpu_blocks=0, load_steps=3,
         requests=turns(6, 5112, 3), source="prefill engine", failing=[3],
         late={2: 1, 4: 1}),
]


@visible
def check_admit_with_connector(fn: Callable) -> None:
    """A decode engine admitting requests a prefill engine hands over (chapter 11's decode
    connector: all but the prompt's last token loaded): two prompts sharing 8 tokens, the
    second hitting the first's blocks on the GPU and loading the rest; six turns of one
    conversation, loads of two steps, one load failing, the connector asking once to be
    asked again; six turns of three conversations in a pool of 12 blocks, loads of three
    steps, requests that do not fit."""
    for scenario in ADMISSION:
        expected = private("11").admission_outcomes(**scenario)
        expect_admission("admit_with_connector", fn, scenario, expected)
