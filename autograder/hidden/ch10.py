"""Chapter 10's hidden checks: seeded random models, hypothesis-drawn tables and cached sets,
and attention cases through chapter 9's kernel, each checked against an oracle written another
way (per layer and token, per slot and position, a search over every hit length, query token
by query token over the keys as written), and the known mistakes a hint names.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
from hypothesis import strategies as st

from autograder.checks._contract import INT, expect_cases
from autograder.checks._helpers import for_all, mistakes
from autograder.checks._lending import one_bug_one_todo_of_function
from autograder.checks.ch10 import (
    BYTES_IDEA,
    FREE_IDEA,
    FREED_AND_TABLE,
    HYBRID_HIT_IDEA,
    SLIDING_HIT_IDEA,
    SLIDING_HIT_LENT,
    WINDOW_CASE,
    _bytes,
    _free,
    _hybrid,
    _sliding,
    freeing,
    run_window_kernel,
    window_case,
)
from autograder.private import thorough
from course.experiments.hybrid_models import FULL, SLIDING, STATE, HybridModel, LayerGroup
from course.notebook.paged_cases import WindowCase, on_gpu
from course.v1 import hybrid_cache

SEED = 2026  # random cases are seeded: grading a notebook twice gives the same score


# --- request_bytes ----------------------------------------------------------------------------


def _kept(group: LayerGroup, num_tokens: int) -> int:
    """Elements one layer of ``group`` keeps for a request of ``num_tokens`` tokens, counted
    token by token: the positions its next query still sees."""
    if group.kind == STATE:
        return group.state_elements if num_tokens else 0
    first = 0 if group.kind == FULL else max(0, num_tokens - group.window)
    return sum(2 * group.num_kv_heads * group.head_dim for _ in range(first, num_tokens))


def _per_token(group: LayerGroup) -> int:
    return 2 * group.num_layers * group.num_kv_heads * group.head_dim


_BYTES_MISTAKES = [
    (lambda model, num_tokens, bytes_per_element: sum(
        num_tokens * _per_token(g) if g.kind != STATE else g.num_layers * g.state_elements
        for g in model.groups if num_tokens) * bytes_per_element,
     "A sliding-window layer keeps only its window's last tokens: its cost stops growing at "
     "the window."),
    (lambda model, num_tokens, bytes_per_element: sum(
        (num_tokens if g.kind == FULL else min(num_tokens, g.window or 0)) * _per_token(g)
        for g in model.groups) * bytes_per_element,
     "A state layer keeps one fixed-size state per request: it counts too."),
    (lambda model, num_tokens, bytes_per_element: sum(
        num_tokens * g.num_layers * g.state_elements if g.kind == STATE else
        (num_tokens if g.kind == FULL else min(num_tokens, g.window)) * _per_token(g)
        for g in model.groups) * bytes_per_element,
     "A state does not grow with the request: one per layer, whatever its length."),
    (lambda model, num_tokens, bytes_per_element: sum(
        g.num_layers * g.state_elements if g.kind == STATE else
        (num_tokens if g.kind == FULL else min(num_tokens, g.window)) * _per_token(g)
        for g in model.groups) * bytes_per_element,
     "A request of no tokens has no state yet: it holds nothing."),
    (lambda model, num_tokens, bytes_per_element: sum(
        g.state_elements if g.kind == STATE else
        (num_tokens if g.kind == FULL else min(num_tokens, g.window)) * _per_token(g)
        for g in model.groups if num_tokens) * bytes_per_element,
     "Every layer of a state group keeps a state of its own."),
]


def request_bytes_case(**case) -> tuple:
    model, n, bpe = case["model"], case["num_tokens"], case["bytes_per_element"]
    expected = sum(g.num_layers * _kept(g, n) for g in model.groups) * bpe
    return expected, mistakes(_BYTES_MISTAKES, case)


def _random_model(rng: random.Random) -> HybridModel:
    groups = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice([FULL, SLIDING, STATE])
        if kind == STATE:
            groups.append(LayerGroup(STATE, rng.randint(1, 40),
                                     state_elements=rng.randint(1, 2_000_000)))
        else:
            groups.append(LayerGroup(kind, rng.randint(1, 60), rng.randint(1, 16),
                                     rng.choice([32, 64, 80, 128, 256]),
                                     window=rng.choice([1, 2, 7, 128, 1024, 4096])
                                     if kind == SLIDING else None))
    return HybridModel(f"random model {rng.randint(0, 999)}", tuple(groups), 1 << 20,
                       "drawn")


@thorough
def check_request_bytes_thoroughly(fn: Callable) -> None:
    """Seeded random models of one to three groups, lengths on either side of each window,
    fp8 and fp32."""
    rng = random.Random(SEED)
    cases = []
    for _ in range(60):
        model = _random_model(rng)
        windows = [g.window for g in model.groups if g.window] or [100]
        around = rng.choice(windows) + rng.choice([-1, 0, 1])
        length = rng.choice([0, 1, max(0, around), rng.randint(0, 200_000)])
        cases.append(_bytes(model, length, rng.choice([1, 2, 4])))
    expect_cases(fn, cases, request_bytes_case, BYTES_IDEA)


# --- free_skipped_blocks ----------------------------------------------------------------------


def _freed_oracle(table: list[int], num_computed: int, window: int,
                  block_size: int) -> tuple[list[int], list[int]]:
    """Slot by slot: a slot goes null when no position in it is seen by the query at position
    ``num_computed`` (positions ``num_computed - window + 1`` on)."""
    first_seen = num_computed - window + 1
    after, freed = [], []
    for index, block in enumerate(table):
        positions = range(index * block_size, (index + 1) * block_size)
        if all(p < first_seen for p in positions):
            if block != hybrid_cache.NULL_BLOCK:
                freed.append(block)
            after.append(hybrid_cache.NULL_BLOCK)
        else:
            after.append(block)
    return freed, after


def _skipped(num_computed, window):
    return max(0, num_computed - window + 1)


def _free_with(whole: Callable[[int, int, int], int], keep_null: bool = True,
               give_null: bool = False, shorten: bool = False) -> Callable:
    def wrong(table, num_computed, window, block_size):
        count = min(whole(num_computed, window, block_size), len(table))
        freed = [b for b in table[:count] if give_null or b != hybrid_cache.NULL_BLOCK]
        after = table[count:] if shorten else [hybrid_cache.NULL_BLOCK] * count + table[count:]
        return freed, after if keep_null or shorten else table
    return wrong


def _free_back_to_the_first_null(table, num_computed, window, block_size):
    """From the last skipped block back to the first null slot met."""
    count = min(_skipped(num_computed, window) // block_size, len(table))
    freed, after = [], list(table)
    for index in range(count - 1, -1, -1):
        if table[index] == hybrid_cache.NULL_BLOCK:
            break
        freed.insert(0, table[index])
        after[index] = hybrid_cache.NULL_BLOCK
    return freed, after


_FREE_MISTAKES = [
    (_free_with(lambda n, w, b: -(-_skipped(n, w) // b)),
     "A block goes back only when all its tokens are out of the window: a block the window "
     "still partly sees is needed."),
    (_free_with(lambda n, w, b: max(0, n - w) // b),
     "Off by one: the next token (position num_computed) sees its window's window - 1 tokens "
     "before it, so the first num_computed - window + 1 are out."),
    (_free_with(lambda n, w, b: max(0, n - w + 2) // b),
     "Off by one: the next token (position num_computed) sees its window's window - 1 tokens "
     "before it, so the first num_computed - window + 1 are out."),
    (_free_with(lambda n, w, b: _skipped(n, w) // b, shorten=True),
     "The table keeps its length: a freed block's slot holds the null block, so that a "
     "logical block's index still names the same tokens."),
    (_free_with(lambda n, w, b: _skipped(n, w) // b, give_null=True),
     "A slot that already holds the null block gives nothing back: the null block is never "
     "freed."),
    (_free_with(lambda n, w, b: _skipped(n, w) // b, keep_null=False),
     "The table itself changes: each freed block's slot holds the null block."),
    (_free_back_to_the_first_null,
     "Every skipped block goes back, wherever a null block stands among them: a null slot "
     "gives nothing, and the blocks before it still go. (vLLM's remove_skipped_blocks may "
     "stop at the first null it meets walking back, since its null blocks only ever stand at "
     "the front of a table; this function's contract is every block.)"),
]


def free_case(**case) -> tuple:
    expected = _freed_oracle(**case)
    known = [(None if value is None else (list(value[0]), list(value[1])), text)
             for value, text in mistakes(_FREE_MISTAKES, case)]
    return expected, known


@st.composite
def _freeing_cases(draw):
    block_size = draw(st.sampled_from([1, 2, 3, 4, 5, 16]))
    window = draw(st.one_of(st.sampled_from([1, 2, block_size, block_size + 1]),
                            st.integers(1, 40)))
    length = draw(st.integers(0, 12))
    blocks = draw(st.lists(st.integers(1, 500), min_size=length, max_size=length, unique=True))
    nulls = draw(st.integers(0, length))  # a run from the front, as a hit leaves them
    scattered = draw(st.sets(st.integers(0, max(length - 1, 0)), max_size=2))
    table = [hybrid_cache.NULL_BLOCK if i < nulls or i in scattered else block
             for i, block in enumerate(blocks)]
    k = draw(st.integers(0, length + 1))
    edge = k * block_size + window - 1  # the first block's last token leaves the window here
    computed = draw(st.one_of(st.sampled_from([max(0, edge - 1), edge, edge + 1]),
                              st.integers(0, (length + 1) * block_size + window)))
    return _free(table, computed, window, block_size)


@thorough
def check_free_skipped_blocks_thoroughly(fn: Callable) -> None:
    """Drawn tables (null blocks already in place, at the front and anywhere), windows and
    block sizes, lengths on either side of each block boundary."""
    for_all(_freeing_cases(), lambda case: expect_cases(
        freeing(fn), [case], free_case, FREE_IDEA, promise=FREED_AND_TABLE))


# --- sliding_window_hit -----------------------------------------------------------------------


def _accepts(cached: set[int], length: int, block_size: int, window: int | None) -> bool:
    """Whether a group accepts a hit of ``length`` tokens: every block holding a token that the
    query at position ``length`` reads, before it, is cached."""
    first = 0 if window is None else max(0, length - window + 1)
    return all(p // block_size in cached for p in range(first, length))


def _longest(cached: set[int], max_length: int, block_size: int, window: int | None) -> int:
    return next(length for length in range(max_length // block_size * block_size, -1,
                                           -block_size)
                if _accepts(cached, length, block_size, window))


def _hit_reading(needed: Callable[[int, int], int], from_start: bool = True,
                 left_to_right: bool = False) -> Callable:
    """A sliding hit that needs ``needed(window, block_size)`` cached blocks before it; the
    last run of them, or the first (``left_to_right``); a run from block 0 when none is found
    (``from_start``)."""
    def wrong(cached, max_length, block_size, window):
        need, last = needed(window, block_size), max_length // block_size
        if need <= 0:
            return last * block_size
        ends = [end for end in range(need, last + 1)
                if all(b in cached for b in range(end - need, end))]
        if ends:
            return (ends[0] if left_to_right else ends[-1]) * block_size
        run = 0
        while from_start and run < last and run in cached:
            run += 1
        return run * block_size
    return wrong


_SLIDING_MISTAKES = [
    (lambda cached, max_length, block_size, window:
        hybrid_cache.full_attention_hit(cached, max_length, block_size),
     "That is full attention's hit: a sliding window needs only the blocks just before the "
     "hit, read right to left."),
    (_hit_reading(lambda w, b: w // b),
     "The window of the hit's first computed token holds window - 1 tokens before it: "
     "ceil((window - 1) / block_size) blocks, not window // block_size."),
    (_hit_reading(lambda w, b: -(-w // b)),
     "The window of the hit's first computed token holds window - 1 tokens before it: "
     "ceil((window - 1) / block_size) blocks, not ceil(window / block_size)."),
    (_hit_reading(lambda w, b: -(-(w - 1) // b), from_start=False),
     "A run of cached blocks that reaches block 0 is a hit however short: nothing before it "
     "is missing."),
    (_hit_reading(lambda w, b: -(-(w - 1) // b), left_to_right=True),
     "Read right to left from the last whole block within max_length: the longest hit is "
     "the last run, not the first."),
]


def sliding_case(**case) -> tuple:
    expected = _longest(case["cached"], case["max_length"], case["block_size"], case["window"])
    return expected, mistakes(_SLIDING_MISTAKES, case)


@st.composite
def _cached_sets(draw, blocks: int):
    """Sparse sets, or dense ones (every block but a few holes), where hits are long and a
    group's answer changes with the length asked."""
    drawn = set(draw(st.lists(st.integers(0, max(0, blocks - 1)), max_size=blocks)))
    return drawn if draw(st.booleans()) else set(range(blocks)) - drawn


@st.composite
def _sliding_cases(draw):
    block_size = draw(st.sampled_from([1, 2, 3, 4, 8]))
    blocks = draw(st.integers(0, 12))
    window = draw(st.one_of(st.sampled_from([1, 2, block_size, block_size + 1,
                                             2 * block_size + 1]), st.integers(1, 40)))
    max_length = blocks * block_size + draw(st.integers(0, block_size - 1))
    return _sliding(draw(_cached_sets(blocks)), max_length, block_size, window)


@thorough
def check_sliding_window_hit_thoroughly(fn: Callable) -> None:
    """Drawn cached sets, windows of 1 to 40, blocks of 1 to 8, lengths that are not whole
    blocks."""
    for_all(_sliding_cases(), lambda case: expect_cases(
        fn, [case], sliding_case, SLIDING_HIT_IDEA, rel_tol=0, promise=INT))


# --- hybrid_hit -------------------------------------------------------------------------------


def _group_hit(cached, length, block_size, window):
    return (hybrid_cache.full_attention_hit(cached, length, block_size) if window is None
            else hybrid_cache.sliding_window_hit(cached, length, block_size, window))


_HYBRID_MISTAKES = [
    (lambda groups, num_tokens, block_size: min(
        _group_hit(c, (num_tokens - 1) // block_size * block_size, block_size, w)
        for c, w in groups),
     "A group's answer depends on the length it is asked about: ask again at the shorter "
     "length, until a whole pass changes nothing."),
    (lambda groups, num_tokens, block_size: _fixed_point(groups, num_tokens // block_size
                                                         * block_size, block_size),
     "The last token is always computed (its logits give the next token): the hit stops at "
     "the last whole block before it."),
    (lambda groups, num_tokens, block_size: _fixed_point(
        [g for g in groups if g[1] is None] or groups, (num_tokens - 1) // block_size
        * block_size, block_size),
     "Every group must accept the hit, the sliding-window groups too."),
]


def _fixed_point(groups, length, block_size):
    while True:
        shorter = length
        for cached, window in groups:
            shorter = _group_hit(cached, shorter, block_size, window)
        if shorter == length:
            return length
        length = shorter


def hybrid_case(**case) -> tuple:
    groups, n, size = case["groups"], case["num_tokens"], case["block_size"]
    expected = next(length for length in range((n - 1) // size * size, -1, -size)
                    if all(_accepts(cached, length, size, window) for cached, window in groups))
    return expected, mistakes(_HYBRID_MISTAKES, case)


@st.composite
def _hybrid_cases(draw):
    block_size = draw(st.sampled_from([1, 2, 3, 4, 8]))
    num_tokens = draw(st.integers(1, 80))
    blocks = -(-num_tokens // block_size)
    groups = []
    for _ in range(draw(st.integers(1, 3))):
        window = draw(st.one_of(st.none(), st.sampled_from([block_size + 1, 2 * block_size,
                                                            2 * block_size + 1]),
                                st.integers(1, 30)))
        groups.append((draw(_cached_sets(blocks)), window))
    return _hybrid(groups, num_tokens, block_size)


@thorough
def check_hybrid_hit_thoroughly(fn: Callable) -> None:
    """One to three groups of drawn cached sets and windows, blocks of 1 to 8, requests of 1
    to 80 tokens, against a search over every length."""
    one_bug_one_todo_of_function(
        lambda subject: for_all(_hybrid_cases(), lambda case: expect_cases(
            subject, [case], hybrid_case, HYBRID_HIT_IDEA, rel_tol=0, promise=INT),
            max_examples=300),
        fn, SLIDING_HIT_LENT)


# --- window_first_key -------------------------------------------------------------------------

_WINDOW_MISTAKES = {
    "whole": "It matches every query seeing all its earlier keys: a window sees only its last "
             "window keys, from max(context - window, 0) on. ",
    "short": "It matches each query seeing window - 1 keys: the window holds window keys, the "
             "query's own included, so the first is context - window (context = position + "
             "1), not context - window + 1. ",
    "long": "It matches each query seeing window + 1 keys: the window holds window keys, the "
            "query's own included, so the first is context - window, not context - window - "
            "1. ",
}


def window_answers(q_lens, seq_lens, block_size, q_heads, kv_heads, window, head_dim, dtype,
                   seed) -> dict:
    """The case's output, query token by query token over the keys of the positions its window
    sees (float64, from the keys as written, not through the table), and what each known
    mistake gives (None where it agrees with the right answer; a row NaN where the mistake
    sees no key)."""
    case = WindowCase(q_lens, seq_lens, block_size, q_heads, kv_heads, window, head_dim, dtype,
                      seed)
    group = q_heads // kv_heads
    seen = {"want": window, "whole": None, "short": window - 1, "long": window + 1}
    answers: dict = {"mistakes": _WINDOW_MISTAKES}
    for kind, width in seen.items():
        rows = []
        for token, (request, position) in enumerate(case.positions()):
            first = 0 if width is None else max(0, position + 1 - width)
            keys = case.keys[request][first:position + 1].double()
            values = case.values[request][first:position + 1].double()
            query = case.query[token].double().cpu()
            row = torch.full((q_heads, head_dim), float("nan"), dtype=torch.float64)
            for head in range(q_heads if len(keys) else 0):
                weights = torch.softmax(keys[:, head // group] @ query[head] * case.scale, 0)
                row[head] = weights @ values[:, head // group]
            rows.append(row)
        answers[kind] = torch.stack(rows).to(case.dtype)
    for kind in _WINDOW_MISTAKES:
        if torch.equal(answers[kind].nan_to_num(7.0), answers["want"].nan_to_num(7.0)):
            answers[kind] = None
    return answers


_WINDOW_CASES = [
    dict(q_lens=[1, 2, 5, 9], seq_lens=[1, 2, 5, 9], block_size=1, q_heads=2, kv_heads=2,
         window=3, head_dim=8),
    dict(q_lens=[1, 7, 5], seq_lens=[20, 7, 33], block_size=4, q_heads=4, kv_heads=1,
         window=1, head_dim=24),
    dict(q_lens=[1, 17, 16, 1], seq_lens=[40, 17, 16, 1], block_size=16, q_heads=8,
         kv_heads=2, window=16, head_dim=16),
    dict(q_lens=[3, 1, 29], seq_lens=[30, 31, 29], block_size=2, q_heads=6, kv_heads=3,
         window=9, head_dim=20, dtype="float16"),
    dict(q_lens=[1, 3], seq_lens=[50, 3], block_size=8, q_heads=4, kv_heads=4, window=100,
         head_dim=32),
    dict(q_lens=[6, 13], seq_lens=[26, 13], block_size=4, q_heads=4, kv_heads=2, window=7,
         head_dim=12, dtype="float16"),
]
_GPU_CASES = [  # bf16 (the interpreter has no bf16 arithmetic), and production shapes:
    # gpt-oss's sliding layers (window 128, head_dim 64, GQA 8), Gemma 3's (window 1024)
    dict(q_lens=[6, 13], seq_lens=[26, 13], block_size=4, q_heads=4, kv_heads=2, window=7,
         head_dim=12, dtype="bfloat16"),
    dict(q_lens=[1, 130, 1, 1], seq_lens=[4096, 130, 127, 1], block_size=16, q_heads=64,
         kv_heads=8, window=128, head_dim=64, dtype="bfloat16"),
    dict(q_lens=[512, 1], seq_lens=[2048, 1500], block_size=16, q_heads=32, kv_heads=16,
         window=1024, head_dim=128, dtype="float16"),
]


@thorough
def check_window_first_key_thoroughly(fn: Callable) -> None:
    """Blocks of 1, windows of 1 and past every length, MQA and GQA, head sizes 8 to 32, fp16,
    prompts shorter than their window, chunks and decodes on either side of a block and a
    window; on a GPU, bf16 and gpt-oss's and Gemma 3's sliding-layer shapes too."""
    for spec in [WINDOW_CASE, *_WINDOW_CASES, *(_GPU_CASES if on_gpu() else [])]:
        case, answers = window_case(**spec)
        run_window_kernel(fn, case, answers)
