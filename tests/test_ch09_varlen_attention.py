"""Chapter 9's attention beyond the checks: a decode batch (every query length 1) is chapter
6's and chapter 7's decode attention; a chunk equals contiguous causal attention over the
request's whole context; the kernel equals the PyTorch version on a mixed batch."""

from __future__ import annotations

import torch

from course.notebook.paged_cases import VarlenCase
from course.tiny_model import causal_attention
from kernels.paged_attention import paged_attention
from kernels.paged_attention_ref import paged_decode_attention
from kernels.varlen_attention import varlen_attention
from kernels.varlen_attention_ref import varlen_paged_attention


def test_a_decode_batch_is_chapter_6_and_7s_decode_attention():
    case = VarlenCase([1, 1, 1], [1, 9, 17], block_size=4, q_heads=4, kv_heads=2)
    query, k_cache, v_cache, starts, seq_lens, tables, scale = case.arguments()
    decoded = paged_decode_attention(query, k_cache, v_cache, tables, seq_lens, scale)
    assert torch.allclose(varlen_paged_attention(*case.arguments()), decoded, atol=1e-5)
    assert torch.allclose(paged_attention(query, k_cache, v_cache, tables, seq_lens, scale),
                          varlen_attention(*case.arguments()), atol=1e-5)


def test_a_chunk_is_causal_attention_over_the_whole_context():
    case = VarlenCase([4], [10], block_size=2, q_heads=4, kv_heads=2)
    got = varlen_paged_attention(*case.arguments())
    want = causal_attention(case.query, case.keys[0], case.values[0], case.scale, past=6)
    assert torch.allclose(got, want, atol=1e-5)


def test_the_kernel_equals_the_reference_on_a_mixed_batch_with_an_odd_head_size():
    case = VarlenCase([3, 1, 5], [3, 7, 12], block_size=2, q_heads=6, kv_heads=2,
                      head_dim=20)
    assert torch.allclose(varlen_attention(*case.arguments()),
                          varlen_paged_attention(*case.arguments()), atol=1e-5)


def test_the_launcher_refuses_what_the_kernel_reads_at_stride_1():
    """The kernel reads head_dim and a block table's entries at stride 1 (the text says so):
    a transposed table or a cache whose last dimension is strided is refused, not misread."""
    import pytest

    case = VarlenCase([3, 1], [3, 7], block_size=2, q_heads=4, kv_heads=2, head_dim=8)
    query, k_cache, v_cache, starts, lens, tables, scale = case.arguments()
    strided_tables = tables.t().contiguous().t()
    strided_cache = torch.empty(*k_cache.shape[:-1], 2 * k_cache.shape[-1])[..., ::2]
    strided_cache.copy_(k_cache)
    assert strided_tables.stride(-1) != 1 and strided_cache.stride(-1) == 2
    for k, v, table in ((k_cache, v_cache, strided_tables),
                        (strided_cache, strided_cache, tables)):
        with pytest.raises(ValueError, match="stride 1"):
            varlen_attention(query, k, v, starts, lens, table, scale)
