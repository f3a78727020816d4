"""Chapter 14: a fleet of engines behind a router, simulated in one process:
``python -m course.experiments.fleet_sim``.

What runs is the chapter's own code, end to end; only the model and the sockets are left out:

* each engine is chapter 9's ``ChunkedScheduler`` over chapter 14's ``FleetKVCacheCoordinator``
  (the fleet's block hash, a tenant's ``cache_salt``, KV events);
* after each step an engine takes its events (``take_events``) and, when there are some,
  encodes them as the next ``KVEventBatch`` of its sequence with msgspec
  (``course.v1.kv_events.ENCODER``), the bytes a ZMQ publisher would send;
* the router decodes each batch (``DECODER``) and applies it to its ``KVIndexer``, either when
  the step ends or ``event_delay_s`` seconds of simulated time later (a slow link, a router
  behind on its queue: it routes on a stale view meanwhile). The delay is in seconds, not in
  steps: an idle engine takes no steps, and its last batches must still arrive;
* the router (``course.v1.kv_router.Router``: round robin, least loaded, or Dynamo's cost with
  ``overlap_score_weight``) picks each request's engine when it arrives.

No model runs: an engine emits the workload's own output tokens, one per decode, so a
multi-turn conversation's next prompt holds exactly what the engine cached.

**Time is a model, not a measurement.** A step costs what chapter 9's cost model says
(``course.notebook.chunked_demo.step_time``, over chapter 5's OPT-13B in fp16 on an A100
40 GB, ``serving_sim.opt13b_a100_40gb``)::

    step = 2 ms
         + 0.17 ms x tokens scheduled       2 x 13e9 FLOPs a token at half of 312 TFLOP/s
         + (26 GB of weights + the decodes' KV, 0.82 MB a token of context) / 1.555 TB/s,
           when the step decodes            about 17 ms, plus 0.5 us a token of context

Each engine is one GPU with its own clock on a shared time axis, as in chapter 11's
``disagg_sim``: the simulation always takes what happens first (an event batch reaching the
router, a request arriving and being routed, an engine's next step), and a request routed at
time ``t`` is admitted at its engine's first step from ``t`` on. Requests arrive by a Poisson
process (seeded); a multi-turn conversation's next turn arrives ``think_s`` after its
previous turn's last token. Each engine's pool is chapter 2's: 883 blocks of 16 tokens, what
OPT-13B leaves of a 40 GB A100; its steps hold at most 512 tokens and 32 requests.

**One figure is measured**: how many KV events a second the router's indexer applies
(``time_indexer``: the run's batches applied again to a fresh ``KVIndexer``, timed by the wall
clock of the machine that runs it, in CPython, the best of five); it differs from run to run
and machine to machine. Everything else is a deterministic function of the seed.

Per run: the fleet's prefix hit rate (prompt tokens found in an engine's cache at admission /
prompt tokens), time to first token (mean and P90), each engine's requests and tokens
computed, and the imbalance, the most tokens any engine computed over the mean.
"""

from __future__ import annotations

import gc
import heapq
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from course.experiments.prefix_sim import _length, _tokens, chat, few_shot, multi_turn
from course.experiments.serving_sim import CostModel, opt13b_a100_40gb
from course.language import aligned, tr, tr_later
from course.notebook.chunked_demo import percentile, step_time
from course.v1.block_hash import FLEET_SEED, none_hash
from course.v1.chunked_scheduler import ChunkedRequest, ChunkedScheduler, schedule_step
from course.v1.fleet_cache import FleetKVCacheCoordinator
from course.v1.fleet_parts import FleetParts
from course.v1.kv_events import DECODER, ENCODER, KVEventBatch
from course.v1.kv_indexer import KVIndexer
from course.v1.kv_router import POLICIES, Router

if TYPE_CHECKING:
    import plotly.graph_objects as go

BLOCK_SIZE = 16
NUM_BLOCKS = 883 + 1  # chapter 2's pool of 883 blocks of 16 (OPT-13B, A100 40 GB), + the null
POLICY_NAMES = {"round_robin": tr_later("round robin"), "least_loaded": tr_later("least loaded"),
                "kv": tr_later("KV-aware")}


# --- workloads ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetRequest:
    """One request: its prompt and the tokens it will generate, its ``tenant`` (``None``: no
    tenant), when it arrives (seconds), and the request it follows (its index), if any: then
    ``arrival`` counts from that one's last token."""

    prompt: list[int]
    output: list[int]
    tenant: str | None = None
    after: int | None = None
    arrival: float = 0.0


def multi_tenant(count: int, tenants: int = 16, public_prompt: int = 384,
                 tenant_prompt: int = 384, public_tenants: int = 8, mean_user: float = 60,
                 mean_output: float = 100, skew: float = 1.0,
                 seed: int = 0) -> list[FleetRequest]:
    """``count`` requests from ``tenants`` tenants (``tenant-00``, ...), each with its own
    ``tenant_prompt``-token system prompt; the first ``public_tenants`` put a shared
    ``public_prompt``-token prompt (a public tool description, say) before theirs. A request
    is a tenant's prompts, then its own user message (log-normal, mean ``mean_user``); tenants
    are drawn by a Zipf law of exponent ``skew`` (tenant-00 the busiest). The shapes are this
    course's assumptions."""
    rng = random.Random(seed)
    public = _tokens(rng, public_prompt)
    prompts = [(public if t < public_tenants else []) + _tokens(rng, tenant_prompt)
               for t in range(tenants)]
    weights = [1 / (t + 1) ** skew for t in range(tenants)]
    requests = []
    for _ in range(count):
        tenant = rng.choices(range(tenants), weights)[0]
        requests.append(FleetRequest(prompts[tenant] + _tokens(rng, _length(rng, mean_user)),
                                     _tokens(rng, _length(rng, mean_output)),
                                     f"tenant-{tenant:02d}"))
    return requests


def _from_prefix_sim(requests: list) -> list[FleetRequest]:
    return [FleetRequest(r.prompt, r.output, after=r.after) for r in requests]


# name -> requests(count, seed): chapter 4's three mixes (``course.experiments.prefix_sim``) and
# the multi-tenant one. Chat's and multi-turn's answers are shorter than chapter 4's, to keep
# the sweeps quick; few-shot has 16 tasks of 8 examples, whose prefixes together (about 13,000
# tokens) fill about one engine's pool (14,128 tokens): one engine cannot keep them all, a
# fleet can. Multi-turn's ``count`` is rounded down to whole conversations of 4 turns.
WORKLOADS: dict[str, Callable[[int, int], list[FleetRequest]]] = {
    tr_later("chat"): lambda count, seed: _from_prefix_sim(
        chat(count, mean_output=40, seed=seed)),
    tr_later("few-shot"): lambda count, seed: _from_prefix_sim(
        few_shot(count, tasks=16, examples=8, mean_example=100, seed=seed)),
    tr_later("multi-turn"): lambda count, seed: _from_prefix_sim(
        multi_turn(max(1, count // 4), mean_output=60, seed=seed)),
    tr_later("multi-tenant"): lambda count, seed: multi_tenant(count, seed=seed),
}


def with_arrivals(requests: list[FleetRequest], rate: float, seed: int = 0,
                  think_s: float = 1.0) -> list[FleetRequest]:
    """``requests`` with arrival times: those that follow no request arrive as a Poisson
    process of ``rate`` a second, in order; a follow-up turn ``think_s`` after its previous
    turn's last token."""
    rng = random.Random(seed)
    now, timed = 0.0, []
    for request in requests:
        if request.after is None:
            now += rng.expovariate(rate)
            timed.append(replace(request, arrival=now))
        else:
            timed.append(replace(request, arrival=think_s))
    return timed


# --- the fleet ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetConfig:
    """One fleet: ``num_engines`` engines of ``num_blocks`` blocks of ``block_size`` tokens,
    each stepping at most ``max_num_batched_tokens`` tokens and ``max_num_seqs`` requests; the
    router's ``policy`` and ``overlap_score_weight``; event batches reach the router
    ``event_delay_s`` after their step ends; with ``salt``, each tenant's requests carry its
    name as ``cache_salt``."""

    num_engines: int = 4
    policy: str = "kv"
    overlap_score_weight: float = 1.0
    num_blocks: int = NUM_BLOCKS
    block_size: int = BLOCK_SIZE
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 32
    event_delay_s: float = 0.0
    salt: bool = False


@dataclass(frozen=True)
class FleetReport:
    """What one run measured. Every figure is simulated (deterministic) except
    ``apply_seconds``, the indexer's measured wall-clock time."""

    workload: str
    policy: str
    engines: int
    weight: float
    salt: bool
    event_delay_s: float
    requests: int
    prompt_tokens: int
    hit_tokens: int
    ttft_mean: float
    ttft_p90: float
    requests_per_engine: tuple[int, ...]
    tokens_per_engine: tuple[int, ...]
    preemptions: int
    makespan: float
    events_applied: int
    apply_seconds: float  # measured on this machine

    @property
    def hit_rate(self) -> float:
        """Prompt tokens found in the cache of the engine each request went to / prompt
        tokens."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def imbalance(self) -> float:
        """The most tokens an engine computed over the mean (1: perfectly even)."""
        mean = statistics.fmean(self.tokens_per_engine)
        return max(self.tokens_per_engine) / mean if mean else 1.0

    @property
    def events_per_s(self) -> float:
        """KV events the indexer applied a second of its own time (measured)."""
        return self.events_applied / self.apply_seconds if self.apply_seconds else 0.0

    def simulated(self) -> FleetReport:
        """This report without its one measured figure: what the seed alone decides."""
        return replace(self, apply_seconds=0.0)


@dataclass
class FleetRun:
    """A run's report and what a test or a picture looks into: the requests served, the
    router (its index), each engine's KV cache, the engine each request went to, the block
    hashes of each request's prompt as the router computed them, each request's prefix hit
    (tokens) and time to first token (seconds)."""

    report: FleetReport
    requests: list[FleetRequest]
    router: Router
    caches: list[FleetKVCacheCoordinator]
    assignments: list[int]
    hashes: list[list[bytes]]
    hits: list[int]
    ttfts: list[float]


@dataclass
class _Engine:
    scheduler: ChunkedScheduler
    clock: float = 0.0
    next_seq: int = 0
    requests: int = 0
    tokens: int = 0


def simulate(requests: Sequence[FleetRequest], config: FleetConfig = FleetConfig(),
             cost: CostModel | None = None, workload: str = "",
             parts: FleetParts | None = None) -> FleetRun:
    """Serve ``requests`` (with their arrivals, ``with_arrivals``) on the fleet ``config``
    describes, timed by ``cost`` (chapter 5's OPT-13B on an A100 unless told otherwise),
    with the chapter's answers in ``parts`` (the course's unless given); ``workload`` names
    them in the report."""
    cost = cost or opt13b_a100_40gb()
    parts = parts or FleetParts()
    size = config.block_size
    caches = [FleetKVCacheCoordinator(config.num_blocks, size, hasher=parts.request_block_hashes)
              for _ in range(config.num_engines)]
    engines = [_Engine(ChunkedScheduler(config.num_blocks, size, config.max_num_batched_tokens,
                                        config.max_num_seqs, kv_cache=cache)) for cache in caches]
    router = Router(config.num_engines, size, config.policy, config.overlap_score_weight,
                    index=parts.indexer(), choose=parts.choose_engine)
    first_parent = none_hash(FLEET_SEED)
    count = len(requests)
    salts = [r.tenant if config.salt else None for r in requests]
    hashes = [parts.request_block_hashes(r.prompt, size, first_parent, cache_salt=salt)
              for r, salt in zip(requests, salts, strict=True)]
    followers: dict[int, list[int]] = {}
    arrivals: list[tuple[float, int]] = []
    for index, request in enumerate(requests):
        if request.after is None:
            arrivals.append((request.arrival, index))
        else:
            followers.setdefault(request.after, []).append(index)
    heapq.heapify(arrivals)
    arrived = [0.0] * count
    assignments, hits = [-1] * count, [-1] * count
    ttfts = [math.nan] * count
    deliveries: list[tuple[float, int, int, int, bytes]] = []
    batches: list[tuple[int, int, KVEventBatch]] = []  # as the router applied them
    published = preemptions = 0

    while True:
        busy = [e for e in engines if e.scheduler.busy()]
        next_step = min(busy, key=lambda e: e.clock) if busy else None
        times = (deliveries[0][0] if deliveries else math.inf,
                 arrivals[0][0] if arrivals else math.inf,
                 next_step.clock if next_step else math.inf)
        now = min(times)
        if now == math.inf:
            break
        if times[0] == now:  # an event batch reaches the router
            _, _, engine, seq, payload = heapq.heappop(deliveries)
            batch = DECODER.decode(payload)
            missing = router.index.apply_batch(engine, seq, batch)
            assert missing is None, "an engine's batches reach the router in order"
            batches.append((engine, seq, batch))
        elif times[1] == now:  # a request arrives and is routed
            _, index = heapq.heappop(arrivals)
            request = requests[index]
            target = router.route(hashes[index], len(request.prompt))
            engine = engines[target]
            assignments[index], arrived[index] = target, now
            engine.scheduler.add(ChunkedRequest(index, list(request.prompt),
                                                len(request.output), cache_salt=salts[index]))
            engine.clock = max(engine.clock, now)
            engine.requests += 1
        else:  # an engine runs a step
            engine = next_step
            target = engines.index(engine)
            plan = engine.scheduler.step(schedule_step)
            if not plan.chunks:
                raise RuntimeError(f"engine {target} is busy but scheduled nothing")
            preemptions += len(plan.preempted)
            engine.clock += step_time(cost, plan.chunks)
            engine.tokens += plan.total_num_scheduled_tokens
            for chunk in plan.chunks:
                chunked, index = chunk.request, chunk.request.id
                if hits[index] < 0:  # admitted this step: its chunk starts at its hit
                    hits[index] = chunk.start
                if chunk.end < chunked.num_tokens:
                    continue
                chunked.emit(requests[index].output[len(chunked.output)])
                if len(chunked.output) == 1:
                    ttfts[index] = engine.clock - arrived[index]
                if chunked.done:
                    engine.scheduler.finish(chunked)
                    router.finish(target, len(chunked.prompt))
                    for follower in followers.get(index, []):
                        heapq.heappush(arrivals,
                                       (engine.clock + requests[follower].arrival, follower))
            events = engine.scheduler.kv_cache.take_events()
            if events:
                payload = ENCODER.encode(KVEventBatch(ts=engine.clock, events=events))
                heapq.heappush(deliveries, (engine.clock + config.event_delay_s, published,
                                            target, engine.next_seq, payload))
                engine.next_seq += 1
                published += 1

    applied, apply_seconds = time_indexer(batches, parts.indexer)
    prompt_tokens = sum(len(r.prompt) for r in requests)
    served = [t for t in ttfts if not math.isnan(t)]
    report = FleetReport(
        workload, config.policy, config.num_engines, config.overlap_score_weight, config.salt,
        config.event_delay_s, count, prompt_tokens, sum(hits),
        statistics.fmean(served) if served else math.nan, percentile(served, 90),
        tuple(e.requests for e in engines), tuple(e.tokens for e in engines), preemptions,
        max(e.clock for e in engines), applied, apply_seconds)
    return FleetRun(report, list(requests), router, caches, assignments, hashes, hits, ttfts)


def time_indexer(batches: list[tuple[int, int, KVEventBatch]], indexer: type = KVIndexer,
                 repeats: int = 5) -> tuple[int, float]:
    """The events in ``batches`` (engine, sequence number, batch: a run's, in the order the
    router applied them) and the wall-clock seconds a fresh ``KVIndexer`` takes to apply them
    all, one ``apply_batch`` after another: the best of ``repeats`` tries, with the garbage
    collector paused (a pause it makes would time the collector, not the index). Measured,
    so it differs from run to run and machine to machine."""
    best, events = math.inf, 0
    collecting = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            index = indexer()
            start = time.perf_counter()
            for engine, seq, batch in batches:
                index.apply_batch(engine, seq, batch)
            best = min(best, time.perf_counter() - start)
            events = index.events_applied
    finally:
        if collecting:
            gc.enable()
    return events, best


# --- the experiments ----------------------------------------------------------------------------


def run_fleet(workload: str = "multi-tenant", config: FleetConfig = FleetConfig(),
              requests_per_engine: int = 25, rate_per_engine: float = 4.0, seed: int = 0,
              cost: CostModel | None = None, parts: FleetParts | None = None) -> FleetRun:
    """One configuration on one of ``WORKLOADS``: ``requests_per_engine`` x engines requests
    arriving at ``rate_per_engine`` x engines a second (the load on each engine stays the same
    as the fleet grows), drawn and timed from ``seed``, run with ``parts``."""
    count = requests_per_engine * config.num_engines
    requests = with_arrivals(WORKLOADS[workload](count, seed),
                             rate_per_engine * config.num_engines, seed)
    return simulate(requests, config, cost, workload, parts)


def policy_sweep(workload: str = "few-shot", policies: Sequence[str] = POLICIES,
                 engine_counts: Sequence[int] = (2, 4, 8), requests_per_engine: int = 25,
                 rate_per_engine: float = 4.0, seed: int = 0, parts: FleetParts | None = None,
                 **fleet: Any) -> list[FleetReport]:
    """``run_fleet`` for each policy and fleet size, policy by policy; ``fleet``: the other
    ``FleetConfig`` fields (``overlap_score_weight``, ``event_delay_s`` ...)."""
    return [run_fleet(workload, FleetConfig(num_engines=n, policy=policy, **fleet),
                      requests_per_engine, rate_per_engine, seed, parts=parts).report
            for policy in policies for n in engine_counts]


def weight_sweep(weights: Sequence[float] = (0, 0.5, 1, 2, 4, 8, 16, 64),
                 workload: str = "multi-tenant", num_engines: int = 4,
                 requests_per_engine: int = 25, rate_per_engine: float = 4.0, seed: int = 0,
                 parts: FleetParts | None = None, **fleet: Any) -> list[FleetReport]:
    """KV-aware routing at each ``overlap_score_weight``: 0 routes as least loaded does, a
    large weight follows the cache wherever it is, however busy that engine."""
    return [run_fleet(workload, FleetConfig(num_engines=num_engines, policy="kv",
                                            overlap_score_weight=w, **fleet),
                      requests_per_engine, rate_per_engine, seed, parts=parts).report
            for w in weights]


def delay_sweep(delays_s: Sequence[float] = (0.0, 0.5, 2.0, 5.0), workload: str = "few-shot",
                num_engines: int = 4, requests_per_engine: int = 25,
                rate_per_engine: float = 4.0, seed: int = 0, parts: FleetParts | None = None,
                **fleet: Any) -> list[FleetReport]:
    """KV-aware routing on an index that learns of each step's events ``event_delay_s`` after
    the step: meanwhile requests for a prefix no engine has reported yet are routed as if no
    engine held it."""
    return [run_fleet(workload, FleetConfig(num_engines=num_engines, policy="kv",
                                            event_delay_s=d, **fleet),
                      requests_per_engine, rate_per_engine, seed, parts=parts).report
            for d in delays_s]


@dataclass(frozen=True)
class SideChannel:
    """Tenant B's time to first token (seconds) for a guessed prefix over ``trials`` trials:
    ``sent`` where tenant A had sent that prefix shortly before, ``not_sent`` where A had sent
    another prompt of the same length instead (the same load: only the cache differs)."""

    salt: bool
    sent: tuple[float, ...]
    not_sent: tuple[float, ...]

    @property
    def gap(self) -> float:
        """Mean TTFT when A had not sent the prefix minus when it had."""
        return statistics.fmean(self.not_sent) - statistics.fmean(self.sent)

    @property
    def attacker_accuracy(self) -> float:
        """How often B guesses right whether A sent the prefix, calling "sent" every TTFT
        below the midpoint of the two populations' means (0.5: a coin)."""
        threshold = (statistics.fmean(self.sent) + statistics.fmean(self.not_sent)) / 2
        right = sum(t < threshold for t in self.sent) + sum(t >= threshold
                                                           for t in self.not_sent)
        return right / (len(self.sent) + len(self.not_sent))


def _side_channel_trial(trial: int, sent: bool, salt: bool, secret_len: int, suffix_len: int,
                        background: int, cost: CostModel | None,
                        parts: FleetParts | None) -> float:
    rng = random.Random(trial)
    secret = _tokens(rng, secret_len)
    decoy = _tokens(rng, secret_len)
    noise = [FleetRequest(_tokens(rng, _length(rng, 200)), _tokens(rng, _length(rng, 40)),
                          "tenant-C", arrival=rng.uniform(0.0, 1.5)) for _ in range(background)]
    victim = FleetRequest(secret if sent else decoy, _tokens(rng, 8), "tenant-A", arrival=0.0)
    probe = FleetRequest(secret + _tokens(rng, suffix_len), _tokens(rng, 1), "tenant-B",
                         arrival=0.5 + rng.uniform(0.0, 0.5))
    run = simulate([victim, probe, *noise], FleetConfig(num_engines=1, salt=salt), cost,
                   parts=parts)
    return run.ttfts[1]


def side_channel(salt: bool, trials: int = 40, secret_len: int = 1024, suffix_len: int = 32,
                 background: int = 6, cost: CostModel | None = None,
                 parts: FleetParts | None = None) -> SideChannel:
    """The timing side channel of a shared prefix cache, on one engine: tenant A sends a
    ``secret_len``-token prompt (or, in the other world, a decoy of the same length); half a
    second to a second later tenant B sends its guess of A's prompt plus ``suffix_len`` tokens
    of its own. Tenant C's ``background`` requests arrive at random meanwhile (seeded by the
    trial), so no two trials time alike. Without ``salt``, B's guess hits A's blocks when A
    sent it; with it, B's blocks hash apart from A's and its TTFT is the same in both worlds,
    trial by trial."""
    args = (secret_len, suffix_len, background, cost, parts)
    return SideChannel(salt,
                       tuple(_side_channel_trial(t, True, salt, *args) for t in range(trials)),
                       tuple(_side_channel_trial(t, False, salt, *args) for t in range(trials)))


# --- charts -------------------------------------------------------------------------------------


def policy_chart(rows: list[FleetReport]) -> go.Figure:
    """Fleet hit rate (left) and time to first token, mean and P90 (right), against the number
    of engines, a line per policy (``policy_sweep``'s rows)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from course.notebook.charts import localized

    figure = make_subplots(rows=1, cols=2, subplot_titles=(
        tr_later("fleet prefix hit rate"), tr_later("time to first token")))
    colours = dict(zip(POLICIES, ("#e76f51", "#e9c46a", "#2a9d8f"), strict=True))
    for policy in dict.fromkeys(r.policy for r in rows):
        mine = [r for r in rows if r.policy == policy]
        label, engines = POLICY_NAMES[policy], [r.engines for r in mine]
        figure.add_trace(go.Scatter(x=engines, y=[100 * r.hit_rate for r in mine],
                                    mode="lines+markers", name=label, legendgroup=policy,
                                    line=dict(color=colours.get(policy))), row=1, col=1)
        figure.add_trace(go.Scatter(x=engines, y=[1000 * r.ttft_mean for r in mine],
                                    mode="lines+markers", name=label, legendgroup=policy,
                                    showlegend=False, line=dict(color=colours.get(policy))),
                         row=1, col=2)
        figure.add_trace(go.Scatter(x=engines, y=[1000 * r.ttft_p90 for r in mine],
                                    mode="lines+markers", name=f"{label}, P90",
                                    legendgroup=policy, showlegend=False,
                                    line=dict(color=colours.get(policy), dash="dot")),
                         row=1, col=2)
    figure.update_xaxes(title_text="engines", type="log", tickvals=sorted({r.engines
                                                                           for r in rows}))
    figure.update_yaxes(title_text="prompt tokens found in cache (%)", row=1, col=1)
    figure.update_yaxes(title_text="milliseconds (solid: mean, dotted: P90)", row=1, col=2)
    figure.update_layout(title="Routing policies by fleet size",
                         template="plotly_white", height=420)
    return localized(figure)


def weight_chart(rows: list[FleetReport]) -> go.Figure:
    """The overlap score weight's trade-off (``weight_sweep``'s rows): each weight a point of
    imbalance (x) against hit rate (y), labelled with the weight; its mean time to first token
    in the hover and as the marker's colour."""
    import plotly.graph_objects as go

    from course.notebook.charts import localized

    figure = go.Figure(go.Scatter(
        x=[r.imbalance for r in rows], y=[100 * r.hit_rate for r in rows],
        mode="lines+markers+text", text=[f"{r.weight:g}" for r in rows],
        textposition="top center", name="overlap score weight",
        marker=dict(size=14, color=[1000 * r.ttft_mean for r in rows], colorscale="Viridis",
                    showscale=True, colorbar=dict(title=tr("TTFT, mean (ms)"))),
        customdata=[[r.weight, 1000 * r.ttft_mean, 1000 * r.ttft_p90] for r in rows],
        hovertemplate=tr("weight %{customdata[0]}: hit rate %{y:.1f}%, imbalance %{x:.2f}, "
                         "TTFT mean %{customdata[1]:.0f} ms, P90 %{customdata[2]:.0f} ms")
        + "<extra></extra>"))
    figure.update_layout(title="Following the cache against spreading the load",
                         xaxis_title="imbalance (most tokens an engine computed / mean)",
                         yaxis_title="fleet prefix hit rate (%)", template="plotly_white",
                         height=440)
    return localized(figure)


def side_channel_chart(results: list[SideChannel]) -> go.Figure:
    """Tenant B's time to first token in each trial, with and without tenant A's prefix sent
    before, a panel per setting (no salt, a salt per tenant): strip plots, one point a trial."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from course.notebook.charts import localized

    figure = make_subplots(rows=1, cols=len(results), shared_yaxes=True, subplot_titles=[
        tr_later("a salt per tenant") if r.salt else tr_later("no salt") for r in results])
    for column, result in enumerate(results, start=1):
        for label, values, colour in (
                (tr_later("A had sent the prefix"), result.sent, "#e76f51"),
                (tr_later("A had not"), result.not_sent, "#2a9d8f")):
            figure.add_trace(go.Box(y=[1000 * v for v in values], name=label,
                                    boxpoints="all", jitter=0.4, pointpos=0,
                                    marker_color=colour, legendgroup=label,
                                    showlegend=column == 1), row=1, col=column)
    figure.update_yaxes(title_text="tenant B's time to first token (ms)", row=1, col=1)
    figure.update_layout(title="A shared prefix cache tells one tenant what another sent",
                         template="plotly_white", height=440)
    return localized(figure)


# --- the figures --------------------------------------------------------------------------------


@dataclass
class Figures:
    """What ``main`` printed: the policy sweep of each workload, the weight sweep, the delay
    sweep, the multi-tenant fleet without and with salts, the side channel's two settings."""

    policies: dict[str, list[FleetReport]] = field(default_factory=dict)
    weights: list[FleetReport] = field(default_factory=list)
    delays: list[FleetReport] = field(default_factory=list)
    salted: list[FleetReport] = field(default_factory=list)
    side_channel: list[SideChannel] = field(default_factory=list)


def report_line(report: FleetReport) -> str:
    """A report as ``main`` prints it: hit rate, TTFT mean and P90 (ms), imbalance, requests
    on each engine, events the indexer applied a second (measured)."""
    return (f"{report.hit_rate:>9.1%}{1000 * report.ttft_mean:>9.0f}"
            f"{1000 * report.ttft_p90:>9.0f}{report.imbalance:>11.2f}  "
            f"{'/'.join(map(str, report.requests_per_engine)):<27}"
            f"{report.events_per_s:>12,.0f}")


def side_channel_line(result: SideChannel) -> str:
    """A side channel's figures as ``main`` prints them: B's mean TTFT (ms) when A had sent
    the prefix and when not, their gap, and how often B's guess is right."""
    return (f"{1000 * statistics.fmean(result.sent):>20.1f}"
            f"{1000 * statistics.fmean(result.not_sent):>20.1f}"
            f"{1000 * result.gap:>9.1f}{result.attacker_accuracy:>17.0%}")


def _heading() -> str:
    return (aligned(tr("hit rate"), 9) + aligned(tr("TTFT ms"), 9) + aligned(tr("P90 ms"), 9)
            + aligned(tr("imbalance"), 11) + "  " + aligned(tr("requests per engine"), -27)
            + aligned(tr("events/s"), 12))


POLICY_WORKLOADS = ("few-shot", "multi-turn")  # where the cache decides: main's policy sweeps
WEIGHTS = (0, 0.5, 1, 2, 4, 8, 16, 64)
DELAYS_S = (0.0, 0.5, 2.0, 5.0)


def print_policies(workload: str, rows: list[FleetReport]) -> None:
    """A policy sweep's rows as a table."""
    print(aligned(tr(workload), -14) + aligned(tr("engines"), 8) + _heading())
    for report in rows:
        print(aligned(tr(POLICY_NAMES[report.policy]), -14) + f"{report.engines:>8}"
              + report_line(report))


def print_weights(rows: list[FleetReport]) -> None:
    """A weight sweep's rows as a table."""
    print(aligned(tr("weight"), 8) + _heading())
    for report in rows:
        print(f"{report.weight:>8g}" + report_line(report))


def print_delays(rows: list[FleetReport]) -> None:
    """A delay sweep's rows as a table."""
    print(aligned(tr("delay s"), 8) + _heading())
    for report in rows:
        print(f"{report.event_delay_s:>8g}" + report_line(report))


def print_salts(rows: list[FleetReport]) -> None:
    """A fleet without and with a salt per tenant, as a table."""
    print(aligned(tr("salt"), -8) + _heading())
    for report in rows:
        print(aligned(tr("yes") if report.salt else tr("no"), -8) + report_line(report))


def print_side_channel(results: list[SideChannel]) -> None:
    """The side channel without and with salts, as a table."""
    print(aligned(tr("salt"), -8) + aligned(tr("A sent it: mean ms"), 20)
          + aligned(tr("A did not: mean ms"), 20) + aligned(tr("gap ms"), 9)
          + aligned(tr("B guesses right"), 17))
    for result in results:
        print(aligned(tr("yes") if result.salt else tr("no"), -8) + side_channel_line(result))


def main(seed: int = 0, trials: int = 40, engine_counts: Sequence[int] = (2, 4, 8),
         weights: Sequence[float] = WEIGHTS, delays_s: Sequence[float] = DELAYS_S,
         requests_per_engine: int = 25, rate_per_engine: float = 4.0,
         parts: FleetParts | None = None) -> Figures:
    """Print the policy sweep on few-shot and multi-turn, the weight sweep and the cost of a
    salt per tenant on multi-tenant (4 engines), the delay sweep on few-shot (4 engines), and
    the side channel over ``trials`` trials, all with ``parts``; return what was printed."""
    figures = Figures()
    load = dict(requests_per_engine=requests_per_engine, rate_per_engine=rate_per_engine,
                seed=seed, parts=parts)
    print(tr("time modelled (chapter 5's OPT-13B on A100s, 883 blocks of 16 an engine); "
             "events/s measured on this machine"))
    print(tr(f"{requests_per_engine} requests an engine, arriving at {rate_per_engine:g} a "
             "second an engine"))
    for workload in POLICY_WORKLOADS:
        print()
        figures.policies[workload] = policy_sweep(workload, engine_counts=engine_counts,
                                                  **load)
        print_policies(workload, figures.policies[workload])
    print()
    print(tr("multi-tenant, KV-aware routing on 4 engines, by overlap score weight"))
    figures.weights = weight_sweep(weights, **load)
    print_weights(figures.weights)
    print()
    print(tr("few-shot, KV-aware routing on 4 engines, the index behind by a delay"))
    figures.delays = delay_sweep(delays_s, **load)
    print_delays(figures.delays)
    print()
    print(tr("multi-tenant, KV-aware routing on 4 engines, without and with a salt per tenant"))
    figures.salted = [run_fleet("multi-tenant", FleetConfig(salt=salt), **load).report
                      for salt in (False, True)]
    print_salts(figures.salted)
    print()
    print(tr(f"tenant B's time to first token for a guess of tenant A's prompt, one engine, "
             f"{trials} trials"))
    figures.side_channel = [side_channel(salt, trials, parts=parts) for salt in (False, True)]
    print_side_channel(figures.side_channel)
    return figures


if __name__ == "__main__":
    main()
