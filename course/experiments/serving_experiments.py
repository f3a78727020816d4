"""The chapter 5 experiments, each a function that returns its numbers (and a command line that
prints them): ``python -m course.experiments.serving_experiments NAME`` for NAME in batching, rates,
preemption, timeline, blocks, bench.

All run OPT-13B on an A100 40 GB (``course.experiments.serving_sim``'s cost model) with chapter 2's
KV pool of 14,128 token slots, on ShareGPT-like requests arriving as a Poisson process. "Contiguous"
is a scheduler whose block size is ``max_model_len`` (2,048): each request then holds one block of
2,048 slots from admission on, exactly a contiguous max-length reservation.

Each experiment takes the scheduler class it runs (``scheduler``; the course's own by
default), so that the notebook can run the learner's: ``probe`` plays small scenarios
(``PROBES``: together they take every path of a step and meet every rule of the policy) for
``course.notebook.learner_or_course_class`` to compare two classes on.
"""

from __future__ import annotations

import argparse
import time

from course.experiments.serving_sim import (
    POOL_SLOTS,
    Report,
    opt13b_a100_40gb,
    poisson_arrivals,
    simulate,
)
from course.experiments.workloads import SHAREGPT
from course.language import aligned, tr, tr_later
from course.v0.scheduler import Request, Scheduler, SwapSpaceFullError, static_batching

MAX_MODEL_LEN = 2048
SWAP_SLOTS = 5242  # vLLM 0.8.5's default 4 GiB of swap space / 800 KiB per OPT-13B token


def run(rate: float, kind: str = "paged", block_size: int = 16, count: int = 600,
        preemption: str = "recompute", seed: int = 0,
        scheduler: type[Scheduler] = Scheduler) -> Report:
    """One simulated run of ``scheduler``: ``kind`` is "paged", "contiguous" or "static"."""
    requests = poisson_arrivals(SHAREGPT, count, rate, seed, MAX_MODEL_LEN)
    size = MAX_MODEL_LEN if kind in ("contiguous", "static") else block_size
    scheduler_class = static_batching(scheduler) if kind == "static" else scheduler
    return simulate(requests, lambda: scheduler_class(
        POOL_SLOTS // size, size, preemption=preemption,
        cpu_blocks=SWAP_SLOTS // size if preemption == "swap" else 0), opt13b_a100_40gb())


def batching(rate: float = 2.0, scheduler: type[Scheduler] = Scheduler) -> dict[str, Report]:
    return {tr_later("static batching (contiguous)"): run(rate, "static", scheduler=scheduler),
            tr_later("continuous batching, contiguous"): run(rate, "contiguous",
                                                             scheduler=scheduler),
            tr_later("continuous batching, paged (B=16)"): run(rate, "paged",
                                                               scheduler=scheduler)}


def rates(values: tuple[float, ...] = (0.5, 1, 1.5, 2, 3, 4, 6),
          scheduler: type[Scheduler] = Scheduler) -> dict[str, list[Report]]:
    return {kind: [run(r, kind, scheduler=scheduler) for r in values]
            for kind in (tr_later("contiguous"), tr_later("paged"))}


def preemption(block_sizes: tuple[int, ...] = (8, 16, 32, 64, 128, 256), rate: float = 4.0,
               scheduler: type[Scheduler] = Scheduler) -> dict[str, list[Report]]:
    return {mode: [run(rate, "paged", b, preemption=mode, scheduler=scheduler)
                   for b in block_sizes]
            for mode in (tr_later("recompute"), tr_later("swap"))}


def blocks(block_sizes: tuple[int, ...] = (8, 16, 32, 64, 128, 256), rate: float = 3.0,
           scheduler: type[Scheduler] = Scheduler) -> list[Report]:
    return [run(rate, "paged", b, scheduler=scheduler) for b in block_sizes]


def bench(scheduler: type[Scheduler] = Scheduler) -> str:
    """The simulator's own speed: 10,000 requests at 8 per second."""
    start = time.perf_counter()
    report = run(8.0, "paged", count=10_000, scheduler=scheduler)
    elapsed = time.perf_counter() - start
    return tr(f"simulated {report.completed:,} requests ({report.output_tokens:,} output "
              f"tokens) in {elapsed:.1f} s of wall time: {report.completed / elapsed:,.0f} "
              "simulated requests per second")


# Small scenarios that, together, take every path of a step and meet every rule of the
# policy: requests that outgrow their pool (preempted, then back: prefilled again, or swapped
# out and in, two of them swapped out at once) by recompute and by swap, a request rejected
# though the batch is full, a watermark, a token budget met exactly and one that counts the
# step's decodes, a batch limit, a CPU pool too small, a swap-in held back by the watermark
# and one that waits for the oldest.
_GROWING = ((4, 4), (6, 4), (6, 2), (6, 12))
PROBES = (
    dict(specs=_GROWING, num_blocks=8, block_size=2, preemption="recompute"),
    dict(specs=_GROWING, num_blocks=8, block_size=2, preemption="swap", cpu_blocks=8),
    dict(specs=((1, 1),) * 5 + ((1, 5),), num_blocks=5, block_size=1, max_num_seqs=5,
         max_num_batched_tokens=8, watermark=0.0),
    dict(specs=((4, 50), (4, 34), (16, 2), (12, 2), (8, 2)), num_blocks=10, block_size=4,
         watermark=0.2),
    dict(specs=((30, 1), (34, 1), (1, 1)), num_blocks=40, block_size=4,
         max_num_batched_tokens=64, watermark=0.0),
    dict(specs=((6, 4), (6, 4), (12, 2)), num_blocks=20, block_size=4,
         max_num_batched_tokens=13, watermark=0.0),
    dict(specs=((2, 3),) * 3, num_blocks=10, block_size=4, max_num_seqs=2, watermark=0.0),
    dict(specs=((3, 10),) * 3, num_blocks=7, block_size=4, watermark=0.0, preemption="swap",
         cpu_blocks=1),
    dict(specs=((4, 12),) * 4, num_blocks=10, block_size=4, watermark=0.2, preemption="swap",
         cpu_blocks=12),
    dict(specs=((1, 3), (2, 2), (1, 3)), num_blocks=4, block_size=1, watermark=0.0,
         preemption="swap", cpu_blocks=8),
)


def plans(scheduler: type[Scheduler], specs: tuple[tuple[int, int], ...],
          max_steps: int = 500, **options) -> list[tuple]:
    """What ``scheduler`` (made with the keyword arguments ``options``) plans, step by step,
    when it serves requests ``specs`` ((prompt_len, output_len), all there at the start):
    per step, the ids it prefills, decodes, preempts, swaps out, swaps in and rejects, and
    the waiting and running ids after it. A step that raises SwapSpaceFullError ends the
    list with the queues it left and the free GPU and CPU blocks."""
    s = scheduler(**options)
    for i, (prompt, output) in enumerate(specs):
        s.add(Request(i, prompt, output))
    steps: list[tuple] = []
    while (s.waiting or s.running or s.swapped) and len(steps) < max_steps:
        try:
            plan = s.step()
        except SwapSpaceFullError:
            steps.append(("swap space full", _ids(s.waiting), _ids(s.running),
                          _ids(s.swapped), s.gpu.num_free_blocks(), s.cpu.num_free_blocks()))
            break
        steps.append(tuple(_ids(rs) for rs in (
            plan.prefill, plan.decode, plan.preempted, [r for r, _ in plan.swapped_out],
            [r for r, _ in plan.swapped_in], [r for r, _ in plan.rejected], s.waiting,
            s.running)))
        for request in plan.prefill + plan.decode:
            request.generated += 1
            if request.done:
                s.finish(request)
    return steps


def _ids(requests) -> tuple[int, ...]:
    return tuple(r.id for r in requests)


def probe(scheduler: type[Scheduler]) -> list[list[tuple]]:
    """What ``scheduler`` plans on each of ``PROBES``."""
    return [plans(scheduler, **scenario) for scenario in PROBES]


def row(name: str, report: Report) -> str:
    """``report``'s line under ``header()``, named ``name`` (in the chosen language)."""
    mean_tpot = sum(report.tpot) / len(report.tpot)
    return aligned(tr(name), -36) + (
        f"{report.requests_per_s:>8.2f}{report.tokens_per_s:>9.0f}"
        f"{report.percentile(report.ttft, 50):>9.2f}{1000 * mean_tpot:>9.1f}"
        f"{report.percentile(report.latency, 50):>8.1f}"
        f"{report.percentile(report.latency, 99):>8.1f}"
        f"{report.preemptions:>7}{report.swaps:>6}")


def header() -> str:
    """The columns of ``row``: requests and output tokens served per second, the median time
    to first token (s), the mean time per output token after the first (ms), the median and
    99th percentile latency from arrival to last token (s), preemptions, swaps (out and in)."""
    return " " * 39 + tr("req/s    tok/s TTFT50 s  TPOT ms lat50 s lat99 s  preem swaps")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m course.experiments.serving_experiments")
    parser.add_argument("name", choices=["batching", "rates", "preemption", "timeline",
                                         "blocks", "bench"])
    name = parser.parse_args(argv).name
    if name == "batching":
        print(header())
        for label, report in batching().items():
            print(row(label, report))
    elif name == "rates":
        print(header())
        for kind, reports in rates().items():
            for rate, report in zip((0.5, 1, 1.5, 2, 3, 4, 6), reports, strict=True):
                print(row(tr_later(f"{kind}, {rate} req/s"), report))
    elif name == "preemption":
        print(header())
        for mode, reports in preemption().items():
            for size, report in zip((8, 16, 32, 64, 128, 256), reports, strict=True):
                print(row(tr_later(f"{mode}, block size {size}"), report))
    elif name == "blocks":
        print(header())
        for size, report in zip((8, 16, 32, 64, 128, 256), blocks(), strict=True):
            print(row(tr_later(f"paged, block size {size}"), report))
    elif name == "timeline":
        report = run(4.0, "paged")
        steps = report.timeline
        print(tr(f"{len(steps.time)} steps, peak queue {max(steps.waiting)}, peak batch "
                 f"{max(steps.running)}, preemptions {sum(steps.preemptions)}"))
    else:
        print(bench())


if __name__ == "__main__":
    main()
