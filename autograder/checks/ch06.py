"""Visible checks for chapter 6, paged KV in PyTorch: each TODO's readable case.

Every case is a ``course.notebook.paged_cases.PagedCase``: a pool filled with NaN garbage, physical
blocks shuffled, K/V placed slot by slot. Expected outputs, and what known mistakes give,
come from the chapter's hidden module (``autograder.private``), asked by the case's
description (its shapes and seed), never with anything the code under test produced; the
thorough checks are there too. Outputs are
compared at tolerances suited to their dtype, and a NaN anywhere in an output means garbage
from an unused slot leaked in.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from autograder.checks._helpers import learner_call
from autograder.checks._tensors import expect_attention_output
from autograder.private import private, visible
from course.notebook.paged_cases import PagedCase

# (atol, rtol). An fp16 output must be the exact answer rounded to fp16 (what fp32
# arithmetic gives): within 2^-10 of it, relatively; fp16 arithmetic misses by more.
TOLERANCE = {torch.float32: (1e-5, 1e-4), torch.float16: (1e-4, 2**-10)}
LOOSE_FP16 = (3e-3, 1e-2)  # where fp16 arithmetic lands
SEED = 2026


def _close(got: torch.Tensor, want: torch.Tensor, dtype, tolerance=None) -> bool:
    atol, rtol = tolerance or TOLERANCE[dtype]
    return torch.allclose(got.double(), want, atol=atol, rtol=rtol)


_ATTENTION_IDEA = ("Each query head attends over its sequence's first seq_len tokens, found "
                   "through the block table, with scores scale x (q . k); the query heads of "
                   "a group share one KV head.")


def _check_attention_output(out, case: PagedCase, name: str, expected: torch.Tensor,
                            known: Callable[[], dict], earlier: str = "") -> None:
    """``out`` against ``expected`` ([num_seqs, q_heads, head_dim], float64); ``known()``
    gives what the known mistakes compute (``no_scale``, ``kv_head_modulo``); ``earlier``
    names an earlier TODO the code under test calls, for a failure no diagnosis explains."""
    expect_attention_output(out, name, case.describe(), case.query)
    if out.isnan().any():
        raise AssertionError(f"{name} on {case.describe()} returned NaN: garbage from slots "
                             "the sequence does not hold leaked in (the tests fill every "
                             "unused slot with NaN, and NaN x 0 is still NaN), a slot past "
                             "its end or a block its table does not name. Only a sequence's "
                             "first seq_len tokens, found through its block table, take part.")
    group = case.q_heads // case.kv_heads
    for seq in range(len(case.lengths)):
        if _close(out[seq], expected[seq], case.dtype):
            continue
        error = (out[seq].double() - expected[seq]).abs().max().item()
        where = (f"{name} on {case.describe()}: sequence {seq} (length {case.lengths[seq]}) "
                 f"is off by up to {error:.3g}. ")
        mistakes = known()
        if _close(out[seq], mistakes["no_scale"][seq], case.dtype):
            raise AssertionError(where + "It equals attention with the scores left unscaled "
                                 "(q . k instead of scale x (q . k)).")
        if group > 1 and _close(out[seq], mistakes["kv_head_modulo"][seq], case.dtype):
            raise AssertionError(
                where + f"It equals attention where query head h reads KV head h % "
                f"{case.kv_heads}: here the {group} query heads of a group are consecutive "
                f"(heads {'0 and 1' if group == 2 else f'0 to {group - 1}'} share KV head 0).")
        if case.dtype == torch.float16 and _close(out[seq], expected[seq], case.dtype,
                                                  LOOSE_FP16):
            raise AssertionError(where + "That is more than rounding the exact answer to fp16 "
                                 "costs, and what arithmetic in fp16 loses on a sharp softmax: "
                                 "scores, softmax and sums are promised in fp32.")
        raise AssertionError(where + _ATTENTION_IDEA + (
            f" If {earlier} fails its own test, fix that first." if earlier else ""))


def _asked_attention(case: PagedCase) -> tuple[torch.Tensor, Callable[[], dict]]:
    """Expected output and known mistakes of ``case``, asked before the code under test
    runs."""
    answers = private("06")
    expected = answers.attention_expected(**case.spec())
    known = answers.attention_mistakes(**case.spec())
    return expected, lambda: known


# --- write_kv --------------------------------------------------------------------------------


def write_inputs(num_blocks, block_size, kv_heads, head_dim, slots, dtype):
    """A zeroed pool, the tokens' K/V and the slot mapping of a ``write_kv`` case."""
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    gen = torch.Generator().manual_seed(SEED + len(slots))
    k_cache = torch.zeros(num_blocks, block_size, kv_heads, head_dim, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    key = torch.randn(len(slots), kv_heads, head_dim, generator=gen).to(dtype)
    value = torch.randn(len(slots), kv_heads, head_dim, generator=gen).to(dtype)
    return k_cache, v_cache, key, value, torch.tensor(slots, dtype=torch.int64)


def _check_write(fn: Callable, ask: Callable, **case) -> None:
    """``case``: num_blocks, block_size, kv_heads, head_dim, slots, dtype (a name); ``ask``
    gives the pool as it must be afterwards."""
    want_k, want_v = ask(**case)
    k_cache, v_cache, key, value, mapping = write_inputs(**case)
    slots = case["slots"]
    try:
        learner_call("write_kv", fn, k_cache, v_cache, key, value, mapping)
    except AssertionError as failure:
        if "IndexError" in str(failure) and min(slots) < 0:
            raise AssertionError(f"{failure}. The slot mapping {slots} holds negative slots: "
                                 "every negative slot is padding, and padding is skipped."
                                 ) from None
        raise
    if torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v):
        return
    kv_heads, head_dim = case["kv_heads"], case["head_dim"]
    total = case["num_blocks"] * case["block_size"]
    where = (f"write_kv(slot_mapping={slots}) into a pool of {case['num_blocks']} blocks of "
             f"{case['block_size']} ({case['dtype']}) left the wrong values")
    if not k_cache.any() and not v_cache.any():
        raise AssertionError(
            f"write_kv(slot_mapping={slots}) left the pool as it was, all zeros: write_kv "
            "writes into k_cache and v_cache themselves (it returns nothing), so a write into "
            "a copy (index_put rather than index_put_, a reshape that copies) is lost.")
    flat = torch.cat([k_cache, v_cache], dim=-1).reshape(total, kv_heads, 2 * head_dim)
    wanted = torch.cat([want_k, want_v], dim=-1).reshape(total, kv_heads, 2 * head_dim)
    for slot in slots:
        if -total <= slot < 0 and not torch.equal(flat[slot + total], wanted[slot + total]):
            raise AssertionError(
                f"{where}: slot {slot + total} was written, which Python's negative indexing "
                f"makes of slot {slot}. Every negative slot is padding, not only -1, and "
                "padding is skipped.")
    wrong = sorted({s for s in range(total) if not torch.equal(flat[s], wanted[s])})
    raise AssertionError(f"{where} at slots {wrong[:8]}. Slot s is block s // block_size, "
                         "offset s % block_size, and token i's key and value go to its slot.")


@visible
def check_write_kv(fn: Callable) -> None:
    """Five tokens into 6 blocks of 4 at slots 5, 0, -1 (padding), 17 and -6 (padding)."""
    _check_write(fn, private("06").write_case, num_blocks=6, block_size=4, kv_heads=2,
                 head_dim=3, slots=[5, 0, -1, 17, -6], dtype="float32")


# --- paged_decode_attention ------------------------------------------------------------------


def _attention(fn: Callable, case: PagedCase, expected: torch.Tensor,
               known: Callable[[], dict]) -> None:
    out = learner_call("paged_decode_attention", fn, case.query, case.k_cache, case.v_cache,
                       case.tables, case.seq_lens, case.scale)
    _check_attention_output(out, case, "paged_decode_attention", expected, known)


@visible
def check_paged_decode_attention(fn: Callable) -> None:
    """Two sequences of 5 and 9 tokens, blocks of 4 shuffled in a NaN-filled pool, 4 query
    heads over 2 KV heads; then 40 and 9 tokens in fp16 with a sharp softmax."""
    case = PagedCase([5, 9], 4, 4, 2)
    half = PagedCase([40, 9], 4, 4, 2, dtype="float16", query_scale=4.0)
    asked = _asked_attention(case), _asked_attention(half)
    _attention(fn, case, *asked[0])
    _attention(fn, half, *asked[1])


# --- merge_partials -------------------------------------------------------------------------

def _check_merge(fn: Callable, ask: Callable, heads: int, len_a: int, len_b: int,
                 spread: float) -> None:
    """``ask`` gives the two pieces' partials and the partials of the whole."""
    a, b, whole = ask(heads=heads, len_a=len_a, len_b=len_b, spread=spread)
    merged = learner_call("merge_partials", fn, *a, *b)
    if not isinstance(merged, tuple | list) or len(merged) != 3:
        raise AssertionError(f"merge_partials(...) returned {type(merged).__name__}, expected "
                             "a tuple (m, l, acc).")
    where = (f"merge_partials of two pieces ({len_a} and {len_b} scores, in {heads} heads, "
             f"scores spread {spread})")
    for name, got, want in zip(("m", "l", "acc"), merged, whole, strict=True):
        if isinstance(got, torch.Tensor) and got.shape == want.shape and torch.allclose(
                got.double(), want, atol=1e-9, rtol=1e-9):
            continue
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            raise AssertionError(f"{where}: {name} is {getattr(got, 'shape', got)}, expected "
                                 f"shape {tuple(want.shape)}.")
        hint = {"m": "The merged m is the larger of the two pieces' maxima.",
                "l": "Each piece's l was summed against its own maximum, not the merged one.",
                "acc": "The sums l are right but acc is not: acc, like l, was summed against "
                       "its own piece's maximum."}[name]
        if torch.isinf(got).any() or torch.isnan(got).any():
            hint = (f"{name} holds inf or NaN: with scores spread {spread}, exp of a score "
                    "not shifted by a maximum overflows. ") + hint
        raise AssertionError(f"{where}: {name} differs from the whole sequence's. {hint}")


@visible
def check_merge_partials(fn: Callable) -> None:
    """Two pieces of 3 and 5 scores, in 2 heads."""
    _check_merge(fn, private("06").merge_case, 2, 3, 5, 1.0)


# --- blockwise_decode_attention --------------------------------------------------------------


def _blockwise(fn: Callable, case: PagedCase, expected: torch.Tensor,
               known: Callable[[], dict]) -> None:
    outs = [learner_call("blockwise_decode_attention", fn, case.query[s], case.k_cache,
                         case.v_cache, case.tables[s], case.lengths[s], case.scale)
            for s in range(len(case.lengths))]
    shape = tuple(case.query.shape[1:])
    for out in outs:
        expect_attention_output(out, "blockwise_decode_attention", case.describe(), case.query,
                                shape, " (one sequence's query heads)")
    _check_attention_output(torch.stack(outs), case, "blockwise_decode_attention", expected,
                            known, earlier="merge_partials")


@visible
def check_blockwise_decode_attention(fn: Callable) -> None:
    """One block at a time equals all at once: lengths 5 and 9, blocks of 4; then 40 and 9
    tokens in fp16 with a sharp softmax."""
    case = PagedCase([5, 9], 4, 4, 2)
    half = PagedCase([40, 9], 4, 4, 2, dtype="float16", query_scale=4.0)
    asked = _asked_attention(case), _asked_attention(half)
    _blockwise(fn, case, *asked[0])
    _blockwise(fn, half, *asked[1])


# --- decode_step -----------------------------------------------------------------------------


def step_inputs(prompts, steps, block_size, q_heads, kv_heads, head_dim=16):
    """A pool holding the prompts (tables with room for every step, the future slots NaN
    garbage), and each step's seq_lens, query, key and value."""
    gen = torch.Generator().manual_seed(SEED + sum(prompts))
    finals = [p + steps for p in prompts]
    case = PagedCase(finals, block_size, q_heads, kv_heads, head_dim)  # tables with room for all
    for seq in range(len(prompts)):  # unused future slots: garbage
        for p in range(prompts[seq], finals[seq]):
            block = int(case.tables[seq, p // block_size])
            case.k_cache[block, p % block_size] = float("nan")
            case.v_cache[block, p % block_size] = float("nan")
    inputs = []
    for step in range(steps):
        seq_lens = torch.tensor([p + step + 1 for p in prompts], dtype=torch.int32)
        query = torch.randn(len(prompts), q_heads, head_dim, generator=gen)
        key = torch.stack([case.keys[s][prompts[s] + step] for s in range(len(prompts))])
        value = torch.stack([case.values[s][prompts[s] + step] for s in range(len(prompts))])
        inputs.append((seq_lens, query, key, value))
    return case, inputs


def _steps(fn: Callable, ask: Callable, prompts, steps, block_size, q_heads, kv_heads,
           head_dim=16) -> None:
    """Prefill prompts into the pool, then decode ``steps`` tokens with the learner's
    decode_step, each output checked against ``ask``'s: scaled_dot_product_attention over
    the same K/V laid out contiguously (``outputs``), and over all but the newest token
    (``without_newest``, a known mistake)."""
    shape = dict(prompts=prompts, steps=steps, block_size=block_size, q_heads=q_heads,
                 kv_heads=kv_heads, head_dim=head_dim)
    wanted = ask(**shape)
    case, inputs = step_inputs(**shape)
    for step, (seq_lens, query, key, value) in enumerate(inputs):
        out = learner_call("decode_step", fn, query, key, value, case.k_cache, case.v_cache,
                           case.tables, seq_lens, case.scale)
        steps = (f"prompts of {prompts} tokens, block size {block_size}, decode step "
                 f"{step + 1} (seq_lens {seq_lens.tolist()})")
        expect_attention_output(out, "decode_step", steps, query)
        where = f"decode_step, {steps}"
        for s in range(len(prompts)):
            want, older = wanted["outputs"][step][s], wanted["without_newest"][step][s]
            if not out[s].isnan().any() and torch.allclose(out[s], want, atol=1e-5, rtol=1e-4):
                continue
            if out[s].isnan().any():
                hint = ("It holds NaN: attention read the new token's slot while it still held "
                        "garbage, so its K/V was not in the pool yet, or went to another slot.")
            elif torch.allclose(out[s], older, atol=1e-5, rtol=1e-4):
                hint = ("It equals attention over the first seq_len - 1 tokens: the new token "
                        "did not attend to itself.")
            else:
                hint = ("If write_kv or paged_decode_attention fails its own test, fix that "
                        "first; otherwise the new token's K/V went to a slot other than its "
                        "position's, seq_len - 1.")
            raise AssertionError(f"{where}: sequence {s} differs from "
                                 f"scaled_dot_product_attention over its contiguous K/V. {hint}")


@visible
def check_decode_step(fn: Callable) -> None:
    """Prompts of 3 and 6 tokens in blocks of 4, then 4 decode steps."""
    _steps(fn, private("06").decode_case, [3, 6], 4, 4, 4, 2)
