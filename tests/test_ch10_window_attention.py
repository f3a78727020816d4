"""Sliding-window paged attention (``kernels.sliding_window_attention``): chapter 9's Triton
kernel given the window's first key, and the PyTorch version, against attention over
contiguous keys with the window's mask, through tables whose slots before the window hold the
null block (filled with NaN, so that a read of it would show), for decodes and prefill chunks,
on the interpreter at small shapes; at production shapes on a GPU.
"""

from __future__ import annotations

import math

import pytest
import torch

from course.tiny_model import causal_attention
from course.v1.hybrid_cache import NULL_BLOCK, free_skipped_blocks
from kernels.sliding_window_attention import window_attention, window_attention_reference

ATTENTIONS = (window_attention_reference, window_attention)


def _packed(chunks: list[tuple[int, int]], window: int, block_size: int, kv_heads: int,
            q_heads: int, head_dim: int, seed: int):
    """Requests of (context after the step, new tokens; a decode is 1): their keys and
    values in shuffled blocks of a pool, the blocks the chunk's first query no longer sees
    given back as the null block (``free_skipped_blocks``), filled with NaN, and the new
    tokens' queries packed. Also each request's keys and values whole, for comparing."""
    generator = torch.Generator().manual_seed(seed)
    blocks_each = [-(-length // block_size) for length, _ in chunks]
    num_blocks = 1 + sum(blocks_each)
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=generator)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=generator)
    k_cache[NULL_BLOCK] = v_cache[NULL_BLOCK] = float("nan")
    ids = (torch.randperm(num_blocks - 1, generator=generator) + 1).tolist()
    width = max(1, *blocks_each)
    tables, keys, values = [], [], []
    for (length, new), count in zip(chunks, blocks_each, strict=True):
        table, ids = ids[:count], ids[count:]
        keys.append(k_cache[table].reshape(-1, kv_heads, head_dim)[:length].clone())
        values.append(v_cache[table].reshape(-1, kv_heads, head_dim)[:length].clone())
        free_skipped_blocks(table, length - new, window, block_size)
        tables.append(table + [NULL_BLOCK] * (width - count))
    queries = torch.randn(sum(new for _, new in chunks), q_heads, head_dim, generator=generator)
    starts = torch.tensor([0] + [new for _, new in chunks]).cumsum(0).to(torch.int32)
    return (queries, k_cache, v_cache, starts,
            torch.tensor([length for length, _ in chunks], dtype=torch.int32),
            torch.tensor(tables, dtype=torch.int32), keys, values)


def _expected(query, starts, keys, values, chunks, window, scale):
    """Chapter 8's contiguous attention with the window's mask, request by request."""
    return torch.cat([
        causal_attention(query[int(starts[r]):int(starts[r + 1])].float(), keys[r].float(),
                         values[r].float(), scale, past=length - new, window=window)
        for r, (length, new) in enumerate(chunks)])


def _decodes(*lengths: int) -> list[tuple[int, int]]:
    return [(length, 1) for length in lengths]


@pytest.mark.parametrize(("chunks", "window", "block_size", "kv_heads", "q_heads", "head_dim"), [
    (_decodes(1, 5, 9, 16, 23), 6, 4, 2, 6, 8),
    (_decodes(1, 7, 8, 40), 1, 8, 1, 4, 16),
    (_decodes(3, 13, 31), 128, 4, 2, 2, 24),
    (_decodes(17, 32, 33, 64), 16, 16, 1, 3, 8),
    ([(9, 4), (1, 1), (23, 23), (16, 1)], 3, 4, 2, 6, 16),
    ([(12, 5), (7, 7), (30, 2)], 8, 2, 2, 6, 16),
    ([(5, 5), (40, 9)], 1, 8, 2, 6, 16),
], ids=["decodes, GQA 3, window 6", "decodes, window 1", "decodes, window past the lengths",
        "decodes, window of one block", "chunks, window 3", "chunks, window 8, blocks of 2",
        "chunks, window 1"])
def test_each_query_sees_its_own_window_alone(chunks, window, block_size, kv_heads, q_heads,
                                              head_dim):
    """Against chapter 8's contiguous attention with the window's mask, query by query."""
    query, k_cache, v_cache, starts, seq_lens, tables, keys, values = _packed(
        chunks, window, block_size, kv_heads, q_heads, head_dim, seed=len(chunks) + window)
    scale = 1 / math.sqrt(head_dim)
    expected = _expected(query, starts, keys, values, chunks, window, scale)
    for attend in ATTENTIONS:
        out = attend(query, k_cache, v_cache, starts, seq_lens, tables, window, scale)
        assert not out.isnan().any(), f"{attend.__name__} read the null block"
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)


def test_the_comparison_catches_attention_over_every_token():
    chunks = _decodes(9, 23)
    query, _, _, starts, _, _, keys, values = _packed(chunks, 6, 4, 2, 6, 8, seed=1)
    everything = _expected(query, starts, keys, values, chunks, 10**6, 0.35)
    assert not torch.allclose(everything, _expected(query, starts, keys, values, chunks, 6, 0.35))


@pytest.mark.parametrize(("window", "error"), [(0, ValueError), (-3, ValueError),
                                               (2.0, TypeError), (True, TypeError)])
def test_a_window_that_is_not_a_positive_int_is_refused(window, error):
    query, k_cache, v_cache, starts, seq_lens, tables, _, _ = _packed(_decodes(5), 4, 4, 1, 1,
                                                                      8, seed=0)
    for attend in ATTENTIONS:
        with pytest.raises(error, match="window"):
            attend(query, k_cache, v_cache, starts, seq_lens, tables, window, 0.3)


def test_bf16_is_computed_in_fp32_and_returned_in_bf16():
    chunks = _decodes(5, 12)
    query, k_cache, v_cache, starts, seq_lens, tables, keys, values = _packed(
        chunks, 4, 4, 1, 2, 8, seed=2)
    bf16 = [t.to(torch.bfloat16) for t in (query, k_cache, v_cache)]
    out = window_attention(*bf16, starts, seq_lens, tables, 4, 0.35)
    assert out.dtype == torch.bfloat16
    expected = _expected(query, starts, keys, values, chunks, 4, 0.35)
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU (the interpreter runs the small shapes above)")
@pytest.mark.parametrize(("chunks", "dtype"), [
    (_decodes(1, 127, 128, 129, 1000, 4096, 2049, 300), torch.bfloat16),
    ([(600, 512), (129, 1), (4096, 1), (300, 300), (2000, 77)], torch.float16),
], ids=["decodes to 4,096 tokens, bf16", "prefill chunks to 512 tokens and decodes, fp16"])
def test_a_window_at_production_shapes_on_a_gpu(chunks, dtype):
    """gpt-oss's sliding layers: 64 query heads on 8 KV heads of 64, a window of 128, blocks
    of 16."""
    query, k_cache, v_cache, starts, seq_lens, tables, keys, values = _packed(
        chunks, 128, 16, 8, 64, 64, seed=len(chunks))
    expected = _expected(query, starts, keys, values, chunks, 128, 0.125)
    cuda = [t.to("cuda", dtype) if t.is_floating_point() else t.to("cuda")
            for t in (query, k_cache, v_cache, starts, seq_lens, tables)]
    out = window_attention(*cuda, 128, 0.125)
    torch.testing.assert_close(out.float().cpu(), expected, atol=2e-2, rtol=2e-2)
