"""Visible checks for chapter 8, the capstone: each TODO's readable case, every TODO checked on
its own. The decode batch is checked against a block manager's state (before and after
copy-on-write); the decode step on decode batches given to it, against the logits of plain
contiguous-cache generation; the engine loop by serving requests on an engine whose decode
step recomputes each request's whole context (so whatever TODOs 1 and 2 do, ``serve`` is
checked alone), comparing every token and every step's logits with each request's own
contiguous run, then requiring every block back in the pool.

What the expected values are (the batch a manager's state calls for, the batches and logits
of a decode run, each request's contiguous run) comes from the chapter's hidden module
(``autograder.private``), where the thorough checks are too.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from autograder.checks._helpers import learner_call
from autograder.private import private, visible
from course.block_manager import BlockManager
from course.paged_engine import KVPool, PagedEngine, make_request, paged_prefill
from course.tiny_model import TinyModel

SEED = 2029
LOGITS_TOLERANCE = 1e-4  # float32 paged vs contiguous: different summation orders only


# --- build_decode_batch ----------------------------------------------------------------------

BATCH_IDEA = ("Sequence s decodes the token at position p = seq_len - 1 (its slot is already "
              "reserved, so seq_len counts it); its K/V go to slot table[p // block_size] x "
              "block_size + p % block_size; block_tables holds each table, padded to the "
              "longest; seq_lens the lengths. Read tables and lengths from the manager "
              "every step.")
ONE_TOO_LARGE = "Each is one too large: seq_len already counts the token being decoded. "
STALE_TABLE = ("After copy-on-write a sequence's last block is a new one: a table remembered "
               "from an earlier step is stale. ")


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

DECODE_IDEA = ("At every layer: q, k, v = model.qkv(layer, x, batch.positions) (RoPE needs "
               "each token's true position); write k, v at batch.slot_mapping; attend with "
               "attention(q, pool.k[layer], pool.v[layer], batch.block_tables, "
               "batch.seq_lens, model.scale); x = model.finish_layer(layer, x, out); "
               "return model.logits(x).")
NAN_HINT = ("NaN: attention read a slot nothing wrote. At every layer write the new K/V "
            "(write_kv at batch.slot_mapping) before attending. ")


def decode_run(fn: Callable, prompts: list[list[int]], case: dict,
               attention: Callable | None = None, label: str = "", device: str = "cpu"
               ) -> None:
    """Prefill each prompt into a NaN-filled pool at ``case["prefill_slots"]``, then run
    ``fn`` on each step's tokens and decode batch (``case["tokens"]``, ``case["batches"]``):
    every step's logits must equal ``case["logits"]``, contiguous generation's."""
    model = TinyModel(seed=SEED, device=device)
    block_size = case["block_size"]
    pool = KVPool.empty(model, case["num_blocks"], block_size)
    for prompt, slots in zip(prompts, case["prefill_slots"], strict=True):
        paged_prefill(model, prompt, slots, pool)
    extra = {} if attention is None else {"attention": attention}
    for step, (tokens, batch, wanted) in enumerate(zip(case["tokens"], case["batches"],
                                                       case["logits"], strict=True)):
        logits = learner_call("paged_decode_step", fn, model, tokens.to(device),
                              batch.to(device), pool, **extra)
        for seq_id, want in enumerate(wanted):
            want = want.to(device)
            got = logits[seq_id] if isinstance(logits, torch.Tensor) else None
            if got is not None and got.shape == want.shape and not got.isnan().any() and \
                    torch.allclose(got, want, atol=LOGITS_TOLERANCE, rtol=LOGITS_TOLERANCE):
                continue
            hint = NAN_HINT if got is not None and got.isnan().any() else ""
            raise AssertionError(
                f"paged_decode_step(...){label}, prompts of {[len(p) for p in prompts]} tokens, "
                f"blocks of {block_size}, decode step {step + 1}: sequence {seq_id}'s logits "
                f"differ from contiguous generation's. {hint}{DECODE_IDEA}")


@visible
def check_paged_decode_step(fn: Callable) -> None:
    """Prompts of 3 and 6 tokens in blocks of 4, four decode steps."""
    prompts = [[5, 17, 99], [1, 2, 3, 4, 5, 6]]
    decode_run(fn, prompts, private("08").decode_case(prompts, 4, 4))


# --- serve -----------------------------------------------------------------------------------


class RecomputingEngine(PagedEngine):
    """A PagedEngine whose decode step recomputes each request's whole context (its prompt
    and every token it generated, the last one being the token decoded) without reading the
    KV pool: ``serve`` is checked on its own, whatever the decode batch and step do."""

    def decode(self, requests: list) -> torch.Tensor:
        rows = []
        for request in requests:
            context = request.tokens
            scratch = KVPool.empty(self.model, 1, len(context))
            rows.append(paged_prefill(self.model, context, torch.arange(len(context)),
                                      scratch))
        return torch.stack(rows)


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


def serve_run(fn: Callable, engine_class: type, expected: dict, count: int, block_size: int,
              num_blocks: int, preemption: str, seed: int, branches_every: int = 0,
              spread: int = 10) -> None:
    """Serve ``make_requests(count, seed, branches_every, spread=spread)`` with ``fn`` on an
    ``engine_class``; every request and branch must equal ``expected[key]`` (tokens and
    logits of its own contiguous run) and every block must be back in the pool."""
    model = TinyModel(seed=SEED)
    requests = make_requests(count, seed, branches_every, spread=spread)
    cpu_blocks = 4 * num_blocks if preemption == "swap" else 0
    engine = engine_class(model, num_blocks, block_size, preemption, cpu_blocks)
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


@visible
def check_serve(fn: Callable) -> None:
    """Eight requests arriving over 10 steps, blocks of 4, a pool of 24 blocks (preemption by
    recompute happens)."""
    expected = private("08").serve_case(8, 1)
    serve_run(fn, RecomputingEngine, expected, 8, 4, 24, "recompute", seed=1)
