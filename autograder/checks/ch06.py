"""Visible checks for chapter 6, paged KV in PyTorch: each TODO's readable case.

Every case is built here: a pool filled with NaN garbage, physical blocks shuffled, K/V placed
slot by slot. Expected outputs, and what known mistakes give, come from the chapter's hidden
module (``autograder.private``), asked by the case's description (its shapes and seed), never
with anything the code under test produced; the thorough checks are there too. Outputs are
compared at tolerances suited to their dtype, and a NaN anywhere in an output means garbage
from an unused slot leaked in.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from autograder.checks._helpers import learner_call
from autograder.private import private, visible

TOLERANCE = {torch.float32: (1e-5, 1e-4), torch.float16: (3e-3, 1e-2)}  # (atol, rtol)
SEED = 2026


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float16`` -> ``"float16"``: how a case names its dtype to a private question."""
    return str(dtype).split(".")[-1]


class PagedCase:
    """Sequences of the given lengths in a NaN-filled pool with shuffled physical blocks."""

    def __init__(self, lengths, block_size, q_heads, kv_heads, head_dim=16,
                 dtype=torch.float32, seed=SEED):
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        gen = torch.Generator().manual_seed(seed)
        self.lengths, self.block_size = list(lengths), block_size
        self.q_heads, self.kv_heads, self.dtype = q_heads, kv_heads, dtype
        self.head_dim, self.seed = head_dim, seed
        per_seq = [-(-n // block_size) for n in self.lengths]
        num_blocks = sum(per_seq) + 3
        order = torch.randperm(num_blocks, generator=gen).tolist()
        self.k_cache = torch.full((num_blocks, block_size, kv_heads, head_dim), float("nan"),
                                  dtype=dtype)
        self.v_cache = self.k_cache.clone()
        max_blocks = max(per_seq) + 1
        self.tables = torch.zeros(len(self.lengths), max_blocks, dtype=torch.int32)
        self.keys, self.values = [], []
        for seq, (length, count) in enumerate(zip(self.lengths, per_seq, strict=True)):
            blocks = [order.pop() for _ in range(count)]
            self.tables[seq, :count] = torch.tensor(blocks, dtype=torch.int32)
            keys = torch.randn(length, kv_heads, head_dim, generator=gen).to(dtype)
            values = torch.randn(length, kv_heads, head_dim, generator=gen).to(dtype)
            for p in range(length):
                self.k_cache[blocks[p // block_size], p % block_size] = keys[p]
                self.v_cache[blocks[p // block_size], p % block_size] = values[p]
            self.keys.append(keys)
            self.values.append(values)
        self.query = torch.randn(len(self.lengths), q_heads, head_dim, generator=gen).to(dtype)
        self.scale = 1 / math.sqrt(head_dim)
        self.seq_lens = torch.tensor(self.lengths, dtype=torch.int32)

    def spec(self) -> dict:
        """What builds this case again: the arguments a private question is asked with."""
        return dict(lengths=self.lengths, block_size=self.block_size, q_heads=self.q_heads,
                    kv_heads=self.kv_heads, head_dim=self.head_dim,
                    dtype=dtype_name(self.dtype), seed=self.seed)

    def describe(self) -> str:
        return (f"lengths {self.lengths}, block size {self.block_size}, {self.q_heads} query "
                f"heads over {self.kv_heads} KV heads, {dtype_name(self.dtype)}")


def _close(got: torch.Tensor, want: torch.Tensor, dtype) -> bool:
    atol, rtol = TOLERANCE[dtype]
    return torch.allclose(got.double(), want, atol=atol, rtol=rtol)


_ATTENTION_IDEA = ("Each query head h attends with scale x (q . k) over the sequence's first "
                   "seq_len tokens only, using KV head h // (num_q_heads // num_kv_heads), and "
                   "finds token t at block_tables[seq, t // block_size], offset t % block_size.")


def _check_attention_output(out, case: PagedCase, name: str, expected: torch.Tensor,
                            known: Callable[[], dict]) -> None:
    """``out`` against ``expected`` ([num_seqs, q_heads, head_dim], float64); ``known()``
    gives what the known mistakes compute (``no_scale``, ``kv_head_modulo``)."""
    if not isinstance(out, torch.Tensor) or out.shape != case.query.shape:
        raise AssertionError(f"{name} on {case.describe()} returned "
                             f"{getattr(out, 'shape', type(out).__name__)}, expected a tensor of "
                             f"shape {tuple(case.query.shape)}.")
    if out.isnan().any():
        raise AssertionError(f"{name} on {case.describe()} returned NaN: garbage from slots "
                             "past a sequence's end leaked in. Read only the first seq_len "
                             "tokens (slice or mask them out before the softmax, not by "
                             "multiplying by 0, since NaN x 0 is NaN). " + _ATTENTION_IDEA)
    group = case.q_heads // case.kv_heads
    for seq in range(len(case.lengths)):
        if _close(out[seq], expected[seq], case.dtype):
            continue
        mistakes = known()
        hint = ""
        if _close(out[seq], mistakes["no_scale"][seq], case.dtype):
            hint = "It matches attention without the scale: multiply the scores by scale. "
        elif group > 1 and _close(out[seq], mistakes["kv_head_modulo"][seq], case.dtype):
            hint = ("It matches KV head h % num_kv_heads: the query heads of one group are "
                    "consecutive, so query head h uses KV head h // group. ")
        error = (out[seq].double() - expected[seq]).abs().max().item()
        raise AssertionError(f"{name} on {case.describe()}: sequence {seq} (length "
                             f"{case.lengths[seq]}) is off by up to {error:.3g}. {hint}"
                             + _ATTENTION_IDEA)


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
    learner_call("write_kv", fn, k_cache, v_cache, key, value, mapping)
    if torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v):
        return
    slots, kv_heads, head_dim = case["slots"], case["kv_heads"], case["head_dim"]
    hint = ""
    if (k_cache.reshape(-1, kv_heads, head_dim)[-1] != 0).any() and -1 in slots:
        hint = ("Something was written to the pool's last slot: slot -1 means padding, skip it "
                "(Python's negative indexing would write it to the end). ")
    raise AssertionError(f"write_kv(slot_mapping={slots}) into a pool of {case['num_blocks']} "
                         f"blocks of {case['block_size']} left the wrong values. {hint}Slot s "
                         "is block s // block_size, offset s % block_size; write key[i] and "
                         "value[i] there for every slot s >= 0, and nothing else.")


@visible
def check_write_kv(fn: Callable) -> None:
    """Four tokens into 6 blocks of 4 at slots 5, 0, -1 (padding) and 17."""
    _check_write(fn, private("06").write_case, num_blocks=6, block_size=4, kv_heads=2,
                 head_dim=3, slots=[5, 0, -1, 17], dtype="float32")


# --- paged_decode_attention ------------------------------------------------------------------


def _attention(fn: Callable, case: PagedCase, expected: torch.Tensor,
               known: Callable[[], dict]) -> None:
    out = learner_call("paged_decode_attention", fn, case.query, case.k_cache, case.v_cache,
                       case.tables, case.seq_lens, case.scale)
    _check_attention_output(out, case, "paged_decode_attention", expected, known)


@visible
def check_paged_decode_attention(fn: Callable) -> None:
    """Two sequences of 5 and 9 tokens, blocks of 4 shuffled in a NaN-filled pool, 4 query
    heads over 2 KV heads."""
    case = PagedCase([5, 9], 4, 4, 2)
    _attention(fn, case, *_asked_attention(case))


# --- merge_partials -------------------------------------------------------------------------

_MERGE_IDEA = ("With m = max(m_a, m_b), each piece's sum and accumulator are rescaled by "
               "exp(m_piece - m) before adding: l = l_a e^(m_a-m) + l_b e^(m_b-m), and "
               "acc = acc_a e^(m_a-m) + acc_b e^(m_b-m).")


def _check_merge(fn: Callable, ask: Callable, heads: int, len_a: int, len_b: int,
                 spread: float) -> None:
    """``ask`` gives the two pieces' partials and the partials of the whole."""
    a, b, whole = ask(heads=heads, len_a=len_a, len_b=len_b, spread=spread)
    merged = learner_call("merge_partials", fn, *a, *b)
    ok = all(torch.allclose(x.double(), y, atol=1e-9, rtol=1e-9) for x, y in
             zip(merged, whole, strict=True))
    if ok:
        return
    hint = ""
    if torch.allclose(merged[1].double(), whole[1]) and not torch.allclose(
            merged[2].double(), whole[2]):
        hint = "The sums are right but the accumulators are not: rescale them too. "
    raise AssertionError(f"merge_partials of two pieces ({len_a} and {len_b} scores, spread "
                         f"{spread}) disagrees with the partials of the whole. {hint}"
                         + _MERGE_IDEA)


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
    if not all(isinstance(o, torch.Tensor) for o in outs):
        raise AssertionError("blockwise_decode_attention must return a tensor.")
    _check_attention_output(torch.stack(outs), case, "blockwise_decode_attention", expected,
                            known)


@visible
def check_blockwise_decode_attention(fn: Callable) -> None:
    """One block at a time equals all at once: lengths 5 and 9, blocks of 4."""
    case = PagedCase([5, 9], 4, 4, 2)
    _blockwise(fn, case, *_asked_attention(case))


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
    the same K/V laid out contiguously."""
    shape = dict(prompts=prompts, steps=steps, block_size=block_size, q_heads=q_heads,
                 kv_heads=kv_heads, head_dim=head_dim)
    wanted = ask(**shape)
    case, inputs = step_inputs(**shape)
    for step, (seq_lens, query, key, value) in enumerate(inputs):
        out = learner_call("decode_step", fn, query, key, value, case.k_cache, case.v_cache,
                           case.tables, seq_lens, case.scale)
        for s in range(len(prompts)):
            want = wanted[step][s]
            if out[s].isnan().any() or not torch.allclose(out[s], want, atol=1e-5, rtol=1e-4):
                raise AssertionError(
                    f"decode_step, prompts {prompts}, block size {block_size}, decode step "
                    f"{step + 1}: sequence {s} differs from scaled_dot_product_attention over "
                    "its contiguous K/V. Write the new token's K/V at position seq_len - 1 "
                    "(block_tables[seq, (seq_len - 1) // block_size], offset (seq_len - 1) % "
                    "block_size) first, then attend over all seq_len tokens.")


@visible
def check_decode_step(fn: Callable) -> None:
    """Prompts of 3 and 6 tokens in blocks of 4, then 4 decode steps."""
    _steps(fn, private("06").decode_case, [3, 6], 4, 4, 4, 2)
