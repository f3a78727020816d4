"""The chapter 5 experiments, each a function that returns its numbers (and a command line
that prints them): ``python -m course.serving_experiments NAME`` for NAME in batching, rates,
preemption, timeline, blocks, bench.

All run OPT-13B on an A100 40 GB (``course.serving_sim``'s cost model) with chapter 2's KV
pool of 14,128 token slots, on ShareGPT-like requests arriving as a Poisson process.
"Contiguous" is a scheduler whose block size is ``max_model_len`` (2,048): each request then
holds one block of 2,048 slots from admission on, exactly a contiguous max-length reservation.
"""

from __future__ import annotations

import argparse
import time

from course.scheduler import Scheduler, StaticBatchScheduler
from course.serving_sim import POOL_SLOTS, Report, opt13b_a100_40gb, poisson_arrivals, simulate
from course.workloads import SHAREGPT

MAX_MODEL_LEN = 2048
SWAP_SLOTS = 5242  # vLLM 0.8.5's default 4 GiB of swap space / 800 KiB per OPT-13B token


def run(rate: float, kind: str = "paged", block_size: int = 16, count: int = 600,
        preemption: str = "recompute", seed: int = 0) -> Report:
    """One simulated run: ``kind`` is "paged", "contiguous" or "static"."""
    requests = poisson_arrivals(SHAREGPT, count, rate, seed, MAX_MODEL_LEN)
    size = MAX_MODEL_LEN if kind in ("contiguous", "static") else block_size
    scheduler_class = StaticBatchScheduler if kind == "static" else Scheduler
    return simulate(requests, lambda: scheduler_class(
        POOL_SLOTS // size, size, preemption=preemption,
        cpu_blocks=SWAP_SLOTS // size if preemption == "swap" else 0), opt13b_a100_40gb())


def batching(rate: float = 2.0) -> dict[str, Report]:
    return {"static batching (contiguous)": run(rate, "static"),
            "continuous batching, contiguous": run(rate, "contiguous"),
            "continuous batching, paged (B=16)": run(rate, "paged")}


def rates(values: tuple[float, ...] = (0.5, 1, 1.5, 2, 3, 4, 6)) -> dict[str, list[Report]]:
    return {kind: [run(r, kind) for r in values] for kind in ("contiguous", "paged")}


def preemption(block_sizes: tuple[int, ...] = (8, 16, 32, 64, 128, 256), rate: float = 4.0
               ) -> dict[str, list[Report]]:
    return {mode: [run(rate, "paged", b, preemption=mode) for b in block_sizes]
            for mode in ("recompute", "swap")}


def blocks(block_sizes: tuple[int, ...] = (8, 16, 32, 64, 128, 256), rate: float = 3.0
           ) -> list[Report]:
    return [run(rate, "paged", b) for b in block_sizes]


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
        start = time.perf_counter()
        report = run(8.0, "paged", count=10_000)
        elapsed = time.perf_counter() - start
        print(f"simulated {report.completed:,} requests ({report.output_tokens:,} output tokens)"
              f" in {elapsed:.1f} s of wall time: {report.completed / elapsed:,.0f} simulated "
              "requests per second")


if __name__ == "__main__":
    main()
