"""An event-driven serving simulator: requests arrive, a scheduler batches them, a cost model
says how long each step takes.

Cost model, stated for OPT-13B in fp16 on one A100 40 GB (the vLLM paper's Fig. 2 set-up; the
bandwidth and FLOP/s are NVIDIA's datasheet figures, the utilisation, PCIe rate and overhead
are this course's assumptions):

    prefill  = prefill tokens x 2 x parameters / (312 TFLOP/s x 0.5 utilisation)
    decode   = (weights + KV bytes of every decoding request's context) / 1.555 TB/s
    swap     = bytes moved / 25 GB/s (PCIe 4.0 x16, effective, one way)
               + 20 us per block copied (each block is its own small transfer)
    step     = 2 ms overhead + prefill + decode + swap

So a decode step reads the weights once and each request's whole KV cache: batching more
requests amortises the weights, which is why keeping more requests resident raises
throughput.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from course.experiments.models import MODELS
from course.experiments.workloads import LengthMix, sample_requests
from course.language import tr_later
from course.v0.scheduler import Request, Scheduler, StepPlan


@dataclass(frozen=True)
class CostModel:
    name: str
    params: float
    weight_bytes: float
    kv_bytes_per_token: float
    hbm_bytes_per_s: float = 1.555e12
    peak_flops: float = 312e12
    flops_utilisation: float = 0.5
    pcie_bytes_per_s: float = 25e9
    step_overhead_s: float = 0.002
    swap_block_overhead_s: float = 20e-6

    def step_time(self, plan: StepPlan, decode_context: int, swapped_tokens: int,
                  swapped_blocks: int = 0) -> float:
        prefill_tokens = sum(r.context_len for r in plan.prefill)
        prefill = prefill_tokens * 2 * self.params / (self.peak_flops * self.flops_utilisation)
        decode = 0.0
        if plan.decode:
            decode = (self.weight_bytes + decode_context * self.kv_bytes_per_token) \
                / self.hbm_bytes_per_s
        swap = swapped_tokens * self.kv_bytes_per_token / self.pcie_bytes_per_s \
            + swapped_blocks * self.swap_block_overhead_s
        return self.step_overhead_s + prefill + decode + swap


def opt13b_a100_40gb() -> CostModel:
    model = MODELS["OPT-13B"]
    return CostModel(tr_later("OPT-13B (fp16) on an A100 40 GB"), model.num_params,
                     model.weight_bytes(2), 2 * model.num_layers * model.num_kv_heads
                     * model.head_dim * 2)


POOL_SLOTS = 883 * 16  # chapter 2's pool: OPT-13B on a 40 GB A100, 883 blocks of 16


def poisson_arrivals(mix: LengthMix, count: int, rate: float, seed: int = 0,
                     max_model_len: int = 2048) -> list[Request]:
    """``count`` requests from ``mix`` arriving as a Poisson process of ``rate`` per second."""
    rng = random.Random(seed)
    now, requests = 0.0, []
    for index, lengths in enumerate(sample_requests(mix, count, seed, max_model_len)):
        now += rng.expovariate(rate)
        requests.append(Request(index, lengths.prompt_len, lengths.output_len, now))
    return requests


@dataclass
class Timeline:
    time: list[float] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    used_blocks: list[int] = field(default_factory=list)
    preemptions: list[int] = field(default_factory=list)


@dataclass
class Report:
    completed: int
    rejected: int
    duration_s: float
    output_tokens: int
    ttft: list[float]
    tpot: list[float]
    latency: list[float]
    preemptions: int
    swaps: int
    mean_kv_utilisation: float
    timeline: Timeline

    @property
    def requests_per_s(self) -> float:
        return self.completed / self.duration_s

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.duration_s

    def percentile(self, values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1)]


def simulate(requests: list[Request], make_scheduler: Callable[[], Scheduler],
             cost: CostModel) -> Report:
    """Serve ``requests`` (fresh copies are made) and measure what happened."""
    pending = sorted((Request(r.id, r.prompt_len, r.output_len, r.arrival) for r in requests),
                     key=lambda r: r.arrival)
    scheduler = make_scheduler()
    now, next_arrival = 0.0, 0
    first_token: dict[int, float] = {}
    finished: dict[int, float] = {}
    rejected = preemptions = swaps = output_tokens = 0
    utilisation_area = 0.0
    timeline = Timeline()
    by_id = {r.id: r for r in pending}
    while next_arrival < len(pending) or scheduler.waiting or scheduler.running \
            or scheduler.swapped:
        while next_arrival < len(pending) and pending[next_arrival].arrival <= now:
            scheduler.add(pending[next_arrival])
            next_arrival += 1
        if not (scheduler.waiting or scheduler.running or scheduler.swapped):
            now = pending[next_arrival].arrival  # idle until the next request arrives
            continue
        plan = scheduler.step()
        rejected += len(plan.rejected)
        preemptions += len(plan.preempted)
        swaps += len(plan.swapped_out) + len(plan.swapped_in)
        moved_blocks = sum(len(m) for _, m in plan.swapped_out + plan.swapped_in)
        decode_context = sum(r.context_len for r in plan.decode)
        dt = cost.step_time(plan, decode_context, moved_blocks * scheduler.block_size,
                            moved_blocks)
        now += dt
        for request in plan.prefill + plan.decode:
            request.generated += 1
            output_tokens += 1
            first_token.setdefault(request.id, now)
            if request.done:
                scheduler.finish(request)
                finished[request.id] = now
        used = scheduler.gpu.num_blocks - scheduler.gpu.num_free_blocks()
        tokens = sum(scheduler.gpu.seq_len(r.id) for r in scheduler.running)
        utilisation_area += dt * (tokens / (used * scheduler.block_size) if used else 0)
        timeline.time.append(now)
        timeline.waiting.append(len(scheduler.waiting))
        timeline.running.append(len(scheduler.running))
        timeline.used_blocks.append(used)
        timeline.preemptions.append(len(plan.preempted))
    done = [by_id[i] for i in finished]
    ttft = [first_token[r.id] - r.arrival for r in done]
    tpot = [(finished[r.id] - first_token[r.id]) / (r.output_len - 1) for r in done
            if r.output_len > 1]
    latency = [finished[r.id] - r.arrival for r in done]
    return Report(len(done), rejected, now, output_tokens, ttft, tpot, latency, preemptions,
                  swaps, utilisation_area / now if now else 0.0, timeline)
