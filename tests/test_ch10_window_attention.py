"""Sliding-window paged decode attention (``kernels.sliding_window_attention``): the Triton
kernel and the PyTorch version against attention over contiguous keys with the window's mask,
through tables whose slots before the window hold the null block (filled with NaN, so that a
read of it would show), on the interpreter at small shapes; at production shapes on a GPU.
"""

from __future__ import annotations

import math

import pytest
import torch

from course.hybrid_cache import NULL_BLOCK, free_skipped_blocks
from course.tiny_model import causal_attention
from kernels.sliding_window_attention import (
    sliding_window_attention,
    sliding_window_reference,
)
from kernels.sliding_window_varlen import window_varlen_attention, window_varlen_reference


def _windowed(query: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
              window: int, scale: float) -> torch.Tensor:
    """Each sequence's one query, its last token, over its contiguous keys with the window's
    mask (chapter 8's ``causal_attention``); a sequence of no tokens gets zeros."""
    out = torch.zeros_like(query)
    for seq, (k, v) in enumerate(zip(keys, values, strict=True)):
        if k.shape[0]:
            out[seq] = causal_attention(query[seq:seq + 1].float(), k.float(), v.float(), scale,
                                        past=k.shape[0] - 1, window=window)[0]
    return out


def _paged(lengths: list[int], window: int, block_size: int, kv_heads: int, q_heads: int,
           head_dim: int, seed: int, device: str = "cpu", dtype=torch.float32,
           computed: list[int] | None = None):
    """A pool holding each sequence's keys and values in shuffled blocks, its table's slots
    before the window given back to the pool as the null block (``free_skipped_blocks`` with
    the tokens ``computed`` before this step: all but the last, for a decode), and the null
    block filled with NaN."""
    generator = torch.Generator().manual_seed(seed)
    blocks_each = [-(-n // block_size) for n in lengths]
    num_blocks = 1 + sum(blocks_each)
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=generator)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=generator)
    k_cache[NULL_BLOCK] = v_cache[NULL_BLOCK] = float("nan")
    ids = (torch.randperm(num_blocks - 1, generator=generator) + 1).tolist()
    width = max(1, *blocks_each)
    tables, keys, values = [], [], []
    before = computed or [max(0, n - 1) for n in lengths]
    for n, count, done in zip(lengths, blocks_each, before, strict=True):
        table, ids = ids[:count], ids[count:]
        keys.append(k_cache[table].reshape(-1, kv_heads, head_dim)[:n].clone())
        values.append(v_cache[table].reshape(-1, kv_heads, head_dim)[:n].clone())
        free_skipped_blocks(table, done, window, block_size)
        tables.append(table + [NULL_BLOCK] * (width - count))
    query = torch.randn(len(lengths), q_heads, head_dim, generator=generator)
    cast = {"device": device, "dtype": dtype}
    return (query.to(**cast), k_cache.to(**cast), v_cache.to(**cast),
            torch.tensor(tables, dtype=torch.int32, device=device),
            torch.tensor(lengths, dtype=torch.int32, device=device), keys, values)


CASES = [
    # (lengths, window, block_size, kv_heads, q_heads, head_dim)
    ([0, 1, 5, 9, 16, 23], 6, 4, 2, 6, 8),
    ([1, 7, 8, 40], 1, 8, 1, 4, 16),
    ([3, 13, 31], 128, 4, 2, 2, 24),
    ([17, 32, 33, 64], 16, 16, 1, 3, 8),
]


@pytest.mark.parametrize(("lengths", "window", "block_size", "kv_heads", "q_heads", "head_dim"),
                         CASES, ids=["GQA 3, window 6", "window 1", "window past the lengths",
                                     "window of one block"])
def test_sliding_window_attention_sees_the_window_alone(lengths, window, block_size, kv_heads,
                                                       q_heads, head_dim):
    query, k_cache, v_cache, tables, seq_lens, keys, values = _paged(
        lengths, window, block_size, kv_heads, q_heads, head_dim, seed=len(lengths))
    scale = 1 / math.sqrt(head_dim)
    expected = _windowed(query, keys, values, window, scale)
    for attend in (sliding_window_reference, sliding_window_attention):
        out = attend(query, k_cache, v_cache, tables, seq_lens, window, scale)
        assert not out.isnan().any(), f"{attend.__name__} read the null block"
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)


def test_the_comparison_catches_attention_over_every_token():
    query, k_cache, v_cache, tables, seq_lens, keys, values = _paged(
        [9, 23], 6, 4, 2, 6, 8, seed=1)
    scale = 1 / math.sqrt(8)
    everything = _windowed(query, keys, values, 10**6, scale)
    assert not torch.allclose(everything, _windowed(query, keys, values, 6, scale))


@pytest.mark.parametrize(("window", "error"), [(0, ValueError), (-3, ValueError),
                                               (2.0, TypeError), (True, TypeError)])
def test_a_window_that_is_not_a_positive_int_is_refused(window, error):
    query, k_cache, v_cache, tables, seq_lens, _, _ = _paged([5], 4, 4, 1, 1, 8, seed=0)
    with pytest.raises(error, match="window"):
        sliding_window_attention(query, k_cache, v_cache, tables, seq_lens, window, 0.3)
    starts = torch.tensor([0, 1], dtype=torch.int32)  # the decode as a chunk of one query
    with pytest.raises(error, match="window"):
        window_varlen_attention(query, k_cache, v_cache, starts, seq_lens, tables, window, 0.3)


def test_bf16_is_computed_in_fp32_and_returned_in_bf16():
    query, k_cache, v_cache, tables, seq_lens, keys, values = _paged(
        [5, 12], 4, 4, 1, 2, 8, seed=2, dtype=torch.bfloat16)
    out = sliding_window_attention(query, k_cache, v_cache, tables, seq_lens, 4, 0.35)
    assert out.dtype == torch.bfloat16
    expected = _windowed(query, keys, values, 4, 0.35)
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU (the interpreter runs the small shapes above)")
def test_sliding_window_attention_at_production_shapes_on_a_gpu():
    """gpt-oss's sliding layers: 64 query heads on 8 KV heads of 64, a window of 128, blocks
    of 16, lengths from 1 to 4,096, in bf16."""
    lengths = [1, 127, 128, 129, 1000, 4096, 2049, 300]
    query, k_cache, v_cache, tables, seq_lens, keys, values = _paged(
        lengths, 128, 16, 8, 64, 64, seed=3, device="cuda", dtype=torch.bfloat16)
    scale = 1 / math.sqrt(64)
    out = sliding_window_attention(query, k_cache, v_cache, tables, seq_lens, 128, scale)
    expected = _windowed(query.cpu(), [k.cpu() for k in keys], [v.cpu() for v in values], 128,
                         scale)
    torch.testing.assert_close(out.float().cpu(), expected.float(), atol=2e-2, rtol=2e-2)


# --- chunks of several queries (chapter 9's variable-length batches) --------------------------


def _packed(chunks: list[tuple[int, int]], window: int, block_size: int, kv_heads: int,
            q_heads: int, head_dim: int, seed: int):
    """Requests of (context after the step, new tokens): their keys and values in shuffled
    blocks, the blocks the chunk's first query no longer sees given back as the null block
    (NaN), and the new tokens' queries packed."""
    generator = torch.Generator().manual_seed(seed)
    _, k_cache, v_cache, tables, seq_lens, keys, values = _paged(
        [length for length, _ in chunks], window, block_size, kv_heads, q_heads, head_dim, seed,
        computed=[length - new for length, new in chunks])
    queries = torch.randn(sum(new for _, new in chunks), q_heads, head_dim, generator=generator)
    starts = torch.tensor([0] + [new for _, new in chunks]).cumsum(0).to(torch.int32)
    return queries, k_cache, v_cache, starts, seq_lens, tables, keys, values


@pytest.mark.parametrize(("chunks", "window", "block_size"), [
    ([(9, 4), (1, 1), (23, 23), (16, 1)], 3, 4),
    ([(12, 5), (7, 7), (30, 2)], 8, 2),
    ([(5, 5), (40, 9)], 1, 8),
], ids=["window 3", "window 8, blocks of 2", "window 1"])
def test_a_chunks_queries_each_see_their_own_window(chunks, window, block_size):
    """Against chapter 8's contiguous attention with the window's mask, query by query."""
    query, k_cache, v_cache, starts, seq_lens, tables, keys, values = _packed(
        chunks, window, block_size, 2, 6, 16, seed=window)
    scale = 0.25
    expected = torch.cat([
        causal_attention(query[int(starts[r]):int(starts[r + 1])], keys[r], values[r], scale,
                         past=length - new, window=window)
        for r, (length, new) in enumerate(chunks)])
    for attend in (window_varlen_reference, window_varlen_attention):
        out = attend(query, k_cache, v_cache, starts, seq_lens, tables, window, scale)
        assert not out.isnan().any(), f"{attend.__name__} read the null block"
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU (the interpreter runs the small chunks above)")
def test_chunks_over_a_window_at_production_shapes_on_a_gpu():
    """gpt-oss's sliding layers (64 query heads on 8 KV heads of 64, a window of 128, blocks of
    16) over prefill chunks of up to 512 tokens and decodes, in fp16."""
    chunks = [(600, 512), (129, 1), (4096, 1), (300, 300), (2000, 77)]
    query, k_cache, v_cache, starts, seq_lens, tables, keys, values = _packed(
        chunks, 128, 16, 8, 64, 64, seed=4)
    expected = torch.cat([
        causal_attention(query[int(starts[r]):int(starts[r + 1])], keys[r], values[r], 0.125,
                         past=length - new, window=128)
        for r, (length, new) in enumerate(chunks)])
    cuda = [t.to("cuda", torch.float16) if t.is_floating_point() else t.to("cuda")
            for t in (query, k_cache, v_cache, starts, seq_lens, tables)]
    out = window_varlen_attention(*cuda[:6], 128, 0.125)
    torch.testing.assert_close(out.float().cpu(), expected, atol=2e-2, rtol=2e-2)
