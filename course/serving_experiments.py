"""The chapter 5 experiments, each a function that returns its numbers (and a command line
that prints them): ``python -m course.serving_experiments NAME`` for NAME in batching, rates,
preemption, timeline, blocks, bench.

All run OPT-13B on an A100 40 GB (``course.serving_sim``'s cost model) with chapter 2's KV
pool of 14,128 token slots, on ShareGPT-like requests arriving as a Poisson process.
"Contiguous" is a scheduler whose block size is ``max_model_len`` (2,048): each request then
holds one block of 2,048 slots from admission on, exactly a contiguous max-length reservation.

Each experiment takes the scheduler class it runs (``scheduler``; the course's own by
default), so that the notebook can run the learner's: ``probe`` plays a small scenario
(``PROBE``: it admits, rejects, preempts by recompute and by swap, and swaps back in) for
``course.notebook.learner_or_course_class`` to compare two classes on.
"""

from __future__ import annotations

import argparse
import time

from course.scheduler import Request, Scheduler, static_batching
from course.serving_sim import POOL_SLOTS, Report, opt13b_a100_40gb, poisson_arrivals, simulate
from course.workloads import SHAREGPT

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
    return {"static batching (contiguous)": run(rate, "static", scheduler=scheduler),
            "continuous batching, contiguous": run(rate, "contiguous", scheduler=scheduler),
            "continuous batching, paged (B=16)": run(rate, "paged", scheduler=scheduler)}


def rates(values: tuple[float, ...] = (0.5, 1, 1.5, 2, 3, 4, 6),
          scheduler: type[Scheduler] = Scheduler) -> dict[str, list[Report]]:
    return {kind: [run(r, kind, scheduler=scheduler) for r in values]
            for kind in ("contiguous", "paged")}


def preemption(block_sizes: tuple[int, ...] = (8, 16, 32, 64, 128, 256), rate: float = 4.0,
               scheduler: type[Scheduler] = Scheduler) -> dict[str, list[Report]]:
    return {mode: [run(rate, "paged", b, preemption=mode, scheduler=scheduler)
                   for b in block_sizes]
            for mode in ("recompute", "swap")}


def blocks(block_sizes: tuple[int, ...] = (8, 16, 32, 64, 128, 256), rate: float = 3.0,
           scheduler: type[Scheduler] = Scheduler) -> list[Report]:
    return [run(rate, "paged", b, scheduler=scheduler) for b in block_sizes]


def bench(scheduler: type[Scheduler] = Scheduler) -> str:
    """The simulator's own speed: 10,000 requests at 8 per second."""
    start = time.perf_counter()
    report = run(8.0, "paged", count=10_000, scheduler=scheduler)
    elapsed = time.perf_counter() - start
    return (f"simulated {report.completed:,} requests ({report.output_tokens:,} output tokens)"
            f" in {elapsed:.1f} s of wall time: {report.completed / elapsed:,.0f} simulated "
            "requests per second")


# A small scenario that takes every path of a step: 8 blocks of 2 for four requests, one of
# which can never fit (rejected); the other three outgrow the pool (preempted, then back:
# prefilled again, or swapped out and in, two of them swapped out at once).
PROBE = dict(specs=((4, 4), (6, 4), (6, 2), (6, 12)), num_blocks=8, block_size=2, cpu_blocks=8)


def plans(scheduler: type[Scheduler], specs: tuple[tuple[int, int], ...], num_blocks: int,
          block_size: int, cpu_blocks: int, max_steps: int = 500) -> dict[str, list[tuple]]:
    """What ``scheduler`` plans, step by step, when it serves requests ``specs``
    ((prompt_len, output_len), all there at the start) by recompute and by swap: per step,
    the ids it prefills, decodes, preempts, swaps out, swaps in and rejects."""
    found = {}
    for mode in ("recompute", "swap"):
        s = scheduler(num_blocks, block_size, preemption=mode, cpu_blocks=cpu_blocks)
        for i, (prompt, output) in enumerate(specs):
            s.add(Request(i, prompt, output))
        steps = found[mode] = []
        while (s.waiting or s.running or s.swapped) and len(steps) < max_steps:
            plan = s.step()
            steps.append(tuple(tuple(r.id for r in rs) for rs in (
                plan.prefill, plan.decode, plan.preempted, [r for r, _ in plan.swapped_out],
                [r for r, _ in plan.swapped_in], [r for r, _ in plan.rejected])))
            for request in plan.prefill + plan.decode:
                request.generated += 1
                if request.done:
                    s.finish(request)
    return found


def probe(scheduler: type[Scheduler]) -> dict[str, list[tuple]]:
    """What ``scheduler`` plans on ``PROBE``."""
    return plans(scheduler, **PROBE)


def row(name: str, report: Report) -> str:
    mean_tpot = sum(report.tpot) / len(report.tpot)
    return (f"{name:<36}{report.requests_per_s:>8.2f}{report.tokens_per_s:>9.0f}"
            f"{report.percentile(report.ttft, 50):>9.2f}{1000 * mean_tpot:>9.1f}"
            f"{report.percentile(report.latency, 50):>8.1f}"
            f"{report.percentile(report.latency, 99):>8.1f}"
            f"{report.preemptions:>7}{report.swaps:>6}")


HEADER = (f"{'':<36}{'req/s':>8}{'tok/s':>9}{'TTFT50':>9}{'TPOT ms':>9}{'P50 s':>8}"
          f"{'P99 s':>8}{'preem':>7}{'swaps':>6}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m course.serving_experiments")
    parser.add_argument("name", choices=["batching", "rates", "preemption", "timeline",
                                         "blocks", "bench"])
    name = parser.parse_args(argv).name
    if name == "batching":
        print(HEADER)
        for label, report in batching().items():
            print(row(label, report))
    elif name == "rates":
        print(HEADER)
        for kind, reports in rates().items():
            for rate, report in zip((0.5, 1, 1.5, 2, 3, 4, 6), reports, strict=True):
                print(row(f"{kind}, {rate} req/s", report))
    elif name == "preemption":
        print(HEADER)
        for mode, reports in preemption().items():
            for size, report in zip((8, 16, 32, 64, 128, 256), reports, strict=True):
                print(row(f"{mode}, block size {size}", report))
    elif name == "blocks":
        print(HEADER)
        for size, report in zip((8, 16, 32, 64, 128, 256), blocks(), strict=True):
            print(row(f"paged, block size {size}", report))
    elif name == "timeline":
        report = run(4.0, "paged")
        steps = report.timeline
        print(f"{len(steps.time)} steps, peak queue {max(steps.waiting)}, peak batch "
              f"{max(steps.running)}, preemptions {sum(steps.preemptions)}")
    else:
        print(bench())


if __name__ == "__main__":
    main()
