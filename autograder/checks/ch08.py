"""Visible checks for chapter 8, the capstone: each TODO's readable case, every TODO checked on
its own. The decode batch is checked against a block manager's state (before and after
copy-on-write); the decode step on decode batches given to it, against the logits of plain
contiguous-cache generation; the engine loop by serving requests on an engine whose decode
step recomputes each request's whole context (so whatever TODOs 1 and 2 do, ``serve`` is
checked alone), comparing every token and every step's logits with each request's own
contiguous run, checking before each decode that the pool holds the request's own K/V (what
the step's block copies must have put there), noting when each request joined, then
requiring every block back in the pool. ``abort`` is checked on engines whose state a short
script of scheduler steps builds (no model runs: only the blocks matter), and
``decode_surviving_faults`` on a recomputing engine whose decode raises when a poisoned
request is in the batch.

What the expected values are (the batch a manager's state calls for, the batches and logits
of a decode run, each request's contiguous run) comes from the chapter's hidden module
(``autograder.private``), where the thorough checks are too.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import torch

from autograder.checks._helpers import learner_call
from autograder.private import private, visible
from autograder.seal import opened
from course.tiny_model import TinyModel
from course.v0.block_manager import BlockManager
from course.v0.paged_engine import (
    GenRequest,
    KVPool,
    PagedEngine,
    make_request,
    paged_prefill,
    prefill_slots,
)
from kernels.paged_attention_ref import paged_decode_attention

SEED = 2029
LOGITS_TOLERANCE = 1e-4  # float32 paged vs contiguous: different summation orders only


# --- build_decode_batch ----------------------------------------------------------------------

BATCH_IDEA = ("Sequence s decodes the token at position seq_len - 1 (its slot is already "
              "reserved, so seq_len counts it); its slot is where that position lives in its "
              "block table. Read tables and lengths from the manager every step.")
ONE_TOO_LARGE = "Each is one too large: seq_len already counts the token being decoded. "
ONE_TOO_SMALL = ("Each is one too small: the token being decoded attends to itself, and seq_len "
                 "already counts it. ")
ROW_ORDER = "Row i is sequence seq_ids[i]: the rows follow the order of seq_ids. "
STALE_TABLE = ("After copy-on-write a sequence's last block is a new one: a table remembered "
               "from an earlier step is stale. ")
DTYPES = {"positions": torch.int64, "slot_mapping": torch.int64, "block_tables": torch.int32,
          "seq_lens": torch.int32}


def build_manager(num_blocks: int, block_size: int, operations: list[tuple]) -> BlockManager:
    """A BlockManager after ``operations``: ("allocate", seq, tokens), ("append_slot", seq),
    ("fork", parent, child)."""
    manager = BlockManager(num_blocks, block_size)
    for name, *args in operations:
        getattr(manager, name)(*args)
    return manager


def expect_batch(fn: Callable, manager: BlockManager, seq_ids: list[int], story: str,
                want: dict) -> None:
    """``fn(manager, seq_ids)`` against ``want``: positions, slot_mapping, the tables and
    seq_lens the manager's state calls for, and (``known``) what known mistakes give."""
    batch = learner_call("build_decode_batch", fn, manager, seq_ids)
    where = f"build_decode_batch(manager, {seq_ids}) {story}"
    for name, dtype in DTYPES.items():
        got = getattr(batch, name, None)
        if isinstance(got, torch.Tensor) and got.dtype != dtype:
            raise AssertionError(f"{where}: {name} is a {str(got.dtype).split('.')[-1]} tensor, "
                                 f"expected {str(dtype).split('.')[-1]}: a DecodeBatch holds "
                                 "positions and slot_mapping as int64, block_tables and "
                                 "seq_lens as int32.")
    for name in ("positions", "slot_mapping", "seq_lens"):
        got = getattr(batch, name, None)
        if not isinstance(got, torch.Tensor) or got.tolist() != want[name]:
            got_text = got.tolist() if isinstance(got, torch.Tensor) else got
            hint = next((text for value, text in want["known"].get(name, [])
                         if value == got_text), "")
            if name == "slot_mapping" and story.endswith("copy-on-write"):
                hint = STALE_TABLE
            raise AssertionError(f"{where}: {name} is {got_text}, expected {want[name]}. "
                                 f"{hint}{BATCH_IDEA}")
    tables = getattr(batch, "block_tables", None)
    if not isinstance(tables, torch.Tensor) or tables.dim() != 2 or \
            tables.shape[0] != len(seq_ids) or tables.is_floating_point():
        raise AssertionError(f"{where}: block_tables must be an integer tensor [num_seqs, "
                             f"max_blocks], got {getattr(tables, 'shape', tables)}. "
                             + BATCH_IDEA)
    width = max(len(table) for table in want["tables"])
    if tables.shape[1] != width:
        raise AssertionError(f"{where}: block_tables has {tables.shape[1]} columns, expected "
                             f"{width}: each table is padded past its own blocks to the longest "
                             "table's length.")
    for row, table in zip(tables.tolist(), want["tables"], strict=True):
        if row[:len(table)] != table:
            raise AssertionError(f"{where}: a block_tables row starts {row[:len(table)]}, "
                                 f"expected the sequence's table {table}. {BATCH_IDEA}")


def fork_story(block_size: int) -> tuple[int, list[tuple], list[tuple]]:
    """A sequence decodes a step, is forked mid-block, and both decode: the pool's size, the
    operations before the first batch, and those between the two batches."""
    before = [("allocate", 7, block_size + 1), ("append_slot", 7)]
    # copy-on-write: sequence 7 moves to a fresh last block; 8 owns the shared one alone
    between = [("fork", 7, 8), ("append_slot", 7), ("append_slot", 8)]
    return 12, before, between


def forked_after_partial_block(fn: Callable, block_size: int, wants: tuple[dict, dict]
                               ) -> None:
    """The parent's write must go to its copy, the child's to the shared block it now owns
    alone. ``wants``: the expected batch of [7] after one decode step, then of [7, 8]."""
    num_blocks, before, between = fork_story(block_size)
    manager = build_manager(num_blocks, block_size, before)
    expect_batch(fn, manager, [7], "after one decode step", wants[0])
    for name, *args in between:
        getattr(manager, name)(*args)
    expect_batch(fn, manager, [7, 8], "after a fork and copy-on-write", wants[1])


def fork_cases(block_size: int) -> tuple[dict, dict]:
    """The expected batches of ``forked_after_partial_block``, asked of the hidden module."""
    num_blocks, before, between = fork_story(block_size)
    ask = private("08").batch_case
    return (ask(num_blocks, block_size, before, [7]),
            ask(num_blocks, block_size, before + between, [7, 8]))


@visible
def check_build_decode_batch(fn: Callable) -> None:
    """Blocks of 4: sequences of 6 and 5 tokens (the second just took a new block), then a
    fork with copy-on-write."""
    operations = [("allocate", 0, 5), ("allocate", 1, 4), ("append_slot", 0),
                  ("append_slot", 1)]
    want = private("08").batch_case(8, 4, operations, [0, 1])
    forked = fork_cases(4)
    expect_batch(fn, build_manager(8, 4, operations), [0, 1], "(lengths 6 and 5, blocks of 4)",
                want)
    forked_after_partial_block(fn, 4, forked)


# --- paged_decode_step -----------------------------------------------------------------------

class CountedAttention:
    """The attention ``paged_decode_step`` is given, counting its calls."""

    def __init__(self, attention) -> None:
        self.attention, self.calls = attention, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.attention(*args, **kwargs)


def decode_run(fn: Callable, prompts: list[list[int]], case: dict,
               attention: Callable | None = None, label: str = "", device: str = "cpu"
               ) -> None:
    """Prefill each prompt into a NaN-filled pool at ``case["prefill_slots"]``, then run
    ``fn`` on each step's tokens and decode batch (``case["tokens"]``, ``case["batches"]``),
    with ``attention`` (chapter 6's by default) counted: every step's logits must equal
    ``case["logits"]``, contiguous generation's; ``case["shifted"]`` holds what RoPE one
    position too far gives (a known mistake)."""
    model = TinyModel(seed=SEED, device=device)
    block_size = case["block_size"]
    pool = KVPool.empty(model, case["num_blocks"], block_size)
    for prompt, slots in zip(prompts, case["prefill_slots"], strict=True):
        paged_prefill(model, prompt, slots, pool)
    counted = opened(CountedAttention(attention or paged_decode_attention))
    for step, (tokens, batch, wanted, shifted) in enumerate(zip(
            case["tokens"], case["batches"], case["logits"], case["shifted"], strict=True)):
        logits = learner_call("paged_decode_step", fn, model, tokens.to(device),
                              batch.to(device), pool, attention=counted)
        where = (f"paged_decode_step(...){label}, prompts of {[len(p) for p in prompts]} "
                 f"tokens, blocks of {block_size}, decode step {step + 1}")
        if counted.calls == 0:
            raise AssertionError(f"{where}: the attention it was given (its `attention` "
                                 "argument) was never called. The engine passes chapter 7's "
                                 "kernel there, and that is the one that must run.")
        if not isinstance(logits, torch.Tensor) or logits.shape != (len(prompts), 128):
            raise AssertionError(f"{where}: returned {getattr(logits, 'shape', logits)}, "
                                 f"expected logits of shape ({len(prompts)}, 128).")
        for seq_id, (want, off) in enumerate(zip(wanted, shifted, strict=True)):
            got, want, off = logits[seq_id], want.to(device), off.to(device)
            if not got.isnan().any() and torch.allclose(got, want, atol=LOGITS_TOLERANCE,
                                                        rtol=LOGITS_TOLERANCE):
                continue
            if got.isnan().any():
                hint = ("They are NaN: attention read a slot nothing had written, the new "
                        "token's own slot, at some layer: its K/V was not in the pool when "
                        "attention read it.")
            elif torch.allclose(got, off, atol=LOGITS_TOLERANCE, rtol=LOGITS_TOLERANCE):
                hint = ("They equal what RoPE at position seq_len gives: q and k were rotated "
                        "for the position after the token's own, batch.positions.")
            else:
                hint = ("The batches here are given, so the step itself differs: at some "
                        "layer its q, k, v, write, attention or finish_layer is not what a "
                        "contiguous run computes.")
            raise AssertionError(f"{where}: sequence {seq_id}'s logits differ from contiguous "
                                 f"generation's. {hint}")


@visible
def check_paged_decode_step(fn: Callable) -> None:
    """Prompts of 3 and 6 tokens in blocks of 4, four decode steps."""
    prompts = [[5, 17, 99], [1, 2, 3, 4, 5, 6]]
    decode_run(fn, prompts, private("08").decode_case(prompts, 4, 4))


# --- serve -----------------------------------------------------------------------------------


class Observing:
    """An engine mixin noting what ``serve`` did: when each request joined the waiting queue
    (``joined``: request id -> the number of steps planned before each ``scheduler.add``),
    and, per ``scheduler.step()`` (``steps``), whether its plan holds block copies and the
    engine methods called until the next one."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.joined: dict[int, list[int]] = {}
        self.steps: list[dict] = []
        scheduler = self.scheduler
        plan_step, add = scheduler.step, scheduler.add

        def observed_add(request) -> None:
            self.joined.setdefault(request.id, []).append(len(self.steps))
            add(request)

        def observed_step():
            plan = plan_step()
            copies = bool(plan.swapped_out or plan.swapped_in or self.blocks.copies)
            self.steps.append({"copies": copies, "calls": []})
            return plan

        scheduler.add, scheduler.step = observed_add, observed_step

    def note(self, call: str) -> None:
        if self.steps:
            self.steps[-1]["calls"].append(call)

    def apply_copies(self, plan) -> None:
        self.note("copies")
        super().apply_copies(plan)

    def prefill(self, request, tokens):
        self.note("prefill")
        return super().prefill(request, tokens)

    def decode(self, requests):
        self.note("decode")
        return super().decode(requests)


class RecomputingEngine(Observing, PagedEngine):
    """A PagedEngine whose decode step recomputes each request's whole context (its prompt
    and every token it generated, the last one being the token decoded) without using the
    pool's K/V for its logits, so ``serve`` is checked on its own, whatever the decode batch
    and step do. Before each decode it compares what the pool holds at the request's
    positions with the K/V of its context (``mismatch``: the first difference), then writes
    the new token's K/V at its slot, as a decode step does."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.mismatch: str | None = None

    def decode(self, requests: list) -> torch.Tensor:
        self.note("decode")
        rows = []
        for request in requests:
            context = request.tokens
            scratch = KVPool.empty(self.model, 1, len(context))
            rows.append(paged_prefill(self.model, context, torch.arange(len(context)),
                                      scratch))
            slots = prefill_slots(self.blocks, request.id)
            # decoded a second time in one step: no slot is reserved for this token, so there
            # is nothing to compare or write (the check reports the extra token)
            if len(slots) < len(context):
                continue
            self._compare(request, scratch, slots, len(context) - 1)
            newest = int(slots[len(context) - 1])
            block, offset = divmod(newest, self.blocks.block_size)
            for layer in range(self.model.config.num_layers):
                self.gpu_pool.k[layer][block, offset] = scratch.k[layer][0, len(context) - 1]
                self.gpu_pool.v[layer][block, offset] = scratch.v[layer][0, len(context) - 1]
        return torch.stack(rows)

    def _compare(self, request, scratch: KVPool, slots: torch.Tensor, cached: int) -> None:
        if self.mismatch is not None or cached == 0:
            return
        size = self.blocks.block_size
        blocks, offsets = slots[:cached] // size, slots[:cached] % size
        for layer in range(self.model.config.num_layers):
            for pool, fresh in ((self.gpu_pool.k, scratch.k), (self.gpu_pool.v, scratch.v)):
                held = pool[layer][blocks, offsets]
                good = torch.isclose(held, fresh[layer][0, :cached], atol=LOGITS_TOLERANCE,
                                     rtol=LOGITS_TOLERANCE).flatten(1).all(dim=1)
                if not good.all():
                    position = int((~good).nonzero()[0])
                    garbage = bool(held[position].isnan().any())
                    self.mismatch = (
                        f"when request {request.id} decoded in step {len(self.steps) - 1}, the "
                        f"pool at its position {position} (block {int(blocks[position])}) held "
                        + ("NaN, a slot nothing had written" if garbage else
                           "K/V other than its own"))
                    return


def make_requests(count: int, seed: int, branches_every: int = 0, max_prompt: int = 20,
                  max_output: int = 24, spread: int = 10) -> list:
    rng = random.Random(seed)
    return [make_request(i, [rng.randrange(128) for _ in range(rng.randint(1, max_prompt))],
                         rng.randint(1, max_output), arrival=rng.randint(0, spread),
                         n=3 if branches_every and i % branches_every == 0 else 1)
            for i in range(count)]


def wanted_keys(requests: list) -> list[tuple]:
    """What serve must return, by key: each request (its id), and each branch k > 0 of a
    request with n > 1 ((prompt length, prompt, k)); with the request, or None for a branch."""
    wanted = [(r.id, r) for r in requests]
    for r in requests:
        wanted += [((r.prompt_len, tuple(r.prompt), k), None) for k in range(1, r.n)]
    return wanted


def copies_diagnosis(engine: Observing) -> str:
    """What ``engine``'s notes say about the steps that planned block copies (and about the
    records, which clear each step's copy-on-write orders)."""
    if len(engine.records) < len(engine.steps):
        return (f"engine.record(step, plan) ran in {len(engine.records)} of the "
                f"{len(engine.steps)} steps: it notes the step and clears its copy-on-write "
                "orders, which the next step would otherwise copy again. ")
    for number, step in enumerate(engine.steps):
        calls = step["calls"]
        if not step["copies"]:
            continue
        if "copies" not in calls:
            return (f"Step {number} planned block copies (copy-on-write or a swap), and "
                    "engine.apply_copies(plan) was not called in it. ")
        model = next((call for call in calls[:calls.index("copies")]
                      if call in ("prefill", "decode")), None)
        if model is not None:
            return (f"In step {number}, engine.apply_copies(plan) ran after the model had "
                    f"already used the pool ({model} came first). ")
    return ""


JOINED_LATE = ("late: step s is the s-th call of engine.scheduler.step() (from 0, idle steps "
               "included), and a request joins before the step its arrival comes, not after.")
JOINED_EARLY = ("early: step s is the s-th call of engine.scheduler.step() (from 0, idle steps "
                "included), and a request joins before the step its arrival comes, not before.")


def join_diagnosis(engine: Observing, requests: list) -> str:
    """'' when every request joined the waiting queue once, at the step its arrival came."""
    for request in sorted(requests, key=lambda r: (r.arrival, r.id)):
        joined = engine.joined.get(request.id, [])
        if len(joined) > 1:
            return (f"request {request.id} was added to the waiting queue {len(joined)} times "
                    f"(before steps {joined}); a request joins once.")
        if joined and joined[0] != request.arrival:
            timing = JOINED_LATE if joined[0] > request.arrival else JOINED_EARLY
            return (f"request {request.id} (arrival {request.arrival}) joined the waiting "
                    f"queue before step {joined[0]}, {timing}")
    return ""


def leak_diagnosis(engine: PagedEngine) -> str:
    """'' unless the GPU pool holds blocks for sequences no longer running."""
    running = {r.id for r in engine.scheduler.running}
    held = sorted(set(engine.blocks.tables) - running)
    if not held:
        return ""
    return (f"Sequences {held[:8]} still hold GPU blocks, yet are no longer running: the "
            "blocks of finished requests never went back to the pool, and the requests still "
            "waiting found none.")


def describe_setting(count: int, block_size: int, num_blocks: int, preemption: str,
                     branches_every: int, spread: int) -> str:
    arriving = ("all arriving at step 0" if spread == 0 else
                f"arriving over steps 0 to {spread}")
    return (f"serve(...) with {count} requests {arriving}, blocks of {block_size}, a pool of "
            f"{num_blocks} blocks, preemption by {preemption}"
            + (f", 3 parallel-sampling branches for every request whose id is a multiple of "
               f"{branches_every}" if branches_every else ""))


def serve_run(fn: Callable, engine_class: type, expected: dict, count: int, block_size: int,
              num_blocks: int, preemption: str, seed: int, branches_every: int = 0,
              spread: int = 10, max_prompt: int = 20, max_output: int = 24) -> None:
    """Serve ``make_requests(count, seed, branches_every, spread=spread)`` with ``fn`` on an
    ``engine_class`` (an ``Observing`` engine); every request must join at its arrival, every
    request and branch must equal ``expected[key]`` (tokens and logits of its own contiguous
    run), the pool must have held each request's K/V when it decoded (where the engine
    compares), and every block must be back in the pool."""
    model = TinyModel(seed=SEED)
    requests = make_requests(count, seed, branches_every, max_prompt, max_output, spread)
    cpu_blocks = 4 * num_blocks if preemption == "swap" else 0
    engine = engine_class(model, num_blocks, block_size, preemption, cpu_blocks)
    setting = describe_setting(count, block_size, num_blocks, preemption, branches_every,
                               spread)
    try:
        finished = learner_call("serve", fn, engine, requests, 2_000)
    except AssertionError as failure:
        leak = leak_diagnosis(engine)
        if leak:
            raise AssertionError(f"{setting}: {failure} {leak}") from None
        raise
    joined = join_diagnosis(engine, requests)
    if joined:
        raise AssertionError(f"{setting}: {joined}")
    forks = Counter(r.parent for r in finished or [] if r.branch)
    for request in requests:
        if forks[request.id] > request.n - 1:
            raise AssertionError(
                f"{setting}: request {request.id} asked for {request.n} branches and has "
                f"{forks[request.id] + 1}: a request forks once, right after its first prefill "
                "(generated == 1), not again when a preemption by recompute prefills it anew.")
    preempted = {int(part.split()[-1]) for r in engine.records
                 for part in r.event.split(", ") if part.startswith("preempted")}
    by_key = {(r.id if r.branch == 0 else (r.prompt_len, tuple(r.prompt), r.branch)): r
              for r in finished or []}
    for key, request in wanted_keys(requests):
        got = by_key.get(key)
        if got is None:
            what = (f"request {key}" if request is not None
                    else f"branch {key[2]} of a request with a {key[0]}-token prompt")
            hint = ("A request with n > 1 forks its branches once, right after its first "
                    "prefill: engine.start_branches(request, logits). " if request is None
                    else "Every request must finish and be returned. ")
            raise AssertionError(f"{setting}: {what} is missing from what serve returned. "
                                 f"{hint}")
        tokens, logits = expected[key]
        if got.output != tokens or len(got.logits) != len(logits) or not all(
                torch.allclose(a, b, atol=LOGITS_TOLERANCE, rtol=LOGITS_TOLERANCE)
                for a, b in zip(got.logits, logits, strict=False)):
            index = next((i for i, (a, b) in enumerate(zip(got.output, tokens, strict=False))
                          if a != b), min(len(got.output), len(tokens)))
            hint = copies_diagnosis(engine)
            if not hint and got.id in preempted and preemption == "recompute":
                hint = ("It was preempted by recompute: when re-admitted, its prefill must "
                        "cover its whole context, prompt and every token it generated, so the "
                        "next token is computed at position context_len. ")
            raise AssertionError(
                f"{setting}: request {got.id}" + (f" (branch {got.branch})" if got.branch
                                                   else "")
                + f" generated {got.output[:index + 1]}..., its contiguous run "
                f"{tokens[:index + 1]}... (first difference at output token {index}). {hint}")
    mismatch = getattr(engine, "mismatch", None)
    if mismatch:
        raise AssertionError(f"{setting}: {mismatch}. "
                             + (copies_diagnosis(engine) or "The pool must hold a request's "
                                "K/V at every position it has before it decodes."))
    blocks = engine.blocks
    if blocks.num_free_blocks() != blocks.num_blocks or any(blocks.ref_counts):
        holders = sorted(blocks.tables)
        raise AssertionError(f"{setting}: after serving, {blocks.num_free_blocks()} of "
                             f"{blocks.num_blocks} blocks are free, still held by sequences "
                             f"{holders[:8]}: the blocks of finished requests never went back "
                             "to the pool.")


def step_limit(fn: Callable, engine: PagedEngine, requests: list, max_steps: int,
               needed: int) -> None:
    """``fn`` must raise RuntimeError serving ``requests`` (which need ``needed`` steps) in
    ``max_steps`` < ``needed`` steps."""
    try:
        fn(engine, requests, max_steps)
    except RuntimeError:
        return
    except NotImplementedError:
        raise AssertionError("serve is not written yet.") from None
    except Exception as exc:
        raise AssertionError(f"serve(..., max_steps={max_steps}) on requests that need "
                             f"{needed} steps raised {type(exc).__name__}: {exc}, expected "
                             "RuntimeError.") from None
    raise AssertionError(f"serve(..., max_steps={max_steps}) on requests that need {needed} "
                         "steps returned, with requests unfinished: running out of steps "
                         "raises RuntimeError, so a caller cannot take a partial result for "
                         "a whole one.")


@visible
def check_serve(fn: Callable) -> None:
    """Eight requests arriving over steps 0 to 10, blocks of 4, a pool of 24 blocks
    (preemption by recompute happens); then a run with swaps and copy-on-write, each
    request's K/V in the pool checked before it decodes; then a step limit too small."""
    asked = private("08")
    expected, copied = asked.serve_case(8, 1), asked.serve_case(**COPY_CASE)
    serve_run(fn, RecomputingEngine, expected, 8, 4, 24, "recompute", seed=1)
    shape = {k: v for k, v in COPY_CASE.items() if k != "count"}
    serve_run(fn, RecomputingEngine, copied, COPY_CASE["count"], COPY_BLOCKS[0],
              COPY_BLOCKS[1], "swap", **shape)
    model = TinyModel(seed=SEED)
    step_limit(fn, RecomputingEngine(model, 8, 4), [make_request(0, [1, 2, 3], 8)], 3, 8)


# swaps and copy-on-write: the requests, and (block size, pool size)
COPY_CASE = {"count": 6, "seed": 17, "branches_every": 3, "spread": 2, "max_prompt": 8,
             "max_output": 10}
COPY_BLOCKS = (2, 12)


# --- abort -----------------------------------------------------------------------------------

_FAKE_LOGITS = torch.zeros(128)
_FAKE_LOGITS[:3] = torch.tensor([3.0, 2.0, 1.0])  # branches k = 1, 2 take tokens 1 and 2


def advance(engine: PagedEngine, steps: int) -> None:
    """Plan ``steps`` steps; every request planned emits token 0 (no model runs: only the
    blocks matter here), and a request with n > 1 forks its branches at its first token."""
    for _ in range(steps):
        plan = engine.scheduler.step()
        for request in plan.prefill + plan.decode:
            request.emit(0, _FAKE_LOGITS)
            if request.n > 1 and request.generated == 1:
                engine.start_branches(request, _FAKE_LOGITS)


def abort_story(preemption: str, steps: int) -> tuple[PagedEngine, dict[int, GenRequest]]:
    """Blocks of 2 in a pool of 10 (and 30 on the CPU to swap to): request 0 with 3 branches
    (ids -1 and -2 are its branches k = 1, 2), requests 1, 2 and 3, after ``steps`` steps;
    then request 4 joins the waiting queue. Every request the engine holds, by id."""
    engine = PagedEngine(TinyModel(seed=SEED), 10, 2, preemption,
                         cpu_blocks=30 if preemption == "swap" else 0)
    requests = [make_request(0, [1, 2, 3], 12, n=3), make_request(1, [4, 5, 6, 7], 12),
                make_request(2, [8, 9, 10], 12), make_request(3, [1] * 5, 12)]
    for request in requests:
        engine.scheduler.add(request)
    advance(engine, steps)
    engine.scheduler.add(make_request(4, [7] * 9, 8))
    s = engine.scheduler
    return engine, {r.id: r for r in [*s.waiting, *s.running, *s.swapped]}


def _where(engine: PagedEngine, request: GenRequest) -> str | None:
    s = engine.scheduler
    for name, queue in (("waiting", s.waiting), ("running", s.running),
                        ("swapped", s.swapped)):
        if any(r is request for r in queue):
            return name
    return None


def _held(engine: PagedEngine) -> list[GenRequest]:
    s = engine.scheduler
    return [*s.waiting, *s.running, *s.swapped]


def _who(request: GenRequest, victim: GenRequest) -> str:
    if request is victim:
        return f"request {request.id}"
    return f"request {request.id} (branch {request.branch} of request {victim.id})"


def assert_books_balance(engine: PagedEngine, where: str) -> None:
    """The GPU pool's books balance against the running requests' tables, the CPU pool's
    against the swapped ones'."""
    s = engine.scheduler
    for name, manager, queue in (("GPU", s.gpu, s.running), ("CPU", s.cpu, s.swapped)):
        holders = {r.id for r in queue}
        extra = sorted(set(manager.tables) - holders)
        if extra:
            raise AssertionError(f"{where}: the {name} BlockManager still holds the tables of "
                                 f"sequences {extra}, which are no longer "
                                 f"{'running' if name == 'GPU' else 'swapped out'}: their "
                                 "blocks never went back.")
        missing = sorted(holders - set(manager.tables))
        if missing:
            raise AssertionError(f"{where}: requests {missing} are "
                                 f"{'running' if name == 'GPU' else 'swapped out'} but hold "
                                 f"no {name} blocks.")
        counts = [0] * manager.num_blocks
        for table in manager.tables.values():
            for block in table:
                counts[block] += 1
        wrong = [b for b in range(manager.num_blocks) if counts[b] != manager.ref_counts[b]]
        if wrong:
            b = wrong[0]
            raise AssertionError(f"{where}: {name} block {b} is held by {counts[b]} tables but "
                                 f"its reference count is {manager.ref_counts[b]}: a shared "
                                 "block loses one reference per sequence that lets it go.")
        free = set(manager.free_blocks)
        used = {b for b in range(manager.num_blocks) if counts[b]}
        if free & used or len(free) + len(used) != manager.num_blocks:
            raise AssertionError(f"{where}: the {name} pool's free blocks "
                                 f"{sorted(free)[:10]} and the blocks tables hold "
                                 f"{sorted(used)[:10]} do not add up to its "
                                 f"{manager.num_blocks} blocks.")


def books_after_faults(engine: PagedEngine, where: str) -> None:
    """``assert_books_balance`` after a step with faults, which changes the books only through
    ``abort``: a failure adds that abort, where it fails its own test, comes first."""
    try:
        assert_books_balance(engine, where)
    except AssertionError as unbalanced:
        raise AssertionError(f"{unbalanced} If abort fails its own test, fix that first."
                             ) from None


def expect_abort(fn: Callable, engine: PagedEngine, requests: dict[int, GenRequest],
                 victim: GenRequest, story: str) -> None:
    """``fn(engine, victim)`` takes out exactly the victim and its branches still held, and
    returns them; nothing else changes; both pools' books balance."""
    before = {id(r): (_where(engine, r), engine.blocks.tables.get(r.id),
                      engine.scheduler.cpu.tables.get(r.id)) for r in _held(engine)}
    order = {name: [r.id for r in queue] for name, queue in (
        ("waiting", engine.scheduler.waiting), ("running", engine.scheduler.running),
        ("swapped", engine.scheduler.swapped))}
    kinds = {name: type(getattr(engine.scheduler, name)) for name in order}
    targets = [r for r in _held(engine) if r is victim or r.parent == victim.id]
    where = (f"abort(engine, request {victim.id}) {story} "
             f"(held: {', '.join(f'{r.id} {before[id(r)][0]}' for r in targets) or 'none'})")
    taken = learner_call("abort", fn, engine, victim)
    for request in targets:
        now = _where(engine, request)
        if now is not None:
            kind = (" A cancel ends the whole request, its branches too." if request is not
                    victim and _where(engine, victim) is None else "")
            raise AssertionError(f"{where}: {_who(request, victim)}, "
                                 f"{before[id(request)][0]} before, is still in "
                                 f"scheduler.{now}.{kind}")
    for name, ids in order.items():
        kept = [i for i in ids if i not in {r.id for r in targets}]
        queue = getattr(engine.scheduler, name)
        if type(queue) is not kinds[name]:
            raise AssertionError(f"{where}: scheduler.{name} is now a {type(queue).__name__}, "
                                 f"was a {kinds[name].__name__}: abort takes the cancelled "
                                 "requests out of it and leaves it what it was (the scheduler "
                                 "goes on using it as such).")
        if [r.id for r in queue] != kept:
            raise AssertionError(f"{where}: scheduler.{name} is {[r.id for r in queue]}, "
                                 f"expected {kept}: the other requests stay where they were, "
                                 "in order.")
    for request in _held(engine):
        _, gpu, cpu = before[id(request)]
        if engine.blocks.tables.get(request.id) != gpu or \
                engine.scheduler.cpu.tables.get(request.id) != cpu:
            raise AssertionError(f"{where}: request {request.id}'s blocks changed; only the "
                                 "cancelled requests' blocks go back.")
    assert_books_balance(engine, where)
    if not isinstance(taken, list | tuple) or sorted(getattr(r, "id", r) for r in taken) != \
            sorted(r.id for r in targets):
        got = ([getattr(r, "id", r) for r in taken] if isinstance(taken, list | tuple)
               else taken)
        raise AssertionError(f"{where}: returned {got}, expected the requests taken out, "
                             f"{sorted(r.id for r in targets)} (as GenRequest objects).")


@visible
def check_abort(fn: Callable) -> None:
    """Blocks of 2, a pool of 10: request 0 forked into branches -1 and -2 sharing its blocks,
    requests 1 to 4. Preemption by swap: cancel request 3 (swapped out), request 4
    (waiting), request 0 (running, its branches swapped out), branch -1 alone (sharing its
    blocks with 0 and -2), and a request the engine does not hold."""
    engine, requests = abort_story("swap", 4)
    expect_abort(fn, engine, requests, requests[3], "(swap, after 4 steps)")
    expect_abort(fn, engine, requests, requests[4], "(then)")
    engine, requests = abort_story("swap", 4)
    expect_abort(fn, engine, requests, requests[0], "(swap, after 4 steps)")
    engine, requests = abort_story("swap", 1)
    expect_abort(fn, engine, requests, requests[-1], "(swap, after the first step)")
    expect_abort(fn, engine, requests, make_request(9, [1], 1), "(never added)")


# --- decode_surviving_faults -----------------------------------------------------------------


class FaultyEngine(RecomputingEngine):
    """A recomputing engine whose decode raises RuntimeError when a ``poisoned`` request is in
    the batch (a request whose data crashes the model step), and on its next ``glitches``
    calls whatever the batch (a transient fault)."""

    def __init__(self, *args, poisoned: tuple[int, ...] = (), glitches: int = 0,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.poisoned, self.glitches = set(poisoned), glitches

    def decode(self, requests: list) -> torch.Tensor:
        if self.glitches > 0:
            self.glitches -= 1
            raise RuntimeError("a transient fault in the model step")
        bad = [r.id for r in requests if r.id in self.poisoned]
        if bad:
            raise RuntimeError(f"the model step failed on request {bad[0]}")
        return super().decode(requests)


def fault_story(prompts: list[list[int]], poisoned: tuple[int, ...] = (), glitches: int = 0,
                n: int = 1, preemption: str = "recompute") -> tuple[FaultyEngine, list]:
    """Requests 0, 1, ... with ``prompts`` (request 0 asking for ``n`` branches), admitted
    and prefilled in a first step on a FaultyEngine (blocks of 4, a pool of 32)."""
    engine = FaultyEngine(TinyModel(seed=SEED), 32, 4, preemption,
                          cpu_blocks=64 if preemption == "swap" else 0, poisoned=poisoned,
                          glitches=glitches)
    requests = [make_request(i, p, 8, n=n if i == 0 else 1) for i, p in enumerate(prompts)]
    for request in requests:
        engine.scheduler.add(request)
    plan = engine.scheduler.step()
    for request in plan.prefill:
        logits = engine.prefill(request, request.tokens)
        request.emit(int(logits.argmax()), logits)
        if request.n > 1:
            engine.start_branches(request, logits)
    return engine, requests


def faulty_step(fn: Callable, engine: FaultyEngine, runs: dict, story: str) -> list:
    """Plan one step and run ``fn`` on its decodes. ``runs``: each request's (or branch's, by
    id) contiguous tokens and logits. Checks what was aborted (the requests whose own decode
    fails, with their branches), their errors, the books, and that every other request
    emitted its next token once. Returns the step's decoded requests."""
    plan = engine.scheduler.step()
    batch = list(plan.decode)
    counts = {id(r): len(r.output) for r in batch}
    bad = [r for r in batch if r.id in engine.poisoned]
    doomed = [r for r in _held(engine) if any(r is b or r.parent == b.id for b in bad)]
    where = (f"decode_surviving_faults(engine, requests {[r.id for r in batch]}) {story}"
             + (f", the model step failing whenever request {bad[0].id} is in the batch"
                if bad else "") + (", the model step failing once, whatever the batch"
                                   if engine.glitches else ""))
    try:
        aborted = learner_call("decode_surviving_faults", fn, engine, batch)
    except AssertionError as failure:
        text = str(failure).replace("decode_surviving_faults(...) ", "")
        if text.startswith("raised") and "model step" in text:
            raise AssertionError(f"{where}: {text}. The fault escaped: a fault in the model "
                                 "step must cost only the requests whose own decode fails."
                                 ) from None
        raise
    for request in batch:
        if any(request is d for d in doomed):
            continue
        if _where(engine, request) != "running":
            raise AssertionError(f"{where}: request {request.id} was aborted, though its own "
                                 "decode works: a fault costs only the requests whose own "
                                 "decode fails.")
        emitted = len(request.output) - counts[id(request)]
        if emitted != 1:
            raise AssertionError(f"{where}: request {request.id} emitted {emitted} tokens in "
                                 "this step, expected 1.")
        tokens, logits = runs[request.id]
        index = len(request.output) - 1
        if request.output[-1] != tokens[index] or not torch.allclose(
                request.logits[-1], logits[index], atol=LOGITS_TOLERANCE,
                rtol=LOGITS_TOLERANCE):
            raise AssertionError(f"{where}: request {request.id} emitted {request.output[-1]}, "
                                 f"its contiguous run {tokens[index]} (output token {index}): "
                                 "each request emits the argmax of its own logits row.")
    for request in doomed:
        if _where(engine, request) is not None:
            raise AssertionError(f"{where}: request {request.id}'s own decode raised, yet it "
                                 f"is still in scheduler.{_where(engine, request)}: left there, "
                                 "it holds its blocks, and the next step reserves another "
                                 "slot for a token it never emitted. If abort fails its own "
                                 "test, fix that first.")
    for request in bad:
        if not isinstance(request.error, Exception):
            raise AssertionError(f"{where}: request {request.id} was aborted, and its error "
                                 f"is {request.error!r}: the exception its decode raised "
                                 "goes in request.error, for whoever asked for it.")
    books_after_faults(engine, where)
    if not isinstance(aborted, list | tuple) or sorted(getattr(r, "id", r) for r in aborted) \
            != sorted(r.id for r in doomed):
        got = ([getattr(r, "id", r) for r in aborted] if isinstance(aborted, list | tuple)
               else aborted)
        raise AssertionError(f"{where}: returned {got}, expected the aborted requests, "
                             f"{sorted(r.id for r in doomed)}.")
    return batch


FAULT_PROMPTS = [[5, 17, 99], [1, 2, 3, 4, 5, 6], [7, 7]]


@visible
def check_decode_surviving_faults(fn: Callable) -> None:
    """Requests 0, 1 and 2 (prompts of 3, 6 and 2 tokens) decode while the model step fails
    whenever request 1 is in the batch, for two steps; then the model step fails once,
    whatever the batch."""
    runs = private("08").contiguous_runs(FAULT_PROMPTS, 4)
    engine, _ = fault_story(FAULT_PROMPTS, poisoned=(1,))
    faulty_step(fn, engine, runs, "(first decode step)")
    faulty_step(fn, engine, runs, "(the next step)")
    engine, _ = fault_story(FAULT_PROMPTS, glitches=1)
    faulty_step(fn, engine, runs, "(first decode step)")
