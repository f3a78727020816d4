"""What chapter 8 shows about a served run: equality with contiguous generation, and memory
over time against contiguous reservation at the same capacity."""

from __future__ import annotations

from collections.abc import Callable

import torch

from course.notebook import NotReady, needs
from course.notebook import learner_or_course_probed as _chosen
from course.tiny_model import TinyModel, generate_contiguous
from course.v0 import paged_engine
from course.v0.block_manager import BlockManager
from course.v0.paged_engine import (
    DecodeBatch,
    GenRequest,
    KVPool,
    PagedEngine,
    make_request,
    paged_prefill,
)


def contiguous_run(model: TinyModel, request: GenRequest) -> tuple[list[int], list]:
    """The request's own contiguous generation (a branch: with its forced first token)."""
    first = None
    if request.branch:
        first_logits = generate_contiguous(model, request.prompt, 1)[1][0]
        first = int(first_logits.topk(request.branch + 1).indices[-1])
    return generate_contiguous(model, request.prompt, request.output_len, first)


def equality_report(model: TinyModel, finished: list[GenRequest]) -> dict[str, float]:
    """How many finished requests (and branches) equal their contiguous runs token for token,
    and the largest logit difference over every step of every request."""
    identical, largest = 0, 0.0
    for request in finished:
        tokens, logits = contiguous_run(model, request)
        identical += tokens == request.output
        largest = max([largest] + [(a - b).abs().max().item()
                                   for a, b in zip(request.logits, logits, strict=False)])
    return {"finished": len(finished), "identical": identical, "largest_logit_difference":
            largest, "branches": sum(1 for r in finished if r.branch)}


def engine_parts(serve: Callable, build_batch: Callable, decode_step: Callable,
                 model: TinyModel) -> tuple[Callable, dict[str, Callable]]:
    """What the pictures below run: ``serve``, and the keyword arguments ``build_batch`` and
    ``decode_step`` for ``PagedEngine``. Each is the learner's where it runs and agrees with
    the course's own version on a small case (``course.notebook.learner_or_course``, which
    prints one line saying which), else the course's own version; where that is not in this
    edition, a stand-in that ``course.notebook.needs`` turns into one line saying what to
    finish. ``serve`` is tried on an engine with the chosen parts."""
    parts = {
        "build_batch": _chosen(build_batch, paged_engine.build_decode_batch, _batch_probe),
        "decode_step": _chosen(decode_step, paged_engine.paged_decode_step,
                               lambda fn: _decode_probe(fn, model)),
    }
    try:
        needs(*parts.values())
    except NotReady:
        return serve, parts  # nothing to serve with yet: the cell stops at needs(...)
    return _chosen(serve, paged_engine.serve, lambda fn: _serve_probe(fn, parts, model)), parts


def _batch_probe(build_batch: Callable) -> tuple:
    """A decode batch of two sequences, one just past a block boundary; table rows compared
    up to each table's length (padding is free)."""
    manager = BlockManager(8, 4)
    manager.allocate(0, 5)
    manager.allocate(1, 4)
    manager.append_slot(0)
    manager.append_slot(1)
    batch = build_batch(manager, [0, 1])
    rows = [row[:len(manager.block_table(s))] for s, row in
            zip([0, 1], batch.block_tables.tolist(), strict=True)]
    return (batch.positions.tolist(), batch.slot_mapping.tolist(), rows,
            batch.seq_lens.tolist())


def _decode_probe(decode_step: Callable, model: TinyModel) -> torch.Tensor:
    """The logits of one decode step of a 3-token prompt prefilled into block 1 of a pool
    of blocks of 4: position 3, slot 7."""
    device = model.embedding.device
    pool = KVPool.empty(model, 2, 4)
    prompt = [3, 14, 15]
    logits = paged_prefill(model, prompt, torch.tensor([4, 5, 6]), pool)
    batch = DecodeBatch(torch.tensor([3]), torch.tensor([7]),
                        torch.tensor([[1]], dtype=torch.int32),
                        torch.tensor([4], dtype=torch.int32)).to(device)
    return decode_step(model, logits.argmax().view(1), batch, pool).cpu()


def _serve_probe(serve: Callable, parts: dict[str, Callable], model: TinyModel) -> list:
    """Every token four small requests, arriving two by two, get on a pool of 5 blocks of 4
    (too few for all of them: preemption by recompute happens)."""
    probe = [make_request(i, [i + 1, 2 * i + 3, 7], 5, arrival=i // 2) for i in range(4)]
    finished = serve(PagedEngine(model, 5, 4, **parts), probe, 200)
    return sorted((r.id, r.branch, r.output) for r in finished)


def reservation_trace(requests: list[GenRequest], capacity_tokens: int, max_len: int
                      ) -> tuple[list[int], list[int]]:
    """Resident requests and stored tokens per step when each request reserves ``max_len``
    slots up front (a contiguous allocator cannot know how long the output will be: chapter
    2's Max policy), first come first served, in ``capacity_tokens``, for the same arrivals.
    As in the engine, a request's prefill step stores its prompt and emits one token; each
    later step stores the last token and emits the next; it leaves the step it emits its last
    token."""
    waiting = sorted(requests, key=lambda r: (r.arrival, r.id))
    running: list[list[int]] = []  # per request: [reserved, stored, tokens still to emit]
    resident, stored = [], []
    step = 0
    while waiting or running:
        for entry in running:
            entry[1] += 1
            entry[2] -= 1
        running = [entry for entry in running if entry[2] > 0]
        reserved = sum(entry[0] for entry in running)
        while waiting and waiting[0].arrival <= step and \
                reserved + max_len <= capacity_tokens:
            request = waiting.pop(0)
            reserved += max_len
            if request.output_len > 1:
                running.append([max_len, request.prompt_len, request.output_len - 1])
        resident.append(len(running))
        stored.append(sum(entry[1] for entry in running))
        step += 1
    return resident, stored


def workload(count: int, seed: int = 0, branches_every: int = 0, spread: int = 10
             ) -> list[GenRequest]:
    """``count`` requests: prompts of 1 to 20 random tokens, 1 to 24 output tokens, arrivals
    over the first ``spread`` steps; every ``branches_every``-th asks for 3 parallel
    samples."""
    gen = torch.Generator().manual_seed(seed)

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=gen))

    return [make_request(i, [draw(0, 127) for _ in range(draw(1, 20))], draw(1, 24),
                         arrival=draw(0, spread),
                         n=3 if branches_every and i % branches_every == 0 else 1)
            for i in range(count)]
