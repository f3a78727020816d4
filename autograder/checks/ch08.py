"""Checks for chapter 8, the capstone: a paged engine that must equal a contiguous baseline.

Each TODO is checked with the course's reference for everything around it: the decode batch
against a block manager's state (before and after copy-on-write); the decode step against the
logits of plain contiguous-cache generation; the engine loop by serving requests (staggered
arrivals, a pool small enough to force preemption, block sizes down to 1, recompute and swap,
parallel sampling) and comparing every token and every step's logits with each request's (or
branch's) own contiguous run, then requiring every block back in the pool.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from autograder.checks._helpers import learner_call
from course.block_manager import BlockManager
from course.paged_engine import (
    KVPool,
    PagedEngine,
    build_decode_batch,
    make_request,
    paged_prefill,
    prefill_slots,
)
from course.tiny_model import TinyModel, generate_contiguous

SEED = 2029
LOGITS_TOLERANCE = 1e-4  # float32 paged vs contiguous: different summation orders only


# --- build_decode_batch ----------------------------------------------------------------------

_BATCH_IDEA = ("Sequence s decodes the token at position p = seq_len - 1 (its slot is already "
               "reserved, so seq_len counts it); its K/V go to slot table[p // block_size] x "
               "block_size + p % block_size; block_tables holds each table, padded to the "
               "longest; seq_lens the lengths. Read tables and lengths from the manager "
               "every step.")


def _expected_batch(manager: BlockManager, seq_ids: list[int]) -> dict:
    rows = []
    for seq_id in seq_ids:
        table, length = manager.block_table(seq_id), manager.seq_len(seq_id)
        blocks = [table[t // manager.block_size] for t in range(length)]  # token by token
        rows.append((length - 1, blocks[-1] * manager.block_size
                     + (length - 1) % manager.block_size, table, length))
    return {"positions": [r[0] for r in rows], "slot_mapping": [r[1] for r in rows],
            "tables": [r[2] for r in rows], "seq_lens": [r[3] for r in rows]}


def _check_batch(fn: Callable, manager: BlockManager, seq_ids: list[int], story: str) -> None:
    batch = learner_call("build_decode_batch", fn, manager, seq_ids)
    want = _expected_batch(manager, seq_ids)
    where = f"build_decode_batch(manager, {seq_ids}) {story}"
    for name in ("positions", "slot_mapping", "seq_lens"):
        got = getattr(batch, name, None)
        if not isinstance(got, torch.Tensor) or got.tolist() != want[name]:
            got_text = got.tolist() if isinstance(got, torch.Tensor) else got
            hint = ""
            if name == "positions" and got_text == [p + 1 for p in want["positions"]]:
                hint = "Each is one too large: seq_len already counts the token being decoded. "
            if name == "slot_mapping" and story.endswith("copy-on-write"):
                hint = ("After copy-on-write a sequence's last block is a new one: a table "
                        "remembered from an earlier step is stale. ")
            raise AssertionError(f"{where}: {name} is {got_text}, expected {want[name]}. "
                                 f"{hint}{_BATCH_IDEA}")
    tables = getattr(batch, "block_tables", None)
    if not isinstance(tables, torch.Tensor) or tables.dim() != 2 or \
            tables.shape[0] != len(seq_ids) or tables.is_floating_point():
        raise AssertionError(f"{where}: block_tables must be an integer tensor [num_seqs, "
                             f"max_blocks], got {getattr(tables, 'shape', tables)}. "
                             + _BATCH_IDEA)
    for row, table in zip(tables.tolist(), want["tables"], strict=True):
        if row[:len(table)] != table:
            raise AssertionError(f"{where}: a block_tables row starts {row[:len(table)]}, "
                                 f"expected the sequence's table {table}. {_BATCH_IDEA}")


def _forked_after_partial_block(fn: Callable, block_size: int) -> None:
    """A sequence decodes a step (a first batch), is forked mid-block, and both decode: the
    parent's write must go to its copy, the child's to the shared block it now owns alone."""
    manager = BlockManager(12, block_size)
    manager.allocate(7, block_size + 1)
    manager.append_slot(7)
    _check_batch(fn, manager, [7], "after one decode step")
    manager.fork(7, 8)
    manager.append_slot(7)  # copy-on-write: sequence 7 moves to a fresh last block
    manager.append_slot(8)
    _check_batch(fn, manager, [7, 8], "after a fork and copy-on-write")


def check_build_decode_batch(fn: Callable) -> None:
    """Blocks of 4: sequences of 6 and 5 tokens (the second just took a new block), then a
    fork with copy-on-write."""
    manager = BlockManager(8, 4)
    manager.allocate(0, 5)
    manager.allocate(1, 4)
    manager.append_slot(0)
    manager.append_slot(1)
    _check_batch(fn, manager, [0, 1], "(lengths 6 and 5, blocks of 4)")
    _forked_after_partial_block(fn, 4)


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
        _check_batch(fn, manager, ids, f"(9 sequences, blocks of {block_size})")
        _check_batch(fn, manager, ids[:1], f"(one sequence, blocks of {block_size})")
        if block_size > 1:
            _forked_after_partial_block(fn, block_size)


# --- paged_decode_step -----------------------------------------------------------------------


def _decode_case(fn: Callable, prompts: list[list[int]], steps: int, block_size: int,
                 attention: Callable | None = None, label: str = "", device: str = "cpu"
                 ) -> None:
    """Prefill each prompt into a NaN-filled pool, then decode ``steps`` tokens with ``fn``;
    every step's logits must equal contiguous generation's."""
    model = TinyModel(seed=SEED, device=device)
    baseline = [generate_contiguous(model, p, steps + 1) for p in prompts]
    manager = BlockManager(sum(len(p) + steps for p in prompts) + 8, block_size)
    pool = KVPool.empty(model, manager.num_blocks, block_size)
    for seq_id, prompt in enumerate(prompts):
        manager.allocate(seq_id, len(prompt))
        paged_prefill(model, prompt, prefill_slots(manager, seq_id), pool)
    ids = list(range(len(prompts)))
    for step in range(steps):
        for seq_id in ids:
            manager.append_slot(seq_id)
        batch = build_decode_batch(manager, ids).to(device)
        tokens = torch.tensor([baseline[s][0][step] for s in ids], device=device)
        extra = {} if attention is None else {"attention": attention}
        logits = learner_call("paged_decode_step", fn, model, tokens, batch, pool, **extra)
        for seq_id in ids:
            want = baseline[seq_id][1][step + 1]
            got = logits[seq_id] if isinstance(logits, torch.Tensor) else None
            if got is not None and got.shape == want.shape and not got.isnan().any() and \
                    torch.allclose(got, want, atol=LOGITS_TOLERANCE, rtol=LOGITS_TOLERANCE):
                continue
            hint = ""
            if got is not None and got.isnan().any():
                hint = ("NaN: attention read a slot nothing wrote. At every layer write the "
                        "new K/V (write_kv at batch.slot_mapping) before attending. ")
            raise AssertionError(
                f"paged_decode_step(...){label}, prompts of {[len(p) for p in prompts]} tokens, "
                f"blocks of {block_size}, decode step {step + 1}: sequence {seq_id}'s logits "
                f"differ from contiguous generation's. {hint}At every layer: q, k, v = "
                "model.qkv(layer, x, batch.positions) (RoPE needs each token's true "
                "position); write k, v at batch.slot_mapping; attend with "
                "attention(q, pool.k[layer], pool.v[layer], batch.block_tables, "
                "batch.seq_lens, model.scale); x = model.finish_layer(layer, x, out); "
                "return model.logits(x).")


def check_paged_decode_step(fn: Callable) -> None:
    """Prompts of 3 and 6 tokens in blocks of 4, four decode steps."""
    _decode_case(fn, [[5, 17, 99], [1, 2, 3, 4, 5, 6]], 4, 4)


def check_paged_decode_step_thoroughly(fn: Callable) -> None:
    """Blocks of 1 and 16, five sequences, ten steps; and chapter 7's Triton kernel (on the
    interpreter without a GPU) as the attention."""
    rng = random.Random(SEED)
    prompts = [[rng.randrange(128) for _ in range(n)] for n in (1, 7, 16, 17, 30)]
    _decode_case(fn, prompts, 10, 1)
    _decode_case(fn, prompts, 10, 16)
    from autograder.checks.ch07 import on_gpu
    from kernels.paged_attention import paged_attention

    gpu = on_gpu()  # compiled, the kernel needs CUDA tensors and blocks of at least 16
    _decode_case(fn, prompts[:2], 3, 16 if gpu else 4, paged_attention,
                 " with the Triton kernel", "cuda" if gpu else "cpu")


# --- serve -----------------------------------------------------------------------------------


def _requests(count: int, seed: int, branches_every: int = 0, max_prompt: int = 20,
              max_output: int = 24, spread: int = 10) -> list:
    rng = random.Random(seed)
    return [make_request(i, [rng.randrange(128) for _ in range(rng.randint(1, max_prompt))],
                         rng.randint(1, max_output), arrival=rng.randint(0, spread),
                         n=3 if branches_every and i % branches_every == 0 else 1)
            for i in range(count)]


def _baseline(model: TinyModel, request) -> tuple[list[int], list[torch.Tensor]]:
    first = None
    if request.branch:  # its own contiguous run: the same forced first token, then greedy
        first = int(generate_contiguous(model, request.prompt, 1)[1][0]
                    .topk(request.branch + 1).indices[-1])
    return generate_contiguous(model, request.prompt, request.output_len, first)


def _serve(fn: Callable, count: int, block_size: int, num_blocks: int, preemption: str,
           seed: int, branches_every: int = 0, spread: int = 10) -> None:
    model = TinyModel(seed=SEED)
    requests = _requests(count, seed, branches_every, spread=spread)
    cpu_blocks = 4 * num_blocks if preemption == "swap" else 0
    engine = PagedEngine(model, num_blocks, block_size, preemption, cpu_blocks)
    setting = (f"serve(...) with {count} requests arriving over {spread + 1} steps, blocks of "
               f"{block_size}, a pool of "
               f"{num_blocks} blocks, preemption by {preemption}"
               + (", 3 parallel-sampling branches for every "
                  f"{branches_every}th request" if branches_every else ""))
    finished = learner_call("serve", fn, engine, requests, 2_000)
    preempted = {int(part.split()[-1]) for r in engine.records
                 for part in r.event.split(", ") if part.startswith("preempted")}
    by_key = {(r.id if r.branch == 0 else (r.prompt_len, tuple(r.prompt), r.branch)): r
              for r in finished or []}
    wanted = [(r.id, r) for r in requests]
    for r in requests:
        wanted += [((r.prompt_len, tuple(r.prompt), k), None) for k in range(1, r.n)]
    for key, request in wanted:
        got = by_key.get(key)
        if got is None:
            what = (f"request {key}" if request is not None
                    else f"branch {key[2]} of a request with a {key[0]}-token prompt")
            hint = ("A request with n > 1 forks its branches once, right after its first "
                    "prefill: engine.start_branches(request, logits). " if request is None
                    else "Every request must finish and be returned. ")
            raise AssertionError(f"{setting}: {what} is missing from what serve returned. "
                                 f"{hint}")
        tokens, logits = _baseline(model, got)
        if got.output != tokens or len(got.logits) != len(logits) or not all(
                torch.allclose(a, b, atol=LOGITS_TOLERANCE, rtol=LOGITS_TOLERANCE)
                for a, b in zip(got.logits, logits, strict=False)):
            index = next((i for i, (a, b) in enumerate(zip(got.output, tokens, strict=False))
                          if a != b), min(len(got.output), len(tokens)))
            hint = ""
            if got.id in preempted and preemption == "recompute":
                hint = ("It was preempted by recompute: when re-admitted, prefill its whole "
                        "context, request.tokens (prompt and every token it generated), so "
                        "the next token is computed at position context_len. ")
            elif got.id in preempted or branches_every:
                hint = ("Apply the step's block copies (engine.apply_copies(plan): "
                        "copy-on-write and swaps) before prefilling and decoding. ")
            raise AssertionError(
                f"{setting}: request {got.id}" + (f" (branch {got.branch})" if got.branch
                                                   else "")
                + f" generated {got.output[:index + 1]}..., its contiguous run "
                f"{tokens[:index + 1]}... (first difference at output token {index}). {hint}")
    blocks = engine.blocks
    if blocks.num_free_blocks() != blocks.num_blocks or any(blocks.ref_counts):
        raise AssertionError(f"{setting}: after serving, {blocks.num_free_blocks()} of "
                             f"{blocks.num_blocks} blocks are free. Finish each request as "
                             "soon as it is done (engine.scheduler.finish(request)): that "
                             "frees its blocks.")


def check_serve(fn: Callable) -> None:
    """Eight requests arriving over 10 steps, blocks of 4, a pool of 24 blocks (preemption by
    recompute happens)."""
    _serve(fn, 8, 4, 24, "recompute", seed=1)


def check_serve_thoroughly(fn: Callable) -> None:
    """Sixteen requests with forced preemption: all arriving at once, blocks of 1 and 2 by
    recompute, swap, and parallel sampling with copy-on-write."""
    _serve(fn, 16, 4, 30, "recompute", seed=6, spread=0)
    _serve(fn, 16, 1, 150, "recompute", seed=2)
    _serve(fn, 16, 2, 90, "swap", seed=3)
    _serve(fn, 16, 4, 40, "recompute", seed=4, branches_every=4)
    _serve(fn, 16, 4, 40, "swap", seed=5, branches_every=4)
