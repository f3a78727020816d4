"""Checks for chapter 6, paged KV in PyTorch.

Every case is built here: a pool filled with NaN garbage, physical blocks shuffled, K/V placed
slot by slot, and expected outputs computed in float64 by an oracle that walks each sequence's
positions one at a time. Outputs are compared at tolerances suited to their dtype, and a NaN
anywhere in an output means garbage from an unused slot leaked in.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from autograder.checks._helpers import learner_call

TOLERANCE = {torch.float32: (1e-5, 1e-4), torch.float16: (3e-3, 1e-2)}  # (atol, rtol)
SEED = 2026


class PagedCase:
    """Sequences of the given lengths in a NaN-filled pool with shuffled physical blocks."""

    def __init__(self, lengths, block_size, q_heads, kv_heads, head_dim=16,
                 dtype=torch.float32, seed=SEED):
        gen = torch.Generator().manual_seed(seed)
        self.lengths, self.block_size = list(lengths), block_size
        self.q_heads, self.kv_heads, self.dtype = q_heads, kv_heads, dtype
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

    def describe(self) -> str:
        return (f"lengths {self.lengths}, block size {self.block_size}, {self.q_heads} query "
                f"heads over {self.kv_heads} KV heads, {str(self.dtype).split('.')[-1]}")

    def expected(self, seq: int, *, scale: float | None = None, kv_head=None,
                 extra: int = 0) -> torch.Tensor:
        """float64 attention of sequence ``seq``'s query over its tokens, position by position.
        ``scale``, ``kv_head`` and ``extra`` (tail slots read past the end) model mistakes."""
        scale = self.scale if scale is None else scale
        group = self.q_heads // self.kv_heads
        kv_head = kv_head or (lambda h: h // group)
        table = self.tables[seq].tolist()
        out = torch.empty(self.q_heads, self.query.shape[-1], dtype=torch.float64)
        for h in range(self.q_heads):
            scores, rows = [], []
            for p in range(self.lengths[seq] + extra):
                block, offset = table[p // self.block_size], p % self.block_size
                k = self.k_cache[block, offset, kv_head(h)].double()
                scores.append(float(self.query[seq, h].double() @ k) * scale)
                rows.append(self.v_cache[block, offset, kv_head(h)].double())
            weights = torch.softmax(torch.tensor(scores, dtype=torch.float64), dim=0)
            out[h] = (weights[:, None] * torch.stack(rows)).sum(dim=0)
        return out


def _close(got: torch.Tensor, want: torch.Tensor, dtype) -> bool:
    atol, rtol = TOLERANCE[dtype]
    return torch.allclose(got.double(), want, atol=atol, rtol=rtol)


_ATTENTION_IDEA = ("Each query head h attends with scale x (q . k) over the sequence's first "
                   "seq_len tokens only, using KV head h // (num_q_heads // num_kv_heads), and "
                   "finds token t at block_tables[seq, t // block_size], offset t % block_size.")


def _check_attention_output(out, case: PagedCase, name: str) -> None:
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
        if _close(out[seq], case.expected(seq), case.dtype):
            continue
        hint = ""
        if _close(out[seq], case.expected(seq, scale=1.0), case.dtype):
            hint = "It matches attention without the scale: multiply the scores by scale. "
        elif group > 1 and _close(out[seq], case.expected(
                seq, kv_head=lambda h: h % case.kv_heads), case.dtype):
            hint = ("It matches KV head h % num_kv_heads: the query heads of one group are "
                    "consecutive, so query head h uses KV head h // group. ")
        error = (out[seq].double() - case.expected(seq)).abs().max().item()
        raise AssertionError(f"{name} on {case.describe()}: sequence {seq} (length "
                             f"{case.lengths[seq]}) is off by up to {error:.3g}. {hint}"
                             + _ATTENTION_IDEA)


# --- write_kv --------------------------------------------------------------------------------


def _check_write(fn: Callable, num_blocks, block_size, kv_heads, head_dim, slots, dtype):
    gen = torch.Generator().manual_seed(SEED + len(slots))
    k_cache = torch.zeros(num_blocks, block_size, kv_heads, head_dim, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    key = torch.randn(len(slots), kv_heads, head_dim, generator=gen).to(dtype)
    value = torch.randn(len(slots), kv_heads, head_dim, generator=gen).to(dtype)
    mapping = torch.tensor(slots, dtype=torch.int64)
    learner_call("write_kv", fn, k_cache, v_cache, key, value, mapping)
    want_k, want_v = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    for i, slot in enumerate(slots):
        if slot >= 0:
            want_k[slot // block_size, slot % block_size] = key[i]
            want_v[slot // block_size, slot % block_size] = value[i]
    if torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v):
        return
    hint = ""
    if (k_cache.reshape(-1, kv_heads, head_dim)[-1] != 0).any() and -1 in slots:
        hint = ("Something was written to the pool's last slot: slot -1 means padding, skip it "
                "(Python's negative indexing would write it to the end). ")
    raise AssertionError(f"write_kv(slot_mapping={slots}) into a pool of {num_blocks} blocks of "
                         f"{block_size} left the wrong values. {hint}Slot s is block "
                         "s // block_size, offset s % block_size; write key[i] and value[i] "
                         "there for every slot s >= 0, and nothing else.")


def check_write_kv(fn: Callable) -> None:
    """Four tokens into 6 blocks of 4 at slots 5, 0, -1 (padding) and 17."""
    _check_write(fn, 6, 4, 2, 3, [5, 0, -1, 17], torch.float32)


def check_write_kv_thoroughly(fn: Callable) -> None:
    """Random slot mappings with padding, block sizes 1 to 32, fp16."""
    gen = torch.Generator().manual_seed(SEED)
    for block_size in (1, 8, 16, 32):
        num_blocks = 9
        chosen = torch.randperm(num_blocks * block_size, generator=gen)[:12].tolist()
        chosen[::5] = [-1] * len(chosen[::5])
        for dtype in (torch.float32, torch.float16):
            _check_write(fn, num_blocks, block_size, 3, 8, chosen, dtype)


# --- paged_decode_attention ------------------------------------------------------------------


def _attention(fn: Callable, case: PagedCase) -> None:
    out = learner_call("paged_decode_attention", fn, case.query, case.k_cache, case.v_cache,
                       case.tables, case.seq_lens, case.scale)
    _check_attention_output(out, case, "paged_decode_attention")


def check_paged_decode_attention(fn: Callable) -> None:
    """Two sequences of 5 and 9 tokens, blocks of 4 shuffled in a NaN-filled pool, 4 query
    heads over 2 KV heads."""
    _attention(fn, PagedCase([5, 9], 4, 4, 2))


def check_paged_decode_attention_thoroughly(fn: Callable) -> None:
    """Lengths 1, 37 and 523; block sizes 1, 8, 16, 32; heads 32/8, 8/2, 5/1, 4/4; fp16."""
    for lengths, block_size, q, kv, dtype in [
        ([1, 37, 523], 16, 32, 8, torch.float32), ([37, 1], 1, 8, 2, torch.float32),
        ([523, 12], 8, 5, 1, torch.float32), ([64, 33], 32, 4, 4, torch.float32),
        ([1, 37, 200], 16, 8, 2, torch.float16),
    ]:
        _attention(fn, PagedCase(lengths, block_size, q, kv, dtype=dtype))


# --- merge_partials -------------------------------------------------------------------------

_MERGE_IDEA = ("With m = max(m_a, m_b), each piece's sum and accumulator are rescaled by "
               "exp(m_piece - m) before adding: l = l_a e^(m_a-m) + l_b e^(m_b-m), and "
               "acc = acc_a e^(m_a-m) + acc_b e^(m_b-m).")


def _partials(scores: torch.Tensor, values: torch.Tensor):
    m = scores.max(dim=-1).values
    w = torch.exp(scores - m[:, None])
    return m, w.sum(dim=-1), w @ values


def _check_merge(fn: Callable, heads: int, len_a: int, len_b: int, spread: float) -> None:
    gen = torch.Generator().manual_seed(SEED + len_a * 31 + len_b)
    scores = torch.randn(heads, len_a + len_b, generator=gen, dtype=torch.float64) * spread
    values = torch.randn(len_a + len_b, 8, generator=gen, dtype=torch.float64)
    a = _partials(scores[:, :len_a], values[:len_a])
    b = _partials(scores[:, len_a:], values[len_a:])
    merged = learner_call("merge_partials", fn, *a, *b)
    whole = _partials(scores, values)
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


def check_merge_partials(fn: Callable) -> None:
    """Two pieces of 3 and 5 scores, in 2 heads."""
    _check_merge(fn, 2, 3, 5, 1.0)


def check_merge_partials_thoroughly(fn: Callable) -> None:
    """Pieces of one score, unequal pieces, and scores far apart (exp would overflow
    without the max)."""
    for heads, len_a, len_b, spread in [(1, 1, 1, 1.0), (4, 1, 30, 3.0), (3, 17, 2, 50.0),
                                        (8, 64, 64, 200.0)]:
        _check_merge(fn, heads, len_a, len_b, spread)


# --- blockwise_decode_attention --------------------------------------------------------------


def _blockwise(fn: Callable, case: PagedCase) -> None:
    outs = [learner_call("blockwise_decode_attention", fn, case.query[s], case.k_cache,
                         case.v_cache, case.tables[s], case.lengths[s], case.scale)
            for s in range(len(case.lengths))]
    if not all(isinstance(o, torch.Tensor) for o in outs):
        raise AssertionError("blockwise_decode_attention must return a tensor.")
    _check_attention_output(torch.stack(outs), case, "blockwise_decode_attention")


def check_blockwise_decode_attention(fn: Callable) -> None:
    """One block at a time equals all at once: lengths 5 and 9, blocks of 4."""
    _blockwise(fn, PagedCase([5, 9], 4, 4, 2))


def check_blockwise_decode_attention_thoroughly(fn: Callable) -> None:
    """Lengths 1, 37 and 523 over block sizes 1, 8 and 32, with GQA."""
    _blockwise(fn, PagedCase([1, 37, 523], 32, 8, 2))
    _blockwise(fn, PagedCase([37, 12], 1, 4, 4))
    _blockwise(fn, PagedCase([523], 8, 5, 1))


# --- decode_step -----------------------------------------------------------------------------


def _steps(fn: Callable, prompts, steps, block_size, q_heads, kv_heads, head_dim=16) -> None:
    """Prefill prompts into the pool, then decode ``steps`` tokens with the learner's
    decode_step, each checked against scaled_dot_product_attention over contiguous K/V."""
    gen = torch.Generator().manual_seed(SEED + sum(prompts))
    finals = [p + steps for p in prompts]
    case = PagedCase(finals, block_size, q_heads, kv_heads, head_dim)  # tables with room for all
    contiguous_k = [case.keys[s][:prompts[s]] for s in range(len(prompts))]
    contiguous_v = [case.values[s][:prompts[s]] for s in range(len(prompts))]
    for seq in range(len(prompts)):  # unused future slots: garbage
        for p in range(prompts[seq], finals[seq]):
            block = int(case.tables[seq, p // block_size])
            case.k_cache[block, p % block_size] = float("nan")
            case.v_cache[block, p % block_size] = float("nan")
    group = q_heads // kv_heads
    for step in range(steps):
        seq_lens = torch.tensor([p + step + 1 for p in prompts], dtype=torch.int32)
        query = torch.randn(len(prompts), q_heads, head_dim, generator=gen)
        key = torch.stack([case.keys[s][prompts[s] + step] for s in range(len(prompts))])
        value = torch.stack([case.values[s][prompts[s] + step] for s in range(len(prompts))])
        out = learner_call("decode_step", fn, query, key, value, case.k_cache, case.v_cache,
                           case.tables, seq_lens, case.scale)
        for s in range(len(prompts)):
            contiguous_k[s] = torch.cat([contiguous_k[s], key[s:s + 1]])
            contiguous_v[s] = torch.cat([contiguous_v[s], value[s:s + 1]])
            k = contiguous_k[s].repeat_interleave(group, dim=1).transpose(0, 1)  # [h, t, d]
            v = contiguous_v[s].repeat_interleave(group, dim=1).transpose(0, 1)
            want = torch.nn.functional.scaled_dot_product_attention(
                query[s][:, None, :], k, v, scale=case.scale)[:, 0, :]
            if out[s].isnan().any() or not torch.allclose(out[s], want, atol=1e-5, rtol=1e-4):
                raise AssertionError(
                    f"decode_step, prompts {prompts}, block size {block_size}, decode step "
                    f"{step + 1}: sequence {s} differs from scaled_dot_product_attention over "
                    "its contiguous K/V. Write the new token's K/V at position seq_len - 1 "
                    "(block_tables[seq, (seq_len - 1) // block_size], offset (seq_len - 1) % "
                    "block_size) first, then attend over all seq_len tokens.")


def check_decode_step(fn: Callable) -> None:
    """Prompts of 3 and 6 tokens in blocks of 4, then 4 decode steps."""
    _steps(fn, [3, 6], 4, 4, 4, 2)


def check_decode_step_thoroughly(fn: Callable) -> None:
    """Prompts of 1 and 37 tokens, block sizes 1 and 16, GQA 8/2 and 5/1, across boundaries."""
    _steps(fn, [1, 37], 5, 16, 8, 2)
    _steps(fn, [15, 2], 3, 1, 5, 1)
