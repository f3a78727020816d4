"""Chapter 8's hidden checks, and what the visible checks ask of them: the decode batch a
block manager's state calls for (read token by token from the manager, and what known
mistakes give), the decode batches and contiguous logits of a decode run, and each request's
(or branch's) own contiguous run. The thorough checks: block sizes 1, 2 and 16 and random
lengths for the batch; blocks of 1 and 16, ten steps and chapter 7's Triton kernel for the
decode step; sixteen requests with forced preemption (recompute and swap), blocks of 1 and 2
and parallel sampling with copy-on-write for the engine loop, which runs there on the
course's own decode batch and step.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from autograder.checks.ch08 import (
    ONE_TOO_LARGE,
    SEED,
    build_manager,
    decode_run,
    expect_batch,
    fork_story,
    forked_after_partial_block,
    make_requests,
    serve_run,
    wanted_keys,
)
from autograder.private import thorough
from course.block_manager import BlockManager
from course.paged_engine import (
    DecodeBatch,
    GenRequest,
    PagedEngine,
    build_decode_batch,
    paged_decode_step,
    prefill_slots,
)
from course.tiny_model import TinyModel, generate_contiguous

# --- build_decode_batch ----------------------------------------------------------------------


def _expected_batch(manager: BlockManager, seq_ids: list[int]) -> dict:
    rows = []
    for seq_id in seq_ids:
        table, length = manager.block_table(seq_id), manager.seq_len(seq_id)
        blocks = [table[t // manager.block_size] for t in range(length)]  # token by token
        rows.append((length - 1, blocks[-1] * manager.block_size
                     + (length - 1) % manager.block_size, table, length))
    positions = [r[0] for r in rows]
    return {"positions": positions, "slot_mapping": [r[1] for r in rows],
            "tables": [r[2] for r in rows], "seq_lens": [r[3] for r in rows],
            "known": {"positions": [([p + 1 for p in positions], ONE_TOO_LARGE)]}}


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
            "prefill_slots": slots, "tokens": tokens, "batches": batches, "logits": logits}


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


def serve_case(count: int, seed: int, branches_every: int = 0, spread: int = 10) -> dict:
    """The tokens and logits of every request's and branch's own contiguous run, by the key
    ``serve_run`` looks them up with."""
    model = TinyModel(seed=SEED)
    requests = make_requests(count, seed, branches_every, spread=spread)
    parents = {(r.prompt_len, tuple(r.prompt)): r for r in requests}
    return {key: _contiguous_run(model, request or parents[key[:2]], 0 if request else key[2])
            for key, request in wanted_keys(requests)}


class _CourseEngine(PagedEngine):
    """The engine with the course's own decode batch and step (bound when this module was
    imported)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, build_batch=build_decode_batch, decode_step=paged_decode_step,
                         **kwargs)


def _serve(fn: Callable, count: int, block_size: int, num_blocks: int, preemption: str,
           seed: int, branches_every: int = 0, spread: int = 10) -> None:
    serve_run(fn, _CourseEngine, serve_case(count, seed, branches_every, spread), count,
              block_size, num_blocks, preemption, seed, branches_every, spread)


@thorough
def check_serve_thoroughly(fn: Callable) -> None:
    """Sixteen requests with forced preemption: all arriving at once, blocks of 1 and 2 by
    recompute, swap, and parallel sampling with copy-on-write."""
    _serve(fn, 16, 4, 30, "recompute", seed=6, spread=0)
    _serve(fn, 16, 1, 150, "recompute", seed=2)
    _serve(fn, 16, 2, 90, "swap", seed=3)
    _serve(fn, 16, 4, 40, "recompute", seed=4, branches_every=4)
    _serve(fn, 16, 4, 40, "swap", seed=5, branches_every=4)
