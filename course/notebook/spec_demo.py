"""Chapter 12's demonstrations: the tiny model served with speculation in scenarios that reach
every path of the KV side, the probes that decide whether a learner's function is used, and
the charts of what speculation buys."""

from __future__ import annotations

import random
from collections.abc import Callable

import plotly.graph_objects as go

from course.experiments.serving_sim import CostModel
from course.experiments.spec_decode_cost import expected_tokens, largest_batch, speculation
from course.language import tr, tr_later
from course.notebook.charts import lines_chart
from course.tiny_model import TinyConfig, TinyModel, generate_contiguous
from course.v1.chunked_engine import engine_requests, serve_chunked
from course.v1.chunked_scheduler import Chunk, ChunkedRequest, ChunkedScheduler, Schedule
from course.v1.draft_model import DraftHead, DraftModel
from course.v1.hybrid_coordinator import HybridKVCacheCoordinator
from course.v1.speculative_engine import Proposer, SpeculativeEngine
from kernels.sliding_window_attention import window_attention_reference

# each scenario: drafts per step, blocks in the pool, block size, token budget, the layers'
# windows (None: two layers of full attention), tokens every prompt shares, and a draft model
# or head to propose (the target's own weights, a model of one layer, an EAGLE-shaped head)
# instead of the knowing proposer
SPEC_SCENARIOS = {
    tr_later("one draft a step"): dict(k=1),
    tr_later("five drafts a step"): dict(k=5),
    tr_later("blocks of 1"): dict(k=3, num_blocks=400, block_size=1),
    tr_later("chunked prefill, budget 6"): dict(k=4, budget=6),
    tr_later("a small pool: preemption"): dict(k=4, num_blocks=20, block_size=2),
    tr_later("shared prefixes: hits"): dict(k=3, shared=9),
    tr_later("hybrid: a window of 3"): dict(k=4, windows=(3, None)),
    tr_later("draft model: the target's"): dict(k=4, draft="target"),
    tr_later("draft model: one layer"): dict(k=3, draft="one layer"),
    tr_later("draft head, prefix hits"): dict(k=3, draft="head", shared=9),
}


def scenario_requests(seed: int, count: int = 6, shared: int = 0) -> list[ChunkedRequest]:
    """``count`` requests with prompts of 1 to 12 tokens (some starting with ``shared``
    tokens in common) and 4 to 24 tokens to generate, arriving over 4 steps."""
    rng = random.Random(seed)
    prefix = [rng.randrange(128) for _ in range(shared)]
    return engine_requests([((prefix if rng.random() < 0.6 else []) +
                             [rng.randrange(128) for _ in range(rng.randint(1, 12))],
                             rng.randint(4, 24), rng.randint(0, 3)) for _ in range(count)])


def knowing_proposer(model: TinyModel, requests: list[ChunkedRequest], wrong: float,
                     seed: int = 0) -> Proposer:
    """A stand-in for a draft model: it knows each request's greedy continuation and
    proposes it, each draft wrong (the next token id) with probability ``wrong``."""
    truth = {r.id: generate_contiguous(model, r.prompt, r.output_len)[0] for r in requests}
    rng = random.Random(seed)

    def propose(request: ChunkedRequest, k: int) -> list[int]:
        done = len(request.output)
        right = truth[request.id][done:done + k]
        return [t if rng.random() >= wrong else (t + 1) % model.config.vocab_size
                for t in right]

    return propose


def serve_speculating(scenario: dict, wrong: float = 1 / 3, seed: int = 0,
                      lookup: Callable | None = None, **functions: Callable
                      ) -> tuple[SpeculativeEngine, list[ChunkedRequest], TinyModel]:
    """One scenario served with speculation: drafts by its draft model, else by prompt lookup
    through ``lookup`` (the learner's ``ngram_propose``, n-grams of 1 to 3) if given, else by
    the knowing proposer; ``functions``: ``accept``, ``lookahead``, ``roll_back``."""
    k = scenario.get("k", 3)
    windows = scenario.get("windows")
    model = TinyModel(TinyConfig(num_layers=len(windows), windows=windows) if windows
                      else TinyConfig(), seed=seed)
    requests = scenario_requests(seed, shared=scenario.get("shared", 0))
    drafting = {}
    if scenario.get("draft") == "target":
        drafting["draft"] = DraftModel(TinyModel(seed=seed))
    elif scenario.get("draft") == "head":
        drafting["draft"] = DraftHead(TinyModel(TinyConfig(num_layers=1), seed=seed + 1), seed)
    elif scenario.get("draft"):
        drafting["draft"] = DraftModel(TinyModel(TinyConfig(num_layers=1, hidden=32,
                                                            mlp_hidden=64), seed=seed + 1))
    elif lookup:
        drafting["propose"] = lambda request, n: lookup(request.tokens, 1, 3, n)
    else:
        drafting["propose"] = knowing_proposer(model, requests, wrong, seed)
    hybrid = dict(kv_cache=HybridKVCacheCoordinator,
                  window_attention=window_attention_reference) if windows else {}
    engine = SpeculativeEngine(model, scenario.get("num_blocks", 200),
                               scenario.get("block_size", 4), scenario.get("budget", 16), k,
                               **drafting, **hybrid, **functions)
    return engine, serve_chunked(engine, requests, max_steps=2_000), model


def spec_row(scenario: dict, **served: object) -> dict:
    """One scenario of ``SPEC_SCENARIOS`` as a row: requests, how many generated what greedy
    generation gives, drafts proposed and accepted, steps against the same requests served
    without drafts (by the same functions), preemptions, and whether every block came
    back."""
    engine, finished, model = serve_speculating(scenario, **served)
    identical = sum(r.output == generate_contiguous(model, r.prompt, r.output_len)[0]
                    for r in finished)
    plain, _, _ = serve_speculating({**scenario, "k": 0, "draft": None}, **served)
    return {"requests": len(finished), "identical": identical, "drafted": engine.drafted,
            "accepted": engine.accepted, "steps": engine.steps, "plain_steps": plain.steps,
            "preemptions": sum(len(r.preempted) for r in engine.records),
            "blocks_back": engine.kv_cache.num_held() == 0}


# --- probes: a learner's KV-side function is used once it gives the course's result here ----


def _decoding() -> ChunkedScheduler:
    """A scheduler of blocks of 2 and a budget of 6 over a full and a sliding group (a
    window of 3), with two requests decoding (7 and 4 tokens, all computed but the newest),
    each with 3 drafts."""
    kv = HybridKVCacheCoordinator(30, 2, [None, 3])
    scheduler = ChunkedScheduler(30, 2, 6, kv_cache=kv)
    for i, length in enumerate((7, 4)):
        request = ChunkedRequest(i, list(range(10 * i, 10 * i + length)), 8)
        assert kv.allocate_slots(request, length - 1)
        request.num_computed_tokens = length - 1
        request.spec_token_ids = [1, 2, 3]
        scheduler.running.append(request)
    return scheduler


def lookahead_probe(fn: Callable) -> tuple:
    """``fn`` after a plan of each request's newest token: the chunks, computed tokens,
    drafts and table lengths it leaves."""
    scheduler = _decoding()
    plan = Schedule([Chunk(r, r.num_computed_tokens, 1) for r in scheduler.running])
    for r in scheduler.running:
        r.num_computed_tokens += 1
    fn(scheduler, plan)
    return _state(scheduler, plan)


def rollback_probe(fn: Callable) -> tuple:
    """``fn`` after both requests' drafts were computed, keeping 1 and 3 of them."""
    scheduler = _decoding()
    for r in scheduler.running:
        assert scheduler.kv_cache.allocate_slots(r, 4)
        r.num_computed_tokens += 4
    for r, kept in zip(scheduler.running, (1, 3), strict=True):
        fn(scheduler, r, kept)
    return _state(scheduler, Schedule())


def _state(scheduler: ChunkedScheduler, plan: Schedule) -> tuple:
    kv = scheduler.kv_cache
    return (tuple((c.request.id, c.start, c.num_tokens) for c in plan.chunks),
            tuple((r.num_computed_tokens, tuple(r.spec_token_ids),
                   tuple(len(m.tables[r.id]) for m in kv.managers)) for r in scheduler.running),
            kv.num_free())


# --- charts -----------------------------------------------------------------------------------


def acceptance_chart(ks: tuple[int, ...] = (1, 2, 3, 5, 8)) -> go.Figure:
    """Expected tokens per step against the acceptance rate, a line per number of drafts."""
    alphas = [a / 20 for a in range(20)]
    return lines_chart(alphas, {tr(f"k = {k}"): [expected_tokens(a, k) for a in alphas]
                                for k in ks},
                       tr("Tokens a step emits, by acceptance rate and drafts per step"),
                       tr("acceptance rate (α)"), tr("expected tokens per step"))


def speedup_chart(cost: CostModel, memory_bytes: float, alpha: float, context: int,
                  ks: tuple[int, ...] = (1, 2, 4, 8)) -> go.Figure:
    """Speculation's speedup over plain decoding against the batch, a line per number of
    drafts, up to the largest batch the pool holds."""
    most = largest_batch(cost, memory_bytes, context)
    batches = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, 512, most} & set(range(1, most + 1)))
    figure = lines_chart(batches, {tr(f"k = {k}"): [
        speculation(cost, alpha, k, b, context).speedup for b in batches] for k in ks},
        tr(f"{tr(cost.name)}: speculation's speedup at acceptance {alpha}"),
        tr("requests in the batch"), tr("speedup over plain decoding"), log_x=True)
    figure.add_hline(y=1.0, line_dash="dot")
    return figure

