"""Chapter 11: what separate prefill and decode engines cost and buy, timed with chapter 9's cost
model (``course.notebook.chunked_demo.step_time``: chapter 5's OPT-13B on an A100) on chapter 9's
mixed load (short chats with a long document now and then, ``latency_workload``).

Three setups, each engine a GPU with its own clock::

    one engine      prefill chunks and decodes share every step (chapter 9)
    two engines     the same engine twice, requests dealt out in turn (data parallel)
    prefill/decode  a prefill engine hands each prompt's KV to a decode engine over a link
                    (chapter 5's 25 GB/s); the decode engine's steps hold decodes only

The engines' scheduler and connector halves run as they do in the connector engine; the
workers move no KV, and a transfer takes the time its bytes need on the link. Two engines
step in the order of their clocks (the one behind goes first), so a request handed over at
time t is seen by the decode engine at its first step from t on. vLLM's documentation states
what to expect: disaggregation does not improve throughput; it lets time to first token and
time between tokens be tuned apart
(https://docs.vllm.ai/en/latest/features/disagg_prefill.html).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from course.experiments.serving_sim import CostModel, opt13b_a100_40gb
from course.language import tr, tr_later
from course.notebook.chunked_demo import latency_workload, percentile, step_time
from course.v1.chunked_scheduler import ChunkedRequest, ChunkedScheduler, schedule_step
from course.v1.connector_engine import (
    ConnectorScheduler,
    admit_with_connector,
    connector_round,
    connector_schedule_step,
)
from course.v1.disaggregated import (
    DecodeConnectorScheduler,
    DecodeConnectorWorker,
    HandoffRequest,
    KVHandoff,
    PrefillConnectorScheduler,
    PrefillConnectorWorker,
)


class TimedLoads:
    """Loads in flight that land when ``clock()`` reaches their start plus ``seconds(job)``
    (the interface of ``LoadsInFlight``, in time instead of steps)."""

    def __init__(self, clock: Callable[[], float], seconds: Callable[[Any], float]) -> None:
        self.clock, self.seconds = clock, seconds
        self.jobs: dict[int, tuple[Any, float]] = {}

    def start(self, request_id: int, job: Any) -> None:
        self.jobs[request_id] = (job, self.clock() + self.seconds(job))

    def advance(self) -> list[tuple[int, Any]]:
        landed = [(r, job) for r, (job, at) in self.jobs.items() if at <= self.clock()]
        for request_id, _ in landed:
            del self.jobs[request_id]
        return landed


class DryDecodeWorker(DecodeConnectorWorker):
    """The decode worker's bookkeeping without pools: a read moves no data, a failed one
    leaves nothing to spoil; a block counts ``block_bytes``."""

    def __init__(self, handoff: KVHandoff, load_steps: int = 1, block_bytes: int = 0) -> None:
        super().__init__(handoff, load_steps)
        self.block_bytes = block_bytes

    def load(self, pairs: list[tuple[int, int]]) -> None:
        pass

    def fail(self, pairs: list[tuple[int, int]]) -> None:
        pass


@dataclass
class Engine:
    """One GPU: a scheduler (and a connector's worker, if any) on its own clock."""

    scheduler: ChunkedScheduler
    cost: CostModel
    worker: Any = None
    clock: float = 0.0
    inbox: list[tuple[float, ChunkedRequest]] = field(default_factory=list)  # time-ordered
    admit: Callable = admit_with_connector  # with a worker: admission with its connector

    def next_event(self) -> float:
        if self.scheduler.busy():
            return self.clock
        return self.inbox[0][0] if self.inbox else math.inf

    def step(self) -> list[tuple[ChunkedRequest, bool]]:
        """Admit what has arrived, run a step, advance the clock; (request, finished) for each
        token emitted (the token is a placeholder: no model runs)."""
        self.clock = max(self.clock, self.next_event())
        while self.inbox and self.inbox[0][0] <= self.clock:
            self.scheduler.add(self.inbox.pop(0)[1])
        if self.worker is None:
            plan = self.scheduler.step(schedule_step)
        else:
            plan = self.scheduler.step(lambda s: connector_schedule_step(s, admit=self.admit))
            connector_round(self.scheduler, self.worker, plan, lambda: None)
        self.clock += step_time(self.cost, plan.chunks)
        emitted = []
        for chunk in plan.chunks:
            request = chunk.request
            if chunk.end == request.num_tokens:
                request.emit(0)
                emitted.append((request, request.done))
                if request.done:
                    self.scheduler.finish(request)
        return emitted


@dataclass
class LatencyReport:
    """Time to first token and between tokens (P50, P99, in seconds), output tokens per
    second over the whole run, GPUs used, and bytes moved between engines per request."""

    setup: str
    ttft_p50: float
    ttft_p99: float
    tbt_p50: float
    tbt_p99: float
    throughput: float
    gpus: int
    output_tokens: int
    bytes_per_request: float = 0.0


def _requests(seed: int) -> list[tuple[float, ChunkedRequest]]:
    rng = random.Random(seed)
    return [(arrival, ChunkedRequest(i, [rng.randrange(32000) for _ in range(prompt)], output))
            for i, (arrival, prompt, output) in enumerate(latency_workload(seed=seed))]


def _run(engines: list[Engine], decoders: set[int], handoff: Callable | None = None
         ) -> tuple[dict[int, list[float]], float]:
    """Step the engines in clock order until all are idle; each token's time, for requests on
    the engines in ``decoders``; ``handoff(request, time)`` takes a request that finished on
    another engine."""
    times: dict[int, list[float]] = {}
    while True:
        engine = min(engines, key=Engine.next_event)
        if engine.next_event() == math.inf:
            return times, max(e.clock for e in engines)
        index = engines.index(engine)
        for request, finished in engine.step():
            if index in decoders:
                times.setdefault(request.id, []).append(engine.clock)
            elif finished and handoff is not None:
                handoff(request, engine.clock)


def _report(setup: str, arrivals: dict[int, float], times: dict[int, list[float]],
            end: float, gpus: int, bytes_per_request: float = 0.0) -> LatencyReport:
    ttft = [t[0] - arrivals[r] for r, t in times.items()]
    tbt = [b - a for t in times.values() for a, b in zip(t, t[1:], strict=False)]
    tokens = sum(len(t) for t in times.values())
    return LatencyReport(setup, percentile(ttft, 50), percentile(ttft, 99), percentile(tbt, 50),
                         percentile(tbt, 99), tokens / end, gpus, tokens, bytes_per_request)


def one_or_two_engines(count: int, budget: int, num_blocks: int = 2000, block_size: int = 16,
                       seed: int = 0, cost: CostModel | None = None) -> LatencyReport:
    """``count`` engines (1 or 2), requests dealt out in turn."""
    cost = cost or opt13b_a100_40gb()
    engines = [Engine(ChunkedScheduler(num_blocks, block_size, budget, 256), cost)
               for _ in range(count)]
    arrivals = {}
    for arrival, request in _requests(seed):
        engines[request.id % count].inbox.append((arrival, request))
        arrivals[request.id] = arrival
    times, end = _run(engines, set(range(count)))
    name = tr_later("one engine") if count == 1 else tr_later(f"{count} engines")
    return _report(name, arrivals, times, end, count)


def prefill_decode_pair(budget: int, num_blocks: int = 2000, block_size: int = 16,
                        seed: int = 0, cost: CostModel | None = None,
                        link_bytes_per_s: float | None = None,
                        admit: Callable = admit_with_connector) -> LatencyReport:
    """A prefill engine and a decode engine joined by a link of ``link_bytes_per_s`` (by
    default the cost model's PCIe figure), each admitting with ``admit``."""
    cost = cost or opt13b_a100_40gb()
    link = link_bytes_per_s or cost.pcie_bytes_per_s
    handoff = KVHandoff()
    prefill = Engine(ConnectorScheduler(num_blocks, block_size, budget,
                                        PrefillConnectorScheduler(block_size), 256), cost,
                     PrefillConnectorWorker(handoff, lease_steps=10**9), admit=admit)
    decode = Engine(ConnectorScheduler(num_blocks, block_size, budget,
                                       DecodeConnectorScheduler(block_size), 256), cost,
                    admit=admit)
    block_bytes = block_size * cost.kv_bytes_per_token
    decode.worker = DryDecodeWorker(handoff, block_bytes=block_bytes)
    decode.worker.in_flight = TimedLoads(
        lambda: decode.clock, lambda job: len(job[1]) * (block_bytes / link +
                                                        cost.swap_block_overhead_s))
    arrivals, originals = {}, {}
    for arrival, request in _requests(seed):
        prefill.inbox.append((arrival, ChunkedRequest(request.id, request.prompt, 1)))
        arrivals[request.id], originals[request.id] = arrival, request

    def hand_over(request: ChunkedRequest, time: float) -> None:
        original = originals[request.id]
        params = prefill.scheduler.transfer_params.pop(request.id)
        decode.inbox.append((time, HandoffRequest(request.id, original.prompt,
                                                  original.output_len,
                                                  kv_transfer_params=params)))
        decode.inbox.sort(key=lambda item: item[0])

    times, end = _run([prefill, decode], {1}, hand_over)
    return _report(tr_later("prefill/decode"), arrivals, times, end, 2,
                   decode.worker.bytes_loaded / len(arrivals))


def latency_chart(reports: list[LatencyReport]):
    """Time to first token (left) and between tokens (right), P50 and P99, for each setup, in
    milliseconds: two panels, each on its own scale, since the first is up to ten times the
    second and on one axis the time between tokens would be a sliver."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from course.notebook.charts import localized

    figure = make_subplots(rows=1, cols=2, subplot_titles=(
        tr_later("time to first token"), tr_later("time between tokens")))
    for column, pairs in enumerate((
            ((tr_later("time to first token, P50"), lambda r: r.ttft_p50),
             (tr_later("time to first token, P99"), lambda r: r.ttft_p99)),
            ((tr_later("time between tokens, P50"), lambda r: r.tbt_p50),
             (tr_later("time between tokens, P99"), lambda r: r.tbt_p99))), start=1):
        for name, value in pairs:
            figure.add_trace(go.Bar(x=[tr(r.setup) for r in reports],
                                    y=[1000 * value(r) for r in reports], name=name),
                             row=1, col=column)
        figure.update_yaxes(title_text="milliseconds", row=1, col=column)
    figure.update_layout(title="One engine, two engines, a prefill/decode pair",
                         barmode="group", template="plotly_white", height=420)
    return localized(figure)


def main(budget: int = 512) -> None:
    """The three setups on chapter 9's mixed load."""
    print(f"OPT-13B on A100s, token budget {budget}; seconds; output tokens per second")
    for report in (one_or_two_engines(1, budget), one_or_two_engines(2, budget),
                   prefill_decode_pair(budget)):
        print(f"{report.setup:15} GPUs {report.gpus}  TTFT P50 {report.ttft_p50:.3f} "
              f"P99 {report.ttft_p99:.3f}  TBT P50 {report.tbt_p50:.4f} P99 "
              f"{report.tbt_p99:.4f}  {report.throughput:.0f} tok/s  "
              f"{report.bytes_per_request / 1e6:.0f} MB moved per request")


if __name__ == "__main__":
    main()
