"""What chapter 9's pictures run: the learner's pieces (or the course's), the engine against
contiguous generation, the prefill that prefix hits save on chapter 4's workloads, and time
to first token and between tokens against the token budget in a simulator with chapter 5's
cost model.

    python -m course.notebook.chunked_demo      # the savings and the latency table, as the notebook
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from course.experiments.prefix_sim import WORKLOADS
from course.experiments.serving_sim import CostModel, opt13b_a100_40gb
from course.language import aligned, tr, tr_later
from course.notebook import learner_or_course_probed as _chosen
from course.notebook import needs
from course.notebook.charts import localized
from course.tiny_model import TinyModel, generate_contiguous
from course.v1 import chunked_engine, chunked_scheduler
from course.v1.chunked_engine import ChunkedEngine, serve_chunked
from course.v1.chunked_scheduler import ChunkedRequest, ChunkedScheduler


def _schedule_probe(schedule: Callable) -> list:
    """Two prompts sharing a block, a budget of 5 tokens, blocks of 4: every step's chunks."""
    scheduler = ChunkedScheduler(8, 4, 5)
    scheduler.add(ChunkedRequest(0, [1, 2, 3, 4, 5, 6], 1))
    seen = []
    for step in range(6):
        if step == 2:
            scheduler.add(ChunkedRequest(1, [1, 2, 3, 4, 9], 1))
        plan = scheduler.step(schedule)
        seen.append([(c.request.id, c.start, c.num_tokens) for c in plan.chunks])
        for chunk in plan.chunks:
            if chunk.end == chunk.request.num_tokens and not chunk.request.done:
                chunk.request.emit(7)
        for request in list(scheduler.running):
            if request.done:
                scheduler.finish(request)
    return seen


def _attention_probe(attention: Callable) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    k_cache = torch.randn(4, 4, 2, 8, generator=gen)
    v_cache = torch.randn(4, 4, 2, 8, generator=gen)
    query = torch.randn(4, 4, 8, generator=gen)
    return attention(query, k_cache, v_cache, torch.tensor([0, 3, 4], dtype=torch.int32),
                     torch.tensor([6, 3], dtype=torch.int32),
                     torch.tensor([[2, 0], [3, 0]], dtype=torch.int32), 0.35)


def _step_probe(step: Callable, model: TinyModel, schedule: Callable, attention: Callable
                ) -> list:
    engine = ChunkedEngine(model, 8, 4, 3, attention=attention, schedule=schedule, step=step)
    finished = serve_chunked(engine, [ChunkedRequest(0, [3, 14, 15, 92, 65], 3)], 50)
    return [r.output for r in finished]


def chosen_parts(schedule_step: Callable, varlen_paged_attention: Callable,
                 engine_step: Callable, model: TinyModel) -> dict[str, Callable]:
    """The engine's ``schedule``, ``attention`` and ``step``: each the learner's where it runs
    and agrees with the course's on a small case, else the course's; where neither runs, a
    stand-in that ``needs`` turns into one line saying what to finish."""
    schedule = _chosen(schedule_step, chunked_scheduler.schedule_step, _schedule_probe)
    attention = _chosen(varlen_paged_attention, chunked_engine.varlen_paged_attention,
                        _attention_probe)
    # the step is probed with the schedule and attention chosen above: in a learner edition
    # the course's are stubs, and the learner's own must carry it
    step = _chosen(engine_step, chunked_engine.engine_step,
                   lambda fn: _step_probe(fn, model, schedule, attention))
    return {"schedule": schedule, "attention": attention, "step": step}


def workload(count: int, seed: int, shared: int = 8) -> list[ChunkedRequest]:
    """Staggered requests for the tiny model, half starting with one shared prefix."""
    rng = random.Random(seed)
    prefix = [rng.randrange(128) for _ in range(shared)]
    requests = []
    for i in range(count):
        own = [rng.randrange(128) for _ in range(rng.randint(1, 12))]
        prompt = prefix + own if i % 2 else own
        requests.append(ChunkedRequest(i, prompt, rng.randint(1, 8), rng.randint(0, 8)))
    return requests


def equality_row(model: TinyModel, parts: dict[str, Callable], budget: int, block_size: int,
                 num_blocks: int, seed: int = 0) -> dict:
    """Serve ``workload(10, seed)``; compare every request with its contiguous run."""
    needs(*parts.values())
    engine = ChunkedEngine(model, num_blocks, block_size, budget, **parts)
    requests = workload(10, seed)
    finished = serve_chunked(engine, requests)
    identical, worst = 0, 0.0
    for request in finished:
        tokens, logits = generate_contiguous(model, request.prompt, request.output_len)
        identical += request.output == tokens
        worst = max([worst] + [float((a - b).abs().max())
                               for a, b in zip(request.logits, logits, strict=True)])
    kinds = [kind for record in engine.records for *_, kind in record.chunks]
    return {"budget": budget, "block_size": block_size, "num_blocks": num_blocks,
            "finished": len(finished), "identical": identical, "steps": len(engine.records),
            "prefill_chunks": kinds.count("prefill"), "decodes": kinds.count("decode"),
            "preemptions": sum(len(r.preempted) for r in engine.records),
            "hit_tokens": engine.prompt_hits, "largest_logit_difference": worst,
            "records": engine.records}


# --- what prefix hits save -------------------------------------------------------------------


def prefill_saved(schedule: Callable, block_size: int = 16, num_blocks: int = 4096,
                  budget: int = 2048) -> list[dict]:
    """On each of chapter 4's workloads (``course.experiments.prefix_sim.WORKLOADS``), run through a
    scheduler with ``schedule`` (no model: each request emits its own next output token when
    its tokens are all computed): prompt tokens, and those a prefix hit let it skip at its
    first admission. A request that follows another (a conversation's next turn) arrives once
    that one has finished. Each row names its workload in the chosen language."""
    rows = []
    for name, make in WORKLOADS.items():
        scheduler = ChunkedScheduler(num_blocks, block_size, budget)
        specs = make()
        requests = [ChunkedRequest(i, list(s.prompt), len(s.output)) for i, s in
                    enumerate(specs)]
        done: set[int] = set()
        queued: set[int] = set()
        hits, computed_prompt, seen = 0, 0, set()
        for _ in range(100_000):
            for i, spec in enumerate(specs):
                if i not in queued and (spec.after is None or spec.after in done) and \
                        len(scheduler.running) + len(scheduler.waiting) < 32:
                    scheduler.add(requests[i])
                    queued.add(i)
            if not scheduler.busy():
                break
            plan = scheduler.step(schedule)
            for chunk in plan.chunks:
                request = chunk.request
                if request.id not in seen:
                    seen.add(request.id)
                    hits += chunk.start
                    computed_prompt += len(request.prompt)
                if chunk.end == request.num_tokens and not request.done:
                    request.emit(specs[request.id].output[len(request.output)])
            for request in list(scheduler.running):
                if request.done:
                    scheduler.finish(request)
                    done.add(request.id)
        rows.append({"workload": tr(name), "requests": len(requests),
                     "prompt_tokens": computed_prompt, "hit_tokens": hits,
                     "saved": hits / computed_prompt if computed_prompt else 0.0})
    return rows


# --- latency against the token budget --------------------------------------------------------


@dataclass
class Latency:
    budget: int
    ttft_p50: float
    ttft_p99: float
    tbt_p50: float
    tbt_p99: float
    steps: int


def step_time(cost: CostModel, chunks: list) -> float:
    """Chapter 5's cost model for a mixed step: every scheduled token's compute (2 x params
    FLOPs), plus, when the step has decodes, reading the weights and the decodes' KV."""
    tokens = sum(c.num_tokens for c in chunks)
    compute = tokens * 2 * cost.params / (cost.peak_flops * cost.flops_utilisation)
    decodes = [c for c in chunks if c.num_tokens == 1 and c.start > 0]
    memory = 0.0
    if decodes:
        memory = (cost.weight_bytes + sum(c.end for c in decodes) * cost.kv_bytes_per_token) \
            / cost.hbm_bytes_per_s
    return cost.step_overhead_s + compute + memory


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def latency_workload(count: int = 120, seed: int = 0) -> list[tuple[float, int, int]]:
    """(arrival in seconds, prompt length, output length): short chats with a long document
    now and then, Poisson arrivals at 4 per second."""
    rng = random.Random(seed)
    time, out = 0.0, []
    for _ in range(count):
        time += rng.expovariate(4.0)
        prompt = rng.randint(1500, 3000) if rng.random() < 0.15 else rng.randint(50, 300)
        out.append((time, prompt, rng.randint(50, 200)))
    return out


def latency_against_budget(schedule: Callable, budgets: tuple[int, ...] = (
        64, 128, 256, 512, 1024, 4096), cost: CostModel | None = None,
        num_blocks: int = 2000, block_size: int = 16) -> list[Latency]:
    """For each budget: serve ``latency_workload()`` with ``schedule`` under ``cost`` (by
    default chapter 5's OPT-13B on an A100); time to first token and between tokens, P50 and
    P99. A budget of at least the longest prompt never chunks."""
    cost = cost or opt13b_a100_40gb()
    results = []
    for budget in budgets:
        rng = random.Random(1)
        scheduler = ChunkedScheduler(num_blocks, block_size, budget, max_num_seqs=256)
        pending = [ChunkedRequest(i, [rng.randrange(32000) for _ in range(p)], o, 0)
                   for i, (_, p, o) in enumerate(latency_workload())]
        arrivals = {r.id: t for r, (t, _, _) in zip(pending, latency_workload(), strict=True)}
        clock, last_token, ttft, tbt, steps = 0.0, {}, [], [], 0
        while pending or scheduler.busy():
            while pending and arrivals[pending[0].id] <= clock:
                scheduler.add(pending.pop(0))
            if not scheduler.busy():
                clock = arrivals[pending[0].id]
                continue
            plan = scheduler.step(schedule)
            clock += step_time(cost, plan.chunks)
            steps += 1
            for chunk in plan.chunks:
                request = chunk.request
                if chunk.end == request.num_tokens and not request.done:
                    request.emit(0)
                    if len(request.output) == 1:
                        ttft.append(clock - arrivals[request.id])
                    else:
                        tbt.append(clock - last_token[request.id])
                    last_token[request.id] = clock
            for request in list(scheduler.running):
                if request.done:
                    scheduler.finish(request)
        results.append(Latency(budget, percentile(ttft, 50), percentile(ttft, 99),
                               percentile(tbt, 50), percentile(tbt, 99), steps))
    return results


def budget_chart(records: list, title: str = "") -> Any:
    """A plotly stacked bar per step: tokens of prefill chunks, decodes and recomputes."""
    import plotly.graph_objects as go

    figure = go.Figure()
    for kind, colour in ((tr_later("decode"), "#1f77b4"), (tr_later("prefill"), "#ff7f0e"),
                         (tr_later("recompute"), "#d62728")):
        figure.add_bar(x=[r.step for r in records],
                       y=[sum(n for _, _, n, k in r.chunks if k == kind) for r in records],
                       name=kind, marker_color=colour)
    figure.add_scatter(x=[r.step for r in records], y=[r.budget for r in records],
                       mode="lines", name="budget", line={"dash": "dash", "color": "black"})
    figure.update_layout(barmode="stack", title=title or tr("Each step's token budget"),
                         xaxis_title="step",
                         yaxis_title="tokens computed", template="plotly_white")
    return localized(figure)


def main() -> None:
    for row in prefill_saved(chunked_scheduler.schedule_step):
        print(aligned(row["workload"], -32) + tr(
            f" {row['requests']:4} requests, {row['prompt_tokens']:7} prompt tokens, "
            f"{row['hit_tokens']:7} skipped ({100 * row['saved']:.1f} %)"))
    for r in latency_against_budget(chunked_scheduler.schedule_step):
        print(tr(f"budget {r.budget:5}: TTFT P50 {1000 * r.ttft_p50:7.1f} ms  P99 "
                 f"{1000 * r.ttft_p99:7.1f} ms   between tokens P50 {1000 * r.tbt_p50:6.1f} ms  "
                 f"P99 {1000 * r.tbt_p99:6.1f} ms   {r.steps} steps"))


if __name__ == "__main__":
    main()
