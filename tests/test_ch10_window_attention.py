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

from course.hybrid_cache import NULL_BLOCK, free_skipped_blocks
from course.tiny_model import causal_attention
from kernels.sliding_window_attention import window_attention, window_attention_reference

ATTENTIONS = (window_attention_reference, window_attention)


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
    expected = _expected(query, starts, keys, values, chunks, window, 0.25)
    for attend in ATTENTIONS:
        out = attend(query, k_cache, v_cache, starts, seq_lens, tables, window, 0.25)
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
    expected = _expected(query, starts, keys, values, chunks, 128, 0.125)
    cuda = [t.to("cuda", torch.float16) if t.is_floating_point() else t.to("cuda")
            for t in (query, k_cache, v_cache, starts, seq_lens, tables)]
    out = window_attention(*cuda, 128, 0.125)
    torch.testing.assert_close(out.float().cpu(), expected, atol=2e-2, rtol=2e-2)


def _expected(query, starts, keys, values, chunks, window, scale):
    """Chapter 8's contiguous attention with the window's mask, request by request."""
    return torch.cat([
        causal_attention(query[int(starts[r]):int(starts[r + 1])].float(), keys[r].float(),
                         values[r].float(), scale, past=length - new, window=window)
        for r, (length, new) in enumerate(chunks)])


@pytest.mark.parametrize(("lengths", "window", "block_size", "kv_heads", "q_heads", "head_dim"), [
    ([1, 5, 9, 16, 23], 6, 4, 2, 6, 8),
    ([1, 7, 8, 40], 1, 8, 1, 4, 16),
    ([3, 13, 31], 128, 4, 2, 2, 24),
    ([17, 32, 33, 64], 16, 16, 1, 3, 8),
], ids=["GQA 3, window 6", "window 1", "window past the lengths", "window of one block"])
def test_decodes_see_the_window_alone(lengths, window, block_size, kv_heads, q_heads, head_dim):
    chunks = [(length, 1) for length in lengths]
    query, k_cache, v_cache, starts, seq_lens, tables, keys, values = _packed(
        chunks, window, block_size, kv_heads, q_heads, head_dim, seed=len(lengths))
    scale = 1 / math.sqrt(head_dim)
    expected = _expected(query, starts, keys, values, chunks, window, scale)
    for attend in ATTENTIONS:
        out = attend(query, k_cache, v_cache, starts, seq_lens, tables, window, scale)
        assert not out.isnan().any(), f"{attend.__name__} read the null block"
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)


def test_the_comparison_catches_attention_over_every_token():
    chunks = [(9, 1), (23, 1)]
    query, _, _, starts, _, _, keys, values = _packed(chunks, 6, 4, 2, 6, 8, seed=1)
    everything = _expected(query, starts, keys, values, chunks, 10**6, 0.35)
    assert not torch.allclose(everything, _expected(query, starts, keys, values, chunks, 6, 0.35))


@pytest.mark.parametrize(("window", "error"), [(0, ValueError), (-3, ValueError),
                                               (2.0, TypeError), (True, TypeError)])
def test_a_window_that_is_not_a_positive_int_is_refused(window, error):
    query, k_cache, v_cache, starts, seq_lens, tables, _, _ = _packed([(5, 1)], 4, 4, 1, 1, 8,
                                                                      seed=0)
    for attend in ATTENTIONS:
        with pytest.raises(error, match="window"):
            attend(query, k_cache, v_cache, starts, seq_lens, tables, window, 0.3)


def test_bf16_is_computed_in_fp32_and_returned_in_bf16():
    chunks = [(5, 2), (12, 1)]
    query, k_cache, v_cache, starts, seq_lens, tables, keys, values = _packed(
        chunks, 4, 4, 1, 2, 8, seed=2)
    bf16 = [t.to(torch.bfloat16) for t in (query, k_cache, v_cache)]
    out = window_attention(bf16[0], bf16[1], bf16[2], starts, seq_lens, tables, 4, 0.35)
    assert out.dtype == torch.bfloat16
    expected = _expected(query, starts, keys, values, chunks, 4, 0.35)
    torch.testing.assert_close(out.float(), expected, atol=3e-2, rtol=3e-2)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU (the interpreter runs the small shapes above)")
def test_decodes_over_a_window_at_production_shapes_on_a_gpu():
    """gpt-oss's sliding layers: 64 query heads on 8 KV heads of 64, a window of 128, blocks
    of 16, lengths from 1 to 4,096, in bf16."""
    chunks = [(n, 1) for n in (1, 127, 128, 129, 1000, 4096, 2049, 300)]
    query, k_cache, v_cache, starts, seq_lens, tables, keys, values = _packed(
        chunks, 128, 16, 8, 64, 64, seed=3)
    expected = _expected(query, starts, keys, values, chunks, 128, 0.125)
    cuda = [t.to("cuda", torch.bfloat16) if t.is_floating_point() else t.to("cuda")
            for t in (query, k_cache, v_cache, starts, seq_lens, tables)]
    out = window_attention(*cuda, 128, 0.125)
    torch.testing.assert_close(out.float().cpu(), expected, atol=2e-2, rtol=2e-2)
