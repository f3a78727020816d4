"""Visible checks for chapter 9, the engine with chunked prefill: each TODO's readable case.

The scheduling step is run on a small scenario step by step (a simulated engine around it
emits a fixed token whenever a request has computed all of its tokens, and finishes done
requests); after every step, the chunks, the preemptions, the queues with every request's
computed count, the free blocks and every block table of the scheduler's KV cache (one
full-attention group) must equal what the chapter's rules give. What the rules give comes
from the chapter's hidden module (``autograder.private``), a separate reading of the same
rules, where the thorough checks are too.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from autograder.checks._helpers import LearnerRaised, learner_call
from autograder.checks._memory_audit import MemoryAudit, nearest
from autograder.checks._tensors import expect_attention_output
from autograder.checks.ch07_audit import quiet, store_finding
from autograder.private import private, visible
from autograder.seal import opened
from course.notebook.paged_cases import VARLEN_SEED as SEED
from course.notebook.paged_cases import VarlenCase, on_gpu
from course.tiny_model import TinyModel
from course.v1.chunked_engine import ChunkedEngine, engine_requests, serve_chunked
from course.v1.chunked_scheduler import Chunk, ChunkedRequest, ChunkedScheduler, Schedule
from kernels.varlen_attention import all_keys, keys_from, launch_varlen

# --- schedule_step ---------------------------------------------------------------------------

RULES = ("The rules: running requests first (oldest first), each scheduled num_new = min(tokens "
         "left to compute, budget) tokens once kv.allocate_slots(request, num_new) returns "
         "True; while it returns False, the newest running request is preempted by recompute "
         "(out of running, kv.free, num_computed_tokens 0, front of waiting) and the request "
         "asks again, unless it preempted itself, which ends the pass. Then, if nothing was "
         "preempted, waiting requests first come first served while fewer than max_num_seqs "
         "run: num_computed_tokens = kv.get_computed_tokens(request), num_new = min(tokens "
         "left, budget), admitted if allocate_slots returns True, else num_computed_tokens back "
         "to 0 and admitting stops. Every scheduled chunk adds its tokens to "
         "num_computed_tokens and takes them from the budget.")
BUDGET = ("The step scheduled more tokens than max_num_batched_tokens: every chunk, a "
          "decode's 1 token included, takes its tokens from the one budget, and each chunk is "
          "clipped to what is left of it. ")
REMAINING = ("A chunk runs past the request's last token: schedule at most what is left to "
             "compute, request.num_tokens - request.num_computed_tokens (a prefix hit or an "
             "earlier chunk already computed the rest). ")
AT_LEAST_ONE = ("A new request was given all of its tokens as computed, leaving nothing to "
                "compute: its prefix hit is kv.get_computed_tokens(request), which never "
                "counts the block that holds the last token (at least one token is always "
                "computed, so the step has a logit to sample from). ")
HIT = ("A new request did not start from its prefix hit: before allocate_slots, set its "
       "num_computed_tokens to kv.get_computed_tokens(request), the hit counted in tokens "
       "(whole blocks' worth of them, not a number of blocks); its chunk starts there. ")
RUNNING_FIRST = ("A waiting request was scheduled before a running one: running requests "
                 "(their decodes and unfinished prefill chunks) come first, waiting ones take "
                 "what budget is left. ")
ROOM = ("A request holds more blocks than its tokens so far need: ask "
        "kv.allocate_slots(request, num_new) for the num_new = min(tokens left, budget) tokens "
        "this step schedules, not for every token left; the others get their room in the "
        "steps that compute them (blocks taken early sit empty while other requests are "
        "preempted for want of them). ")
NEWEST = ("The request preempted was not the newest running one: while allocate_slots returns "
          "False, preempt the last of scheduler.running (admitted last, it loses the least "
          "work), then ask again. ")
FREE = ("A preempted request still holds its blocks: kv.free(request) gives them back to the "
        "pool, which is what preempting it is for (the request that asked for room finds it "
        "when it asks allocate_slots again). ")
RESET = ("A preempted request kept its num_computed_tokens: kv.free gave back its blocks, so "
         "its K/V are gone; set num_computed_tokens to 0 (it recomputes, from whatever prefix "
         "hit it finds when admitted again). ")
REFUSED = ("A waiting request that allocate_slots refused kept its prefix hit as "
           "num_computed_tokens: set it back to 0, since it holds no blocks and its hit may be "
           "gone by the time it is admitted (kv.get_computed_tokens finds it again then). ")
FRONT = ("A preempted request was not put at the front of waiting: it was admitted before "
         "every request waiting now, so it goes back first (waiting.appendleft) and is "
         "admitted again before them. ")
SELF_PREEMPTED = (
    "A request that preempted itself was asked for again or scheduled: when the request "
    "asking allocate_slots for room is the newest running one, preempting it leaves no "
    "running request to take blocks from; it now waits at the front of waiting, and the pass "
    "over the running requests ends. ")
ADMITTED_AFTER_PREEMPTION = (
    "A waiting request was admitted in a step that preempted: once a request is preempted, "
    "the pool is short of blocks, so no waiting request is admitted in that step (not even "
    "the one just preempted, whose freed blocks are still cached and would look like a "
    "prefix hit). ")
PASS_GOES_ON = (
    "A running request the rules schedule got nothing after another one was preempted: "
    "preempting the newest running request frees its blocks and ends nothing; the request "
    "that needed them asks allocate_slots again, is scheduled, and the pass goes on to the "
    "next running request while budget is left. Only a request that had to preempt itself "
    "(it was the newest) ends the pass. ")
FIRST_COME = ("A waiting request was admitted ahead of one that came before it: waiting "
              "requests are admitted first come first served, and when allocate_slots refuses "
              "the first of them, admitting stops (a later request does not jump the "
              "queue). ")
MAX_SEQS = ("More requests run than max_num_seqs allows: admit a waiting request only while "
            "fewer than max_num_seqs requests run. ")
MAX_STEPS = 400


def emitted_token(request: ChunkedRequest) -> int:
    """The token the simulated engine emits: fixed by the request and its output length."""
    return (7 * request.id + 13 * len(request.output) + 5) % 97


def held(scheduler: ChunkedScheduler, request_id: int) -> list[int] | None:
    """The request's block table in the scheduler's KV cache, or None if it holds none."""
    try:
        return list(scheduler.kv_cache.block_table(request_id))
    except KeyError:
        return None


def describe_state(scheduler: ChunkedScheduler) -> str:
    def one(r: ChunkedRequest) -> str:
        return f"{r.id} ({r.num_tokens} tokens, {r.num_computed_tokens} computed)"

    return (f"running [{', '.join(map(one, scheduler.running))}], waiting "
            f"[{', '.join(map(one, scheduler.waiting))}], {scheduler.kv_cache.num_free()} "
            f"free blocks of {scheduler.block_size}, budget {scheduler.max_num_batched_tokens}")


def summary(scheduler: ChunkedScheduler, plan: Schedule) -> dict:
    """What a step did, as plain data: chunks (id, start, tokens), preempted ids, each
    running and waiting request's (id, num_computed_tokens) in queue order, the free blocks,
    and the block table of every request that holds one."""
    chunks = [(c.request.id, c.start, c.num_tokens) for c in getattr(plan, "chunks", [])]
    queued = [*scheduler.running, *scheduler.waiting]
    return {"chunks": chunks, "preempted": list(getattr(plan, "preempted", [])),
            "running": [(r.id, r.num_computed_tokens) for r in scheduler.running],
            "waiting": [(r.id, r.num_computed_tokens) for r in scheduler.waiting],
            "free": scheduler.kv_cache.num_free(),
            "tables": {r.id: table for r in queued
                       if (table := held(scheduler, r.id)) is not None}}


def make_scheduler(scenario: dict) -> tuple[ChunkedScheduler, list[ChunkedRequest]]:
    scheduler = ChunkedScheduler(scenario["num_blocks"], scenario["block_size"],
                                 scenario["budget"], scenario.get("max_num_seqs", 64))
    requests = [ChunkedRequest(i, list(prompt), output_len, arrival)
                for i, (prompt, output_len, arrival) in enumerate(scenario["requests"])]
    return scheduler, requests


def begin_step(scheduler: ChunkedScheduler, requests: list[ChunkedRequest], scenario: dict,
               step: int) -> None:
    """Requests arriving at ``step`` join; from a step named in the scenario's
    ``budget_from`` (step -> budget) on, the budget is that one (an engine may lower its
    budget, and then fewer running requests fit in a step than are running)."""
    for request in requests:
        if request.arrival == step:
            scheduler.add(request)
    if step in scenario.get("budget_from", {}):
        scheduler.max_num_batched_tokens = scenario["budget_from"][step]


def simulate(scheduler: ChunkedScheduler, step: int, schedule: Callable,
             name: str = "schedule_step") -> tuple[Schedule, dict]:
    """One step of the simulated engine (arrivals already joined): ``schedule`` plans (and
    the scheduler caches the blocks its chunks complete), every request that computed all
    its tokens emits ``emitted_token``, done requests finish. Returns the plan and its
    summary (taken before tokens are emitted)."""
    plan = learner_call(name, scheduler.step, schedule)
    if not isinstance(plan, Schedule):
        raise AssertionError(f"{name}(scheduler) returned {type(plan).__name__}, expected a "
                             "Schedule")
    seen = summary(scheduler, plan)
    for chunk in plan.chunks:
        request = chunk.request
        if chunk.num_tokens > 0 and chunk.end == request.num_tokens and not request.done:
            request.emit(emitted_token(request))
    for request in list(scheduler.running):
        if request.done:
            scheduler.finish(request)
    return plan, seen


def snapshot(scheduler: ChunkedScheduler) -> dict:
    """What the diagnosis needs of the state before a step: each request's (num_tokens,
    num_computed_tokens, running), the queues' ids in order, the budget and the cap."""
    requests = {r.id: (r.num_tokens, r.num_computed_tokens, True) for r in scheduler.running}
    requests |= {r.id: (r.num_tokens, r.num_computed_tokens, False) for r in scheduler.waiting}
    return {"requests": requests, "running": [r.id for r in scheduler.running],
            "waiting": [r.id for r in scheduler.waiting],
            "budget": scheduler.max_num_batched_tokens, "max_num_seqs": scheduler.max_num_seqs}


def diagnose(before: dict, seen: dict, want: dict) -> str:
    """The idea a wrong step misses, read from what it did (``before``: the ``snapshot``
    before the step; ``want``: what the rules give)."""
    requests, chunks = before["requests"], seen["chunks"]
    if sum(n for _, _, n in chunks) > before["budget"]:
        return BUDGET
    if any(start + n > requests[i][0] for i, start, n in chunks if i in requests):
        return REMAINING
    admitted = [i for i, _, _ in chunks if i in requests and not requests[i][2]]
    if any(n <= 0 or start >= requests[i][0] for i, start, n in chunks if i in admitted):
        return AT_LEAST_ONE
    kinds = [requests[i][2] for i, _, _ in chunks if i in requests]
    if any(not a and b for a, b in zip(kinds, kinds[1:], strict=False)):
        return RUNNING_FIRST
    if seen["preempted"] and seen["preempted"][0] in before["running"] and \
            seen["preempted"][0] != before["running"][-1]:
        return NEWEST
    waiting_ids = [i for i, _ in seen["waiting"]]
    if any(i in waiting_ids and i in seen["preempted"] for i, _, _ in chunks):
        return SELF_PREEMPTED
    if any(i in seen["tables"] for i in waiting_ids):
        return FREE
    computed = dict(seen["waiting"])
    if any(computed.get(i, 0) != 0 for i in seen["preempted"]):
        return RESET
    scheduled = {i for i, _, _ in chunks}
    if any(n != 0 for i, n in seen["waiting"] if i not in seen["preempted"]
           and i not in scheduled):
        return REFUSED
    if seen["preempted"] and (admitted or any(i in seen["preempted"] for i in scheduled)):
        return ADMITTED_AFTER_PREEMPTION
    if admitted != before["waiting"][:len(admitted)]:
        return FIRST_COME
    if len(seen["running"]) > before["max_num_seqs"]:
        return MAX_SEQS
    starts = {i: start for i, start, _ in want["chunks"]}
    if any(i in starts and start != starts[i] for i, start, _ in chunks if i in admitted):
        return HIT
    wanted = want["tables"]
    if any(len(table) > len(wanted.get(i, table)) for i, table in seen["tables"].items()):
        return ROOM
    if seen["preempted"] and sorted(waiting_ids) == sorted(i for i, _ in want["waiting"]) \
            and waiting_ids != [i for i, _ in want["waiting"]]:
        return FRONT
    if seen["preempted"] == want["preempted"] and any(
            i not in scheduled and i not in seen["preempted"] and requests.get(i, (0, 0, 0))[2]
            for i, _, _ in want["chunks"]):
        return PASS_GOES_ON
    return ""


def diagnose_raised(scheduler: ChunkedScheduler, before: dict, raised: str) -> str:
    """The idea a step that raised misses, read from the state it left: a waiting request
    given a computed count that is not its prefix hit (all of its tokens, or another count),
    or a request that preempted itself and was asked for again (an empty list popped)."""
    for request in scheduler.waiting:
        computed = request.num_computed_tokens
        if computed and held(scheduler, request.id) is None:
            if computed == request.num_tokens:
                return AT_LEAST_ONE
            if computed != scheduler.kv_cache.get_computed_tokens(request):
                return HIT
    if "IndexError" in raised and not scheduler.running and before["running"]:
        return SELF_PREEMPTED
    return ""


def _changes(seen: dict, want: dict) -> str:
    """The block tables and free blocks of a step where they differ from the rules'."""
    text = ""
    if seen["free"] != want["free"]:
        text += f" {seen['free']} blocks free where the rules leave {want['free']};"
    if seen["tables"] != want["tables"]:
        text += (f" block tables {seen['tables']} where the rules give {want['tables']} "
                 "(request: blocks);")
    return text


def run_schedule(fn: Callable, scenario: dict, expected: list[dict] | Callable,
                 label: str) -> None:
    """Run ``fn`` on ``scenario`` step by step against ``expected`` (the summaries the rules
    give, or a function of the step and the state before it that gives one)."""
    scheduler, requests = make_scheduler(scenario)
    for step in range(MAX_STEPS):
        if step > max(r.arrival for r in requests) and not scheduler.busy():
            return
        begin_step(scheduler, requests, scenario, step)
        state = describe_state(scheduler)
        before = snapshot(scheduler)
        want = expected(step, scheduler) if callable(expected) else expected[step]
        try:
            _, seen = simulate(scheduler, step, fn)
        except LearnerRaised as raised:  # where, and in what state, as for a wrong answer
            try:
                hint = diagnose_raised(scheduler, before, str(raised))
            except Exception:  # a state the step left half-changed beyond reading
                hint = ""
            raise AssertionError(
                f"schedule_step(scheduler) {label}, step {step}, with {state}: {raised}; the "
                f"rules give {want['chunks']} (request, start, tokens), preempted "
                f"{want['preempted']}. {hint}{RULES}") from None
        if seen != want:
            try:
                hint = diagnose(before, seen, want)
            except Exception:  # a plan of other things than the rules' (ids, chunks)
                hint = ""
            raise AssertionError(
                f"schedule_step(scheduler) {label}, step {step}, with {state}: it scheduled "
                f"{seen['chunks']} (request, start, tokens), preempted {seen['preempted']}, "
                f"left running {seen['running']} and waiting {seen['waiting']} (request, "
                f"computed);{_changes(seen, want)} the rules give {want['chunks']}, preempted "
                f"{want['preempted']}, running {want['running']}, waiting {want['waiting']}. "
                f"{hint}{RULES}")
    raise AssertionError(f"schedule_step(scheduler) {label}: still busy after {MAX_STEPS} "
                         "steps. " + RULES)


SHARED = [1, 2, 3, 4, 5, 6, 7, 8]
SCENARIO = {  # blocks of 4; request 2's prompt is request 0's first 8 tokens
    "num_blocks": 7, "block_size": 4, "budget": 5,
    "requests": [(SHARED + [9, 10], 3, 0), ([20, 21, 22], 4, 0), (SHARED, 3, 3),
                 ([40] * 9, 6, 4)],
}


@visible
def check_schedule_step(fn: Callable) -> None:
    """Budget 5, blocks of 4, a pool of 7 blocks (6 besides the null block): a 10-token
    prompt chunked beside a short one, a later prompt that is its first 8 tokens (a prefix
    hit, the last block recomputed), and a long request that runs the pool out of blocks
    (preemption by recompute)."""
    expected = private("09").schedule_trace(SCENARIO)
    run_schedule(fn, SCENARIO, expected, "(budget 5, blocks of 4, 7 blocks)")


# --- varlen_paged_attention and varlen_attention_kernel --------------------------------------

ATTENTION_IDEA = ("Request r's queries are query[query_start_loc[r] : query_start_loc[r + 1]] "
                  "(q_len of them); its query j is at position seq_lens[r] - q_len + j and "
                  "attends, with scale x (q . k) and query head h reading KV head h // "
                  "(num_q_heads // num_kv_heads), over the request's keys 0 .. that position "
                  "(included), token t at block_tables[r, t // block_size], offset t % "
                  "block_size.")
MISTAKES = {
    "no_causal": ("It matches every query token attending over all seq_len keys: apply the "
                  "causal mask, a query token sees keys only up to its own position. "),
    "short": ("It matches each query token seeing keys 0 .. its position - 1: the token's "
              "own key (written this step) is included, position + 1 keys in all "
              "(an off-by-one in the context length). "),
    "long": ("It matches each query token seeing one key past its position: position + 1 "
             "keys in all, no more (an off-by-one in the context length). "),
    "packed": ("It matches positions taken from the packed query index t: the start offsets "
               "are per request, and a query token's position is seq_len - q_len + "
               "(t - query_start_loc[r]). "),
    "from_zero": ("It matches positions counted from 0 in each chunk: a chunk starts after "
                  "the request's cached tokens, at position seq_len - q_len. "),
    "from_key_0": ("It matches each query seeing its keys from key 0, where FIRST_KEY says "
                   "they start later: first = FIRST_KEY(context, window) is the first key a "
                   "query sees; start the block loop at first // BLOCK_SIZE and mask the "
                   "slots before first. "),
}
FIRST_KEY_IDEA = (" The kernel asks first = FIRST_KEY(context, window) for the first key a "
                  "query sees, and loops over blocks first // BLOCK_SIZE .. cdiv(context, "
                  "BLOCK_SIZE) - 1, masking slots before first or at or past context.")
NAN_READ = ("It has NaN: either it read a slot outside the query's keys (the pool holds NaN "
            "past a token's position and a request's end), or a block whose every slot is "
            "masked came first in its loop: all its scores are -inf, the running maximum "
            "stays -inf, and exp(-inf - (-inf)) is NaN. Loop over the blocks of the query's "
            "keys only, and mask loads and scores outside them. ")
_TOLERANCE = {torch.float32: (1e-5, 1e-4), torch.float16: (3e-3, 1e-2),
              torch.bfloat16: (2e-2, 5e-2)}  # (atol, rtol): where 16-bit arithmetic lands
# The exact answer rounded to the output's dtype, as fp32 arithmetic gives it: within one
# rounding (2^-10 relative for fp16, 2^-7 for bf16, at the bottom of a binade). Arithmetic in
# fp16 or bf16 misses by 50 times more on the hidden cases.
_ROUNDED = {torch.float32: (1e-5, 1e-4), torch.float16: (1e-4, 2**-10),
            torch.bfloat16: (1e-4, 2**-7)}
PRECISION = ("It is as close as attention computed in 16-bit arithmetic gets, not as close as "
             "fp32 arithmetic rounded once to the output's dtype: compute the scores, the "
             "softmax and the weighted sum in fp32 (cast the query, keys and values up) and "
             "cast only the output to the query's dtype. ")


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype,
           rounded: bool = False) -> bool:
    if rounded:
        atol, rtol = _ROUNDED[dtype]
    else:
        atol, rtol = (2e-3, 2e-3) if dtype == torch.float32 and on_gpu() else _TOLERANCE[dtype]
    return torch.allclose(got.double().cpu(), want.double().cpu(), atol=atol, rtol=rtol,
                          equal_nan=True)


def compare_attention(out, case: VarlenCase, name: str, answers: dict,
                      rounded: bool = False) -> None:
    """``out`` against ``answers["want"]``, within 16-bit arithmetic's error of it, or, where
    fp32 arithmetic is asked for (``rounded``), within one rounding; a wrong one is matched
    against the known mistakes in ``answers`` (each query token's rows as that mistake
    computes them)."""
    shape = tuple(case.query.shape)
    idea = ATTENTION_IDEA + (FIRST_KEY_IDEA if case.from_key is not None else "")
    expect_attention_output(out, f"{name}(...)", case.describe(), case.query,
                            layout=" (one row per packed query token)", idea=idea)
    want = answers["want"]
    bad = [t for t in range(shape[0]) if out[t].isnan().any()
           or not _close(out[t], want[t], case.dtype, rounded)]
    if not bad:
        return
    starts = case.query_start_loc.tolist()
    request = next(r for r in range(len(case.q_lens)) if starts[r] <= bad[0] < starts[r + 1])
    def matches(wrong: torch.Tensor | None) -> bool:
        """Where the mistake sees no key at all (its row is NaN), any value goes."""
        defined = [t for t in bad if wrong is not None and not wrong[t].isnan().any()]
        return bool(defined) and all(_close(out[t], wrong[t], case.dtype) for t in defined)

    hint = next((text for key, text in MISTAKES.items() if matches(answers.get(key))), "")
    if not hint and out.isnan().any():
        hint = NAN_READ
    if not hint and all(_close(out[t], want[t], case.dtype) for t in bad):
        hint = PRECISION
    raise AssertionError(
        f"{name}(...) on {case.describe()}: packed query token {bad[0]} (request {request}, "
        f"its query {bad[0] - starts[request]} of {case.q_lens[request]}, context "
        f"{case.lengths[request]}) is wrong ({len(bad)} of {shape[0]} tokens are). "
        f"{hint}{idea}")


def ask_attention(case: VarlenCase) -> dict:
    """The expected output of ``case`` and what known mistakes give, asked first."""
    return private("09").attention_answers(**case.spec())


VISIBLE_CASE = dict(q_lens=[3, 1, 2], seq_lens=[6, 5, 2], block_size=4, q_heads=4,
                    kv_heads=2, head_dim=8)


@visible
def check_varlen_paged_attention(fn: Callable) -> None:
    """Three requests, blocks of 4, 4 query heads over 2 KV heads: a chunk of 3 new tokens
    after 3 cached ones, a decode (context 5), a fresh 2-token prompt."""
    case = VarlenCase(**VISIBLE_CASE)
    answers = ask_attention(case)
    out = learner_call("varlen_paged_attention", fn, *case.arguments())
    compare_attention(out, case, "varlen_paged_attention", answers, rounded=True)


def _table_finding(audit: MemoryAudit, case: VarlenCase) -> str:
    """The first block-table read of a program (query token, KV head) outside its own
    request's row, past the blocks its context needs (the causal mask), or before the block
    of the first key it sees."""
    stride, positions = case.tables.stride(0), case.positions()
    for access, offsets, inside in audit.touching(case.tables, "load"):
        token = access.program[0]
        request, position = positions[token]
        first = case.first_key(position)
        lo, needed = first // case.block_size, -(-(position + 1) // case.block_size)
        for offset in offsets[inside]:
            row, column = divmod(int(offset), stride)
            if row == request and lo <= column < needed:
                continue
            return (f"program (query token {token}, KV head {access.program[1]}) read "
                    f"block_tables[{row}, {column}]; its query is request {request}'s token at "
                    f"position {position}, so it attends to keys {first} .. {position}: blocks "
                    f"{lo} .. {needed - 1} of its request's row, first // BLOCK_SIZE to "
                    "cdiv(context, BLOCK_SIZE) - 1; every key outside them is masked, so "
                    "looping over the request's other blocks changes no number, only wastes "
                    "their loads (for a long prompt's first chunks, most of the work; for a "
                    "sliding window, the blocks its cache has given back)")
    return ""


def kernel_audit(audit: MemoryAudit, case: VarlenCase, out) -> str:
    """What the interpreter saw the kernel do wrong ('' if nothing): a store outside
    ``out``, or outside the program's own rows of it (out[token, the KV head's GROUP query
    heads]), a block-table read past what the token's context needs."""
    if not audit.active or not isinstance(out, torch.Tensor) or \
            out.shape != case.query.shape or not out.is_contiguous():
        return ""
    group = case.q_heads // case.kv_heads

    def who(program):
        return f"program (query token {program[0]}, KV head {program[1]})"

    def owns(program, index):
        token, head = index[0], index[1]
        return (token == program[0]) & (head >= program[1] * group) & \
            (head < (program[1] + 1) * group)

    found = store_finding(audit, out, owns, who, "out", group, case.head_dim)
    strays = audit.stray_loads([out], "store")
    if not found and strays:  # the fence dropped it: only out is written
        access, address = strays[0]
        found = (f"{who(access.program)} wrote outside out ({nearest({'out': out}, address)}"
                 "): a store's mask leaves out the padded rows >= GROUP and columns >= "
                 "HEAD_DIM")
    return found or _table_finding(audit, case)


def run_kernel(fn: Callable, case: VarlenCase, answers: dict) -> None:
    """The kernel through the launcher (its first key ``all_keys``, or ``keys_from`` the
    case's ``from_key``), fenced in on the interpreter (a store past every argument is
    dropped, not performed, so a wild kernel fails here instead of corrupting the process),
    then its output and what each program touched."""
    first_key = all_keys if case.from_key is None else keys_from
    with MemoryAudit() as audit, quiet():
        out = learner_call("varlen_attention_kernel", launch_varlen, fn, *case.arguments(),
                           case.from_key or 0, first_key)
    seen = kernel_audit(audit, case, out)
    try:
        compare_attention(out, case, "varlen_attention_kernel", answers)
    except AssertionError as wrong:
        if not seen:
            raise
        raise AssertionError(f"{wrong} The interpreter also saw this: {seen}.") from None
    if seen:
        raise AssertionError(f"varlen_attention_kernel(...) on {case.describe()}: the output "
                             f"is right, but {seen}. " + ATTENTION_IDEA
                             + (FIRST_KEY_IDEA if case.from_key is not None else ""))


KERNEL_CASE = dict(q_lens=[3, 1, 2], seq_lens=[6, 5, 2], block_size=4, q_heads=4,
                   kv_heads=2, head_dim=12)
FROM_KEY_CASE = dict(q_lens=[3, 1, 2], seq_lens=[10, 9, 2], block_size=4, q_heads=4,
                     kv_heads=2, head_dim=12, from_key=5)


@visible
def check_varlen_attention_kernel(fn: Callable) -> None:
    """The same three requests through the kernel, head_dim 12 (padded to 16, masked), its
    first key 0 (``all_keys``); then contexts of 10, 9 and 2 with each query seeing its keys
    from key 5 on (its loop from block 1, key 4 masked; the short request's queries see their
    own keys alone)."""
    device = "cuda" if on_gpu() else "cpu"
    for spec in (KERNEL_CASE, FROM_KEY_CASE):
        case = VarlenCase(**spec, device=device)
        run_kernel(fn, case, ask_attention(case))


# --- engine_step -----------------------------------------------------------------------------

STEP_IDEA = ("At every layer: q, k, v = model.qkv(layer, x, batch.positions) (each token at "
             "its true position in its request); the layer's attention, engine.attend(layer, "
             "q, k, v, batch) with that layer's number, which writes k, v at the batch's "
             "slots and attends over that layer's own paged cache; finish the layer. Then "
             "the logits of each chunk's last row (query_start_loc[r + 1] - 1), and an "
             "emitted token only where the chunk ends at the request's last known token.")
SAMPLE_ONLY = ("A request emitted a token after a chunk that ends before its last known "
               "token: its tokens after the chunk (the rest of its prompt, or, recomputed "
               "after a preemption, the tokens it had generated) are not computed yet, so "
               "there is nothing to sample; emit only where chunk.end == "
               "chunk.request.num_tokens. ")
SAMPLE_WHERE_DONE = ("A request whose chunk ends at its last known token emitted nothing: "
                     "that chunk's last row gives the next token. ")
STEP_NAN = ("NaN: attention read a slot nothing wrote: each layer's attention writes its "
            "own K/V before it reads them, so give engine.attend that layer's number and its "
            "own q, k, v. ")
LAST_ROW = ("Its logits are those of the chunk's first token: take each chunk's last row, "
            "batch.query_start_loc[1:] - 1. ")
LOGITS_TOLERANCE = 1e-4


def per_token_decode(query, k_cache, v_cache, query_start_loc, seq_lens, block_tables,
                     scale):
    """The checks' attention for the engine step: every query token a decode of its own
    (chapter 6's ``paged_decode_attention``, context up to the token's position)."""
    from kernels.paged_attention_ref import paged_decode_attention

    q_lens = (query_start_loc[1:] - query_start_loc[:-1]).long()
    owner = torch.repeat_interleave(torch.arange(len(q_lens), device=q_lens.device), q_lens)
    offset = torch.arange(query.shape[0], device=q_lens.device) - query_start_loc[:-1].long()[owner]
    context = seq_lens.long()[owner] - q_lens[owner] + offset + 1
    return paged_decode_attention(query, k_cache, v_cache, block_tables[owner], context.int(),
                                  scale)


def chunks_of(size: int) -> Callable:
    """The checks' own scheduling for the engine step: every running request its next
    ``size`` tokens, every waiting request admitted at once with its prefix hits."""

    def schedule(scheduler: ChunkedScheduler) -> Schedule:
        plan, kv = Schedule(), scheduler.kv_cache

        def next_chunk(request: ChunkedRequest) -> None:
            count = min(size, request.num_tokens - request.num_computed_tokens)
            if not kv.allocate_slots(request, count):
                raise RuntimeError("the checks' pool is too small for their requests")
            plan.chunks.append(Chunk(request, request.num_computed_tokens, count))
            request.num_computed_tokens += count

        for request in scheduler.running:
            next_chunk(request)
        while scheduler.waiting:  # each admitted from its hit, its room taken at once
            request = scheduler.waiting.popleft()
            request.num_computed_tokens = kv.get_computed_tokens(request)
            next_chunk(request)
            scheduler.running.append(request)
        return plan

    return schedule


class WatchedEngine(ChunkedEngine):
    """A ChunkedEngine that checks, after every model step, that exactly the requests whose
    chunk ended at their last known token emitted one token."""

    label = ""

    def step(self) -> Schedule:
        before = {}
        plan = self.scheduler.step(self.schedule)
        for chunk in plan.chunks:
            request = chunk.request
            before[request.id] = (request, chunk, request.num_tokens, len(request.output))
        if plan.chunks:
            learner_call("engine_step", self.model_step, self, plan)
        for request, chunk, num_tokens, emitted in before.values():
            where = (f"engine_step(engine, plan) {self.label}, step {self.steps}: request "
                     f"{request.id}'s chunk computed positions {chunk.start} .. "
                     f"{chunk.end - 1} of its {num_tokens} tokens")
            if chunk.end < num_tokens and len(request.output) != emitted:
                raise AssertionError(f"{where}. {SAMPLE_ONLY}{STEP_IDEA}")
            if chunk.end == num_tokens and len(request.output) != emitted + 1:
                raise AssertionError(f"{where}. {SAMPLE_WHERE_DONE}{STEP_IDEA}")
        self.steps += 1
        return plan


def compare_runs(model, finished: list, requests: list, label: str) -> None:
    """Every request's tokens and logits against its own contiguous run."""
    from course.tiny_model import generate_contiguous

    by_id = {r.id: r for r in finished}
    for request in requests:
        got = by_id.get(request.id)
        if got is None:
            raise AssertionError(f"engine_step(...) {label}: request {request.id} never "
                                 f"finished. {STEP_IDEA}")
        tokens, logits = generate_contiguous(model, request.prompt, request.output_len)
        for index, (a, b) in enumerate(zip(got.logits, logits, strict=False)):
            a = a if isinstance(a, torch.Tensor) else torch.full_like(b, float("nan"))
            if a.shape == b.shape and not a.isnan().any() and torch.allclose(
                    a.to(b.device), b, atol=LOGITS_TOLERANCE, rtol=LOGITS_TOLERANCE):
                continue
            hint = STEP_NAN if a.isnan().any() else ""
            if not hint and index == 0 and len(request.prompt) > 1:
                first_row = generate_contiguous(model, request.prompt[:1], 1)[1][0]
                rows = [generate_contiguous(model, request.prompt[:n], 1)[1][0]
                        for n in range(1, len(request.prompt))]
                if a.shape == first_row.shape and any(
                        torch.allclose(a.to(r.device), r, atol=LOGITS_TOLERANCE,
                                       rtol=LOGITS_TOLERANCE) for r in rows):
                    hint = LAST_ROW
            raise AssertionError(
                f"engine_step(...) {label}: request {request.id} (prompt of "
                f"{len(request.prompt)} tokens) generated {got.output[:index + 1]}..., its "
                f"contiguous run {tokens[:index + 1]}...; the logits of output token {index} "
                f"differ. {hint}{STEP_IDEA}")


def run_engine(fn: Callable, specs: list[tuple], block_size: int, num_blocks: int,
               budget: int, schedule: Callable | None, attention: Callable, label: str,
               device: str = "cpu") -> None:
    model = TinyModel(seed=SEED, device=device)
    opened(attention)  # the learner's step calls the attention it is given
    engine = WatchedEngine(model, num_blocks, block_size, budget, attention=attention,
                           schedule=schedule, step=fn)
    engine.label = label
    requests = engine_requests(specs)
    finished = serve_chunked(engine, requests, max_steps=2_000)
    compare_runs(model, finished, requests, label)
    if engine.kv_cache.num_held():
        raise AssertionError(f"engine_step(...) {label}: after serving, "
                             f"{engine.kv_cache.num_held()} blocks are still held.")


ENGINE_SPECS = [([3, 14, 15, 92, 65, 35], 4, 0), ([8, 9, 7, 9], 3, 1),
                ([3, 14, 15, 92, 11, 12, 13], 3, 3)]


@visible
def check_engine_step(fn: Callable) -> None:
    """Three requests (the third sharing the first one's first block of 4), chunks of at
    most 3 tokens, against contiguous generation."""
    run_engine(fn, ENGINE_SPECS, 4, 16, 64, chunks_of(3), per_token_decode,
               "(chunks of at most 3 tokens, blocks of 4, a shared first block)")
