"""Chapter 9's hidden checks, and what the visible checks ask of them.

The scheduling step's model is a second reading of the rules in ``schedule_step``'s
docstring, written apart from the course's answer (phases as functions over a snapshot of the
queues); the course's own test (``tests/test_ch09_chunked_scheduler.py``) shows the two agree
on hypothesis-drawn scenarios. The thorough check runs the learner's step and the model in
lock step on hypothesis-drawn scenarios: budgets down to 1, blocks of 1 to 4, shared
prefixes, pools small enough to preempt (and to refuse a waiting request), a cap on running
requests.

The attention's oracle works token by token over each request's contiguous keys in float64,
and computes what known mistakes give (no causal mask, a context one short or one long,
positions from the packed index or from 0). The engine step runs on the chapter's scheduler
with the course's attention (bound when this module is imported), and once on the Triton
kernel, against each request's contiguous run.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from autograder.checks._helpers import for_all, learner_call
from autograder.checks.ch09 import (
    MAX_STEPS,
    SEED,
    begin_step,
    compare_attention,
    make_scheduler,
    run_engine,
    run_kernel,
    run_schedule,
    simulate,
)
from autograder.private import thorough
from course.notebook.paged_cases import VarlenCase, on_gpu
from course.v1.chunked_scheduler import (
    Chunk,
    ChunkedRequest,
    ChunkedScheduler,
    Schedule,
    schedule_step,
)
from kernels.varlen_attention_ref import varlen_paged_attention

# --- schedule_step ---------------------------------------------------------------------------


def model_step(scheduler: ChunkedScheduler) -> Schedule:
    """The rules, read again: a phase for running requests, one for waiting ones."""
    kv, plan = scheduler.kv_cache, Schedule()
    left = [scheduler.max_num_batched_tokens]

    def give(request: ChunkedRequest, count: int) -> None:
        plan.chunks.append(Chunk(request, request.num_computed_tokens, count))
        request.num_computed_tokens = request.num_computed_tokens + count
        left[0] = left[0] - count

    def evict_newest() -> ChunkedRequest:
        victim = scheduler.running[-1]
        scheduler.running = scheduler.running[:-1]
        kv.free(victim)
        victim.num_computed_tokens = 0
        scheduler.waiting.insert(0, victim)
        plan.preempted.append(victim.id)
        return victim

    def room_for(request: ChunkedRequest, count: int) -> bool:
        """Preempt from the newest until the cache makes room for ``count`` more tokens of
        ``request``; False once ``request`` was preempted itself."""
        while not kv.allocate_slots(request, count):
            if evict_newest() is request:
                return False
        return True

    for request in list(scheduler.running):
        if left[0] == 0 or request not in scheduler.running:
            break
        count = request.num_tokens - request.num_computed_tokens
        count = count if count < left[0] else left[0]
        if not room_for(request, count):
            break
        give(request, count)
    if plan.preempted:
        return plan
    while left[0] > 0 and len(scheduler.waiting) > 0 and \
            len(scheduler.running) < scheduler.max_num_seqs:
        head = scheduler.waiting[0]
        hit = kv.get_computed_tokens(head)
        count = head.num_tokens - hit
        count = count if count < left[0] else left[0]
        head.num_computed_tokens = hit
        if not kv.allocate_slots(head, count):
            head.num_computed_tokens = 0
            return plan
        scheduler.waiting.remove(head)
        scheduler.running.append(head)
        give(head, count)
    return plan


def schedule_trace(scenario: dict) -> list[dict]:
    """Each step's summary when the rules schedule ``scenario``."""
    scheduler, requests = make_scheduler(scenario)
    trace = []
    for step in range(MAX_STEPS):
        if step > max(r.arrival for r in requests) and not scheduler.busy():
            break
        begin_step(scheduler, requests, scenario, step)
        trace.append(simulate(scheduler, step, model_step)[1])
    return trace


class _LockStep:
    """The model's own scheduler, stepped beside the learner's: the expected summary of each
    step."""

    def __init__(self, scenario: dict) -> None:
        self.scheduler, self.requests = make_scheduler(scenario)
        self.scenario = scenario

    def __call__(self, step: int, _learner_state: ChunkedScheduler) -> dict:
        begin_step(self.scheduler, self.requests, self.scenario, step)
        return simulate(self.scheduler, step, model_step)[1]


def _scenarios():
    from hypothesis import strategies as st

    prefix = st.lists(st.integers(0, 3), min_size=0, max_size=9)

    @st.composite
    def scenario(draw):
        block_size = draw(st.sampled_from([1, 2, 3, 4]))
        shared = draw(prefix)
        requests = []
        for _ in range(draw(st.integers(1, 5))):
            own = draw(st.lists(st.integers(0, 9), min_size=1, max_size=10))
            prompt = (shared[:draw(st.integers(0, len(shared)))] if draw(st.booleans())
                      else []) + own
            requests.append((prompt, draw(st.integers(1, 6)), draw(st.integers(0, 6))))
        longest = max(-(-(len(p) + n) // block_size) for p, n, _ in requests)
        return {"num_blocks": longest + 1 + draw(st.integers(0, 12)),
                "block_size": block_size,
                "budget": draw(st.integers(1, 12)), "max_num_seqs": draw(st.integers(1, 5)),
                "requests": requests,
                "budget_from": draw(st.dictionaries(st.integers(1, 12), st.integers(1, 12),
                                                    max_size=2))}

    return scenario()


# Scenarios that reach rules random ones rarely do (about 1 in 100 drawn scenarios each, and
# not among the ones drawn):
RARE_SCENARIOS = [
    # step 4: request 1's next 5 tokens need 2 more blocks and 1 is free, so it preempts
    # itself (it is the newest); its blocks freed, it would fit again, but nothing is admitted
    # in a step that preempted
    {"num_blocks": 5, "block_size": 3, "budget": 6, "max_num_seqs": 5,
     "requests": [([0, 3, 3, 5], 4, 3), ([0, 0, 1, 7, 6, 0, 6], 2, 3)]},
    # step 7: request 0's new token needs a block and none is free, so request 2 (the newest)
    # is preempted; request 1, between them, still gets its decode: preempting another
    # request ends nothing
    {"num_blocks": 9, "block_size": 3, "budget": 3, "max_num_seqs": 5,
     "requests": [([4, 6, 0, 5, 2], 6, 1), ([5, 7, 3, 8, 5], 4, 3),
                  ([4, 3, 2, 2, 6, 6, 0], 3, 5)],
     "budget_from": {4: 5}},
]


def _describe(scenario: dict) -> str:
    changes = "".join(f", budget {budget} from step {step}"
                      for step, budget in sorted(scenario.get("budget_from", {}).items()))
    return (f"(budget {scenario['budget']}{changes}, blocks of {scenario['block_size']}, "
            f"{scenario['num_blocks']} blocks, at most {scenario['max_num_seqs']} running, "
            f"requests (prompt, output_len, arrival) {scenario['requests']})")


@thorough
def check_schedule_step_thoroughly(fn: Callable) -> None:
    """The rare scenarios, then hypothesis-drawn ones (budgets that change between steps
    among them), the learner's step and the model's in lock step."""

    def one(scenario: dict) -> None:
        run_schedule(fn, scenario, _LockStep(scenario), _describe(scenario))

    for scenario in RARE_SCENARIOS:
        one(scenario)
    for_all(_scenarios(), one, max_examples=120)


# --- varlen_paged_attention and varlen_attention_kernel --------------------------------------


def _seen(kind: str, start: int, q_len: int, seq_len: int, j: int) -> int:
    """How many keys query j of a request sees: rightly, or as a known mistake does."""
    position = seq_len - q_len + j
    count = {"want": position + 1, "no_causal": seq_len, "short": position,
             "long": position + 2, "packed": start + j + 1, "from_zero": j + 1,
             "from_key_0": position + 1}[kind]
    return max(0, count if kind == "packed" else min(count, seq_len))


def attention_answers(q_lens, seq_lens, block_size, q_heads, kv_heads, head_dim, dtype,
                      seed, from_key=None) -> dict:
    """The case's output, token by token over each request's contiguous keys (float64), and
    what each known mistake computes; a mistake that agrees with the right answer on this
    case is None. With ``from_key``, a query sees its keys from ``min(from_key, context -
    1)`` on, its context as each kind computes it (``from_key_0``: from key 0)."""
    case = VarlenCase(q_lens, seq_lens, block_size, q_heads, kv_heads, head_dim,
                      getattr(torch, dtype), seed, from_key=from_key)
    group = q_heads // kv_heads
    answers = {}
    for kind in ("want", "no_causal", "short", "long", "packed", "from_zero", "from_key_0"):
        rows, start = [], 0
        for r, (q_len, seq_len) in enumerate(zip(q_lens, seq_lens, strict=True)):
            keys, values = case.keys[r].double(), case.values[r].double()
            for j in range(q_len):
                q = case.query[start + j].double()  # [q_heads, dim]
                count = _seen(kind, start, q_len, seq_len, j)
                # FIRST_KEY(context, window) of the context this kind computes
                first = 0 if from_key is None or kind == "from_key_0" else max(
                    0, min(from_key, count - 1))
                row = torch.full((q_heads, head_dim), float("nan"), dtype=torch.float64)
                for h in range(q_heads):
                    if count == 0 or count > seq_len:  # no key, or past the end: undefined
                        continue
                    k = keys[first:count, h // group]
                    v = values[first:count, h // group]
                    weights = torch.softmax((k @ q[h]) * case.scale, dim=0)
                    row[h] = weights @ v
                rows.append(row)
            start += q_len
        answers[kind] = torch.stack(rows).to(case.dtype) if rows else case.query.clone()
    for kind in list(answers):
        if kind != "want" and torch.equal(answers[kind].nan_to_num(7.0),
                                          answers["want"].nan_to_num(7.0)):
            answers[kind] = None
    return answers


def _attention_cases(kernel: bool) -> list[dict]:
    """(q_lens, seq_lens) mixes: chunks after cached tokens, decodes, fresh prompts, one
    token, a long chunk; block sizes 1 to 16; MHA, GQA and MQA; odd head sizes."""
    cases = [
        dict(q_lens=[1, 1, 1], seq_lens=[1, 9, 17], block_size=4, q_heads=4, kv_heads=2),
        dict(q_lens=[5, 1, 7, 2], seq_lens=[8, 14, 7, 2], block_size=1, q_heads=2,
             kv_heads=2),
        dict(q_lens=[17, 3], seq_lens=[40, 3], block_size=16, q_heads=8, kv_heads=1,
             head_dim=24),
        dict(q_lens=[4, 9], seq_lens=[21, 9], block_size=8, q_heads=6, kv_heads=3,
             head_dim=12, dtype=torch.float16),
    ]
    if kernel:  # a first key other than 0: where the block loop starts, and the mask before it
        cases += [dict(q_lens=[6, 1, 3], seq_lens=[20, 33, 3], block_size=4, q_heads=4,
                       kv_heads=1, from_key=9),
                  dict(q_lens=[2, 5], seq_lens=[7, 12], block_size=1, q_heads=2, kv_heads=2,
                       from_key=3)]
    if not kernel:
        cases += [dict(q_lens=[3, 2], seq_lens=[10, 33], block_size=2, q_heads=4, kv_heads=1,
                       dtype=torch.bfloat16),
                  dict(q_lens=[33, 1, 6], seq_lens=[64, 100, 6], block_size=16, q_heads=8,
                       kv_heads=2, head_dim=64)]
    return cases


@thorough
def check_varlen_paged_attention_thoroughly(fn: Callable) -> None:
    """Decodes only, block size 1, MQA with head_dim 24, fp16 and bf16, a 33-token chunk."""
    for seed, spec in enumerate(_attention_cases(kernel=False)):
        case = VarlenCase(**spec, seed=SEED + seed)
        out = learner_call("varlen_paged_attention", fn, *case.arguments())
        compare_attention(out, case, "varlen_paged_attention", attention_answers(**case.spec()),
                          rounded=True)


@thorough
def check_varlen_attention_kernel_thoroughly(fn: Callable) -> None:
    """Decodes only, block size 1, MQA with head_dim 24, fp16, and on a GPU longer contexts
    with head_dim 128."""
    device = "cuda" if on_gpu() else "cpu"
    cases = _attention_cases(kernel=True)
    if on_gpu():
        cases += [dict(q_lens=[128, 1, 1, 300], seq_lens=[1000, 2048, 77, 300],
                       block_size=16, q_heads=32, kv_heads=8, head_dim=128,
                       dtype=torch.bfloat16)]
    for seed, spec in enumerate(cases):
        case = VarlenCase(**spec, seed=SEED + seed, device=device)
        run_kernel(fn, case, attention_answers(**case.spec()))


# --- engine_step -----------------------------------------------------------------------------


def _engine_specs(count: int, seed: int, max_prompt: int = 12, max_output: int = 6,
                  spread: int = 6) -> list[tuple]:
    """Requests, half of them starting with one of two shared prefixes."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(128) for _ in range(9)] for _ in range(2)]
    specs = []
    for _ in range(count):
        own = [rng.randrange(128) for _ in range(rng.randint(1, max_prompt))]
        prompt = (rng.choice(prefixes)[:rng.randint(4, 9)] + own) if rng.random() < 0.5 \
            else own
        specs.append((prompt, rng.randint(1, max_output), rng.randint(0, spread)))
    return specs


def _course_attention(*args):
    """The course's attention, called from here: while grading, the chapter's answers are
    tripwires for code outside the course, and the learner's step calls this."""
    return varlen_paged_attention(*args)


def _course_kernel(*args):
    """The course's Triton kernel through its launcher, called from here (as above)."""
    from kernels.varlen_attention import varlen_attention

    return varlen_attention(*args)


@thorough
def check_engine_step_thoroughly(fn: Callable) -> None:
    """The chapter's scheduler: budgets of 1, 2 and 5 tokens, blocks of 1, 2 and 4, shared
    prefixes hit in the cache, pools small enough to preempt, a request recomputed in small
    chunks after it generated tokens; the Triton kernel as the attention (blocks of 16 on a
    GPU)."""
    for budget, block_size, num_blocks, count, seed in ((1, 4, 40, 3, 1), (2, 1, 40, 4, 2),
                                                        (5, 2, 14, 6, 3), (5, 4, 9, 6, 4)):
        specs = _engine_specs(count, seed, max_prompt=12 if budget > 2 else 6,
                              max_output=6 if budget > 2 else 4)
        run_engine(fn, specs, block_size, num_blocks, budget, schedule_step,
                   _course_attention,
                   f"(budget {budget}, blocks of {block_size}, a pool of {num_blocks})")
    # request 2 (a prompt of 3) is preempted once it has generated 2 tokens; admitted again
    # from its hit of 2, its chunk of 2 (positions 2 .. 3) runs past its prompt but stops
    # short of its last token, and samples nothing
    run_engine(fn, [([80, 69, 49, 17, 10], 3, 0), ([69, 31, 33, 90, 37, 5, 44, 76, 31, 14], 6, 0),
                    ([105, 60, 77], 4, 1)],
               2, 10, 2, schedule_step, _course_attention,
               "(budget 2, blocks of 2, a pool of 10: a request recomputed after a preemption)")
    gpu = on_gpu()
    run_engine(fn, _engine_specs(3, 5, max_prompt=5, max_output=3, spread=2),
               16 if gpu else 4, 12, 3, schedule_step, _course_kernel,
               "(budget 3, through the Triton kernel)", "cuda" if gpu else "cpu")
