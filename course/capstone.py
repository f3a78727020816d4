"""What chapter 8 shows about a served run: equality with contiguous generation, and memory
over time against contiguous reservation at the same capacity."""

from __future__ import annotations

from collections.abc import Callable

import torch

from course.paged_engine import GenRequest, PagedEngine, make_request
from course.tiny_model import TinyModel, generate_contiguous


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


def learner_parts_or_reference(serve: Callable, build_batch: Callable,
                               decode_step: Callable, model: TinyModel
                               ) -> tuple[Callable, dict[str, Callable]]:
    """The learner's ``serve`` and engine parts (``build_batch``, ``decode_step``), each
    where it serves four small requests exactly as contiguous generation does, else the
    course's, with a printed note (so the pictures below always draw). Returns the serve
    function and the keyword arguments for ``PagedEngine``."""
    from course import paged_engine

    parts = {"build_batch": build_batch, "decode_step": decode_step}
    if not _serves_exactly(paged_engine.serve, parts, model, "build_decode_batch and "
                           "paged_decode_step"):
        parts = {"build_batch": paged_engine.build_decode_batch,
                 "decode_step": paged_engine.paged_decode_step}
    if not _serves_exactly(serve, parts, model, "serve"):
        serve = paged_engine.serve
    return serve, parts


def _serves_exactly(serve: Callable, parts: dict[str, Callable], model: TinyModel,
                    names: str) -> bool:
    probe = [make_request(i, [i + 1, 2 * i + 3, 7], 3, arrival=i) for i in range(4)]
    fallback = f"so the course's own version of {names} runs this."
    try:
        report = equality_report(model, serve(PagedEngine(model, 8, 4, **parts), probe))
    except NotImplementedError:
        print(f"Note: {names} is not written yet, {fallback}")
        return False
    except Exception as exc:
        print(f"Note: {names} raised {type(exc).__name__} ({exc}), {fallback}")
        return False
    if report["identical"] == report["finished"] == len(probe):
        print(f"Using your {names}.")
        return True
    print(f"Note: with your {names} the engine disagrees with contiguous generation (see "
          f"the test cells), {fallback}")
    return False


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
