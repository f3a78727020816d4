"""Chapter 8's hidden checks, and what the visible checks ask of them: the decode batch a
block manager's state calls for (read token by token from the manager, and what known
mistakes give), the decode batches and contiguous logits of a decode run (and what RoPE one
position too far gives), and each request's (or branch's) own contiguous run. The thorough
checks: block sizes 1, 2 and 16 and random lengths for the batch; blocks of 1 and 16, ten
steps and chapter 7's Triton kernel for the decode step; sixteen requests with forced
preemption (recompute and swap), blocks of 1 and 2 and parallel sampling with copy-on-write
for the engine loop, which runs there on the course's own decode batch and step, then
workloads with idle gaps and same-step arrivals on an engine that runs no model, where
every join step and the step limit (a run that needs exactly ``max_steps`` returns, one
step fewer raises) are looked at; every request (branches included) cancelled in turn from
engines stopped at every step, by recompute and by swap, and a run cancelled mid-generation
and served on to the end; faults in the model step that hit a forked request, every
request, a one-request batch, and a step that wrote part of its K/V before failing, with the
survivors served to the end.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from autograder.checks._helpers import learner_call
from autograder.checks._lending import one_bug_one_todo_of_function
from autograder.checks.ch08 import (
    ONE_TOO_LARGE,
    ONE_TOO_SMALL,
    ROW_ORDER,
    SEED,
    Observing,
    _held,
    abort_story,
    books_after_faults,
    build_manager,
    decode_run,
    expect_abort,
    expect_batch,
    fault_story,
    faulty_step,
    fork_story,
    forked_after_partial_block,
    join_diagnosis,
    make_requests,
    serve_run,
    step_limit,
    wanted_keys,
)
from autograder.private import thorough
from course.tiny_model import TinyModel, generate_contiguous
from course.v0 import paged_engine
from course.v0.block_manager import BlockManager
from course.v0.paged_engine import (
    DecodeBatch,
    GenRequest,
    PagedEngine,
    build_decode_batch,
    make_request,
    paged_decode_step,
    prefill_slots,
    serve,
)

# --- build_decode_batch ----------------------------------------------------------------------


def _expected_batch(manager: BlockManager, seq_ids: list[int]) -> dict:
    rows = []
    for seq_id in seq_ids:
        table, length = manager.block_table(seq_id), manager.seq_len(seq_id)
        blocks = [table[t // manager.block_size] for t in range(length)]  # token by token
        rows.append((length - 1, blocks[-1] * manager.block_size
                     + (length - 1) % manager.block_size, table, length))
    positions, seq_lens = [r[0] for r in rows], [r[3] for r in rows]
    held = [seq_id for seq_id in manager.tables if seq_id in seq_ids]  # the manager's order
    return {"positions": positions, "slot_mapping": [r[1] for r in rows],
            "tables": [r[2] for r in rows], "seq_lens": seq_lens,
            "known": {"positions": [([p + 1 for p in positions], ONE_TOO_LARGE),
                                    ([manager.seq_len(s) - 1 for s in held], ROW_ORDER)],
                      "seq_lens": [([n - 1 for n in seq_lens], ONE_TOO_SMALL)]}}


def batch_case(num_blocks: int, block_size: int, operations: list[tuple],
               seq_ids: list[int]) -> dict:
    """The batch of ``seq_ids`` after ``operations`` on a fresh manager."""
    return _expected_batch(build_manager(num_blocks, block_size, operations), seq_ids)


def _fork_cases(block_size: int) -> tuple[dict, dict]:
    num_blocks, before, between = fork_story(block_size)
    return (batch_case(num_blocks, block_size, before, [7]),
            batch_case(num_blocks, block_size, before + between, [7, 8]))


@thorough
def check_build_decode_batch_thoroughly(fn: Callable) -> None:
    """Block sizes 1, 2 and 16; random lengths; one sequence; copy-on-write at every block
    size."""
    rng = random.Random(SEED)
    for block_size in (1, 2, 16):
        manager = BlockManager(400, block_size)
        ids = list(range(9))
        for seq_id in ids:
            manager.allocate(seq_id, rng.randint(1, 40))
            for _ in range(rng.randint(1, 5)):
                manager.append_slot(seq_id)
        rng.shuffle(ids)
        all_of_them, one = _expected_batch(manager, ids), _expected_batch(manager, ids[:1])
        expect_batch(fn, manager, ids, f"(9 sequences, blocks of {block_size})", all_of_them)
        expect_batch(fn, manager, ids[:1], f"(one sequence, blocks of {block_size})", one)
        if block_size > 1:
            forked_after_partial_block(fn, block_size, _fork_cases(block_size))


# --- paged_decode_step -----------------------------------------------------------------------


def _batch(manager: BlockManager, seq_ids: list[int]) -> DecodeBatch:
    want = _expected_batch(manager, seq_ids)
    width = max(len(table) for table in want["tables"])
    return DecodeBatch(torch.tensor(want["positions"], dtype=torch.int64),
                       torch.tensor(want["slot_mapping"], dtype=torch.int64),
                       torch.tensor([t + [0] * (width - len(t)) for t in want["tables"]],
                                    dtype=torch.int32),
                       torch.tensor(want["seq_lens"], dtype=torch.int32))


def decode_case(prompts: list[list[int]], steps: int, block_size: int, device: str = "cpu"
                ) -> dict:
    """Each prompt prefilled (``prefill_slots``, in a pool of ``num_blocks``), then ``steps``
    decode steps of all of them: each step's tokens, decode batch, and every sequence's
    logits in contiguous generation."""
    model = TinyModel(seed=SEED, device=device)
    baseline = [generate_contiguous(model, p, steps + 1) for p in prompts]
    manager = BlockManager(sum(len(p) + steps for p in prompts) + 8, block_size)
    slots = []
    for seq_id, prompt in enumerate(prompts):
        manager.allocate(seq_id, len(prompt))
        slots.append(prefill_slots(manager, seq_id))
    ids = list(range(len(prompts)))
    tokens, batches, logits = [], [], []
    for step in range(steps):
        for seq_id in ids:
            manager.append_slot(seq_id)
        batches.append(_batch(manager, ids))
        tokens.append(torch.tensor([baseline[s][0][step] for s in ids]))
        logits.append([baseline[s][1][step + 1] for s in ids])
    return {"num_blocks": manager.num_blocks, "block_size": block_size,
            "prefill_slots": slots, "tokens": tokens, "batches": batches, "logits": logits,
            "shifted": _shifted(model, prompts, slots, manager, tokens, batches)}


def _shifted(model: TinyModel, prompts, slots, manager, tokens, batches) -> list:
    """Each step's logits when every position given to RoPE is one too far (seq_len), in a
    pool of its own: what that mistake computes, step after step."""
    from course.v0.paged_engine import KVPool, paged_prefill

    pool = KVPool.empty(model, manager.num_blocks, manager.block_size)
    device = model.embedding.device
    for prompt, prompt_slots in zip(prompts, slots, strict=True):
        paged_prefill(model, prompt, prompt_slots, pool)
    out = []
    for step_tokens, batch in zip(tokens, batches, strict=True):
        moved = DecodeBatch(batch.positions + 1, batch.slot_mapping, batch.block_tables,
                            batch.seq_lens).to(device)
        out.append(list(paged_decode_step(model, step_tokens.to(device), moved, pool).cpu()))
    return out


@thorough
def check_paged_decode_step_thoroughly(fn: Callable) -> None:
    """Blocks of 1 and 16, five sequences, ten steps; and chapter 7's Triton kernel (on the
    interpreter without a GPU) as the attention."""
    rng = random.Random(SEED)
    prompts = [[rng.randrange(128) for _ in range(n)] for n in (1, 7, 16, 17, 30)]
    decode_run(fn, prompts, decode_case(prompts, 10, 1))
    decode_run(fn, prompts, decode_case(prompts, 10, 16))
    from course.runtime import detect
    from kernels.paged_attention import paged_attention

    gpu = detect().is_gpu  # compiled, the kernel needs CUDA tensors and blocks of at least 16
    device = "cuda" if gpu else "cpu"
    decode_run(fn, prompts[:2], decode_case(prompts[:2], 3, 16 if gpu else 4, device),
               paged_attention, " with the Triton kernel", device)


# --- serve -----------------------------------------------------------------------------------


def _contiguous_run(model: TinyModel, request: GenRequest, branch: int
                    ) -> tuple[list[int], list[torch.Tensor]]:
    first = None
    if branch:  # its own contiguous run: the same forced first token, then greedy
        first = int(generate_contiguous(model, request.prompt, 1)[1][0]
                    .topk(branch + 1).indices[-1])
    return generate_contiguous(model, request.prompt, request.output_len, first)


def serve_case(count: int, seed: int, branches_every: int = 0, spread: int = 10,
               max_prompt: int = 20, max_output: int = 24) -> dict:
    """The tokens and logits of every request's and branch's own contiguous run, by the key
    ``serve_run`` looks them up with."""
    model = TinyModel(seed=SEED)
    requests = make_requests(count, seed, branches_every, max_prompt, max_output, spread)
    parents = {(r.prompt_len, tuple(r.prompt)): r for r in requests}
    return {key: _contiguous_run(model, request or parents[key[:2]], 0 if request else key[2])
            for key, request in wanted_keys(requests)}


def contiguous_runs(prompts: list[list[int]], output_len: int, n: int = 1) -> dict:
    """Tokens and logits of each prompt's contiguous run (8 output tokens, as
    ``fault_story``'s requests), by request id; with ``n`` > 1, request 0's branches too
    (ids -1, -2, ... as the engine numbers them)."""
    model = TinyModel(seed=SEED)
    requests = [make_request(i, p, 8) for i, p in enumerate(prompts)]
    runs = {r.id: _contiguous_run(model, r, 0) for r in requests}
    for k in range(1, n):
        runs[-k] = _contiguous_run(model, requests[0], k)
    return runs


class _CourseEngine(Observing, PagedEngine):
    """The engine with the course's own decode batch and step (bound when this module was
    imported)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, build_batch=build_decode_batch, decode_step=paged_decode_step,
                         **kwargs)


_STUB_LOGITS = torch.arange(128, dtype=torch.float32)


class _StubEngine(Observing, PagedEngine):
    """No model runs: every prefill and decode gives the same logits. Only what serve does
    with steps, joins and blocks is looked at."""

    def prefill(self, request, tokens):
        self.note("prefill")
        return _STUB_LOGITS.clone()

    def decode(self, requests):
        self.note("decode")
        return _STUB_LOGITS.expand(len(requests), -1).clone()


def _serve(fn: Callable, count: int, block_size: int, num_blocks: int, preemption: str,
           seed: int, branches_every: int = 0, spread: int = 10) -> None:
    serve_run(fn, _CourseEngine, serve_case(count, seed, branches_every, spread), count,
              block_size, num_blocks, preemption, seed, branches_every, spread)


def _fresh(requests: list) -> list:
    return [make_request(r.id, r.prompt, r.output_len, r.arrival, r.n) for r in requests]


def _timing(fn: Callable, requests: list, num_blocks: int, block_size: int,
            story: str) -> None:
    """Every request joins at its arrival, all are returned, and the step limit holds at its
    boundary: the steps ``fn``'s own run took return, one fewer raises RuntimeError (the
    order in which same-step arrivals join is free, and changes how many steps a run
    takes)."""
    engine = _StubEngine(TinyModel(seed=SEED), num_blocks, block_size)
    setting = f"serve(...) with {len(requests)} requests {story}, a pool of {num_blocks} blocks"
    finished = learner_call("serve", fn, engine, _fresh(requests), 10_000)
    joined = join_diagnosis(engine, requests)
    if joined:
        raise AssertionError(f"{setting}: {joined}")
    wanted = sorted(r.id for r in requests) + [-k for k in range(1, 1 + sum(
        r.n - 1 for r in requests))]
    returned = sorted(r.id for r in finished or [])
    if returned != sorted(wanted):
        missing = sorted(set(wanted) - set(returned))
        raise AssertionError(f"{setting}: returned requests {returned}, expected "
                             f"{sorted(wanted)}" + (f": requests {missing} are missing from "
                                                    "what serve returned." if missing else "."))
    needed = len(engine.steps)
    engine = _StubEngine(TinyModel(seed=SEED), num_blocks, block_size)
    try:
        finished = fn(engine, _fresh(requests), needed)
    except Exception as exc:
        raise AssertionError(f"{setting}: serve(..., max_steps={needed}) raised "
                             f"{type(exc).__name__}: {exc}, though the same run without a limit "
                             f"took {needed} steps (steps 0 to {needed - 1}): a run that ends "
                             "within max_steps returns.") from None
    if len(finished or []) != len(wanted):
        raise AssertionError(f"{setting}: serve(..., max_steps={needed}) returned "
                             f"{len(finished or [])} requests, expected {len(wanted)}.")
    engine = _StubEngine(TinyModel(seed=SEED), num_blocks, block_size)
    step_limit(fn, engine, _fresh(requests), needed - 1, needed)


@thorough
def check_serve_thoroughly(fn: Callable) -> None:
    """Sixteen requests with forced preemption: all arriving at once, blocks of 1 and 2 by
    recompute, swap, and parallel sampling with copy-on-write; then join steps and the step
    limit on workloads with idle gaps, same-step arrivals and arrivals out of id order."""
    rng = random.Random(SEED)
    gaps = [make_request(i, [1 + i] * (1 + i), 2 + i % 3, arrival=a)
            for i, a in enumerate([0, 0, 4, 9, 9, 30])]
    shuffled = [make_request(i, [rng.randrange(128) for _ in range(rng.randint(1, 9))],
                             rng.randint(1, 7), arrival=rng.randint(0, 6),
                             n=3 if i == 5 else 1) for i in range(12)]
    rng.shuffle(shuffled)
    _timing(fn, gaps, 16, 4, "arriving at steps 0, 0, 4, 9, 9 and 30 (idle steps between)")
    _timing(fn, shuffled, 12, 2, "arriving over steps 0 to 6, listed out of order, one with "
            "3 branches (preemption)")
    _timing(fn, [make_request(0, [5], 1, arrival=3)], 4, 4, "arriving at step 3, one token")
    empty = learner_call("serve", fn, _StubEngine(TinyModel(seed=SEED), 4, 4), [], 0)
    if list(empty or []) != []:
        raise AssertionError(f"serve(engine, [], max_steps=0) returned {empty}, expected []: "
                             "nothing to serve ends at once.")
    _serve(fn, 16, 4, 30, "recompute", seed=6, spread=0)
    _serve(fn, 16, 1, 150, "recompute", seed=2)
    _serve(fn, 16, 2, 90, "swap", seed=3)
    _serve(fn, 16, 4, 40, "recompute", seed=4, branches_every=4)
    _serve(fn, 16, 4, 40, "swap", seed=5, branches_every=4)


# --- abort -----------------------------------------------------------------------------------


@thorough
def check_abort_thoroughly(fn: Callable) -> None:
    """Every request and branch cancelled in turn, from engines stopped after every step
    from 1 to 6, by recompute and by swap; a second cancel of the same request; then a run
    with branches and swaps cancelled mid-generation and served on to the end."""
    for preemption in ("recompute", "swap"):
        for steps in range(1, 7):
            _, requests = abort_story(preemption, steps)
            for victim_id in requests:
                engine, fresh = abort_story(preemption, steps)
                story = f"({preemption}, after {steps} steps)"
                expect_abort(fn, engine, fresh, fresh[victim_id], story)
                expect_abort(fn, engine, fresh, fresh[victim_id], story + ", a second time")
    _cancel_mid_run(fn)


def _cancel_mid_run(fn: Callable) -> None:
    """Twelve requests (every fourth with 3 branches) on 30 blocks of 2, by swap: stopped
    after 9 steps, request 0 (forked) and a swapped-out request are cancelled, then the rest
    is served to the end: each equals its own contiguous run, and both pools end empty."""
    model = TinyModel(seed=SEED)
    requests = make_requests(12, 8, 4, max_prompt=10, max_output=12, spread=0)
    engine = _CourseEngine(model, 30, 2, "swap", cpu_blocks=120)
    try:
        serve(engine, requests, 9)
    except RuntimeError:
        pass
    s = engine.scheduler
    victims = [requests[0]] + [r for r in s.swapped if r.parent is None and r.id != 0][:1]
    story = ("(12 requests on 30 blocks of 2 by swap, stopped mid-generation after 9 steps; "
             f"swapped out: {[r.id for r in s.swapped]})")
    gone = set()
    for victim in victims:
        gone |= {id(r) for r in _held(engine) if r is victim or r.parent == victim.id}
        expect_abort(fn, engine, {}, victim, story)
    finished = serve(engine, [], 2_000)
    where = f"after abort {story}, serving the rest to the end"
    for request in requests + [r for r in finished if r.branch]:
        if id(request) in gone or request.branch and request.parent == 0:
            continue
        tokens, _ = _contiguous_run(model, request, request.branch)
        if request.output != tokens:
            raise AssertionError(f"{where}: request {request.id} generated "
                                 f"{request.output}, its contiguous run {tokens}: a cancel "
                                 "freed blocks another request still used.")
    if s.gpu.num_free_blocks() != s.gpu.num_blocks or s.cpu.num_free_blocks() != \
            s.cpu.num_blocks:
        raise AssertionError(f"{where}: {s.gpu.num_free_blocks()} of {s.gpu.num_blocks} GPU "
                             f"and {s.cpu.num_free_blocks()} of {s.cpu.num_blocks} CPU blocks "
                             "are free at the end: a cancelled request's blocks never went "
                             "back.")


# --- decode_surviving_faults -----------------------------------------------------------------


class _PartialFault(_CourseEngine):
    """The course's engine, whose decode, when a poisoned request is in the batch, writes
    garbage at every request's reserved slot (a step that failed halfway) and raises."""

    def __init__(self, *args, poisoned: tuple[int, ...] = (), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.poisoned = set(poisoned)

    def decode(self, requests):
        if any(r.id in self.poisoned for r in requests):
            self.note("decode")
            size = self.blocks.block_size
            for request in requests:
                slot = prefill_slots(self.blocks, request.id)[-1]
                for layer in range(self.model.config.num_layers):
                    self.gpu_pool.k[layer][slot // size, slot % size] = 1e4
            raise RuntimeError("the model step failed halfway")
        return super().decode(requests)


@thorough
def check_decode_surviving_faults_thoroughly(fn: Callable) -> None:
    """A forked request whose step fails (its branches go with it), every request failing, a
    one-request batch, faults by swap; then, on the course's engine, a step that failed
    after writing part of its K/V, the survivors served to the end. A wrong ``abort`` costs
    its own points alone: where ``fn`` fails, it runs again with the course's ``abort``
    lent."""
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9], [3, 2]]
    runs = contiguous_runs(prompts, 8, n=3)

    def check(subject: Callable) -> None:
        for poisoned, n, preemption in [((0,), 3, "recompute"), ((0, 1, 2, 3), 1, "recompute"),
                                        ((2,), 3, "swap"), ((1, 3), 1, "swap")]:
            engine, _ = fault_story(prompts, poisoned=poisoned, n=n, preemption=preemption)
            story = f"(requests with {[len(p) for p in prompts]}-token prompts, by {preemption})"
            for _ in range(3):
                faulty_step(subject, engine, runs, story)
        engine, _ = fault_story(prompts[:1], poisoned=(0,))
        faulty_step(subject, engine, runs, "(a batch of one)")
        engine, _ = fault_story(prompts, glitches=1, n=3)
        faulty_step(subject, engine, runs, "(a forked request among them)")
        _fault_then_serve(subject, prompts)

    one_bug_one_todo_of_function(check, fn, {"abort": paged_engine.abort})


def _fault_then_serve(fn: Callable, prompts: list[list[int]]) -> None:
    model = TinyModel(seed=SEED)
    engine = _PartialFault(model, 24, 4, "recompute", poisoned=(2,))
    requests = [make_request(i, p, 8) for i, p in enumerate(prompts)]
    for request in requests:
        engine.scheduler.add(request)
    plan = engine.scheduler.step()
    for request in plan.prefill:
        logits = engine.prefill(request, request.tokens)
        request.emit(int(logits.argmax()), logits)
    engine.record(0, plan)
    plan = engine.scheduler.step()
    engine.apply_copies(plan)
    learner_call("decode_surviving_faults", fn, engine, plan.decode)
    where = ("decode_surviving_faults(...) on the course's engine, the model step failing "
             "halfway (garbage written at every request's new slot) whenever request 2 is in "
             "the batch")
    books_after_faults(engine, where)
    for request in requests:
        if request.id != 2 and len(request.output) != 2:
            raise AssertionError(f"{where}: request {request.id} has {len(request.output)} "
                                 "tokens after the step, expected 2.")
    engine.record(1, plan)
    serve(engine, [], 500)
    for request in requests:
        if request.id == 2:
            continue
        tokens, _ = _contiguous_run(model, request, 0)
        if request.output != tokens:
            raise AssertionError(f"{where}, then served to the end: request {request.id} "
                                 f"generated {request.output}, its contiguous run {tokens}: "
                                 "its new token's K/V, overwritten by the failed step, must be "
                                 "written again by a decode that succeeds.")
