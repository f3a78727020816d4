"""Chapter 7's production-shape cases, run by the thorough wrapper check on a CUDA GPU only.

Cases are built on the GPU in a few tensor operations (a slot-by-slot build would take
minutes at these sizes): a NaN-filled pool, whole blocks of random K/V at shuffled places,
the slots past each sequence's end set back to NaN. Expected outputs come from chapter 6's
fp32 reference on the same tensors.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from kernels.paged_attention_ref import paged_decode_attention

SEED = 2028
_TOLERANCE = {torch.float32: (2e-3, 2e-3), torch.float16: (3e-3, 1e-2),
              torch.bfloat16: (2e-2, 5e-2)}
INT32_BLOCKS = 2**31 // (16 * 8 * 128) + 1
"""Blocks of 16 tokens x 8 KV heads x 128 dims before a pool's offsets pass 2^31."""


def _case(lengths, block_size, q_heads, kv_heads, head_dim, dtype, first_block=0, seed=SEED):
    gen = torch.Generator("cuda").manual_seed(seed)
    per_seq = [-(-n // block_size) for n in lengths]
    used = sum(per_seq)
    shape = (first_block + used + 1, block_size, kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
    v_cache = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
    blocks = first_block + torch.randperm(used, generator=gen, device="cuda")
    k_cache[blocks] = torch.randn((used, *shape[1:]), generator=gen, device="cuda").to(dtype)
    v_cache[blocks] = torch.randn((used, *shape[1:]), generator=gen, device="cuda").to(dtype)
    tables = torch.zeros(len(lengths), max(per_seq), dtype=torch.int32, device="cuda")
    start = 0
    for seq, (length, count) in enumerate(zip(lengths, per_seq, strict=True)):
        tables[seq, :count] = blocks[start:start + count].int()
        start += count
        tail = length % block_size
        if tail:  # the last block's unused slots hold garbage
            k_cache[tables[seq, count - 1].long(), tail:] = float("nan")
            v_cache[tables[seq, count - 1].long(), tail:] = float("nan")
    query = torch.randn((len(lengths), q_heads, head_dim), generator=gen, device="cuda")
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    return query.to(dtype), k_cache, v_cache, tables, seq_lens, 1 / math.sqrt(head_dim)


def production_cases():
    """(description, case arguments): contexts to 32k, batches to 256, block sizes 16 and
    32, heads 32/8 and 64/8, head dims 64 to 256, and a pool past 2^31 elements."""
    mixed = torch.randint(1, 2049, (256,), generator=torch.Generator().manual_seed(SEED))
    return [
        ("batch 1, 32k tokens, Llama-3-8B heads, bf16", ([32768], 16, 32, 8, 128,
                                                         torch.bfloat16)),
        ("lengths 32768/1/4097/30000, 64/8 heads, blocks of 32, fp16",
         ([32768, 1, 4097, 30000], 32, 64, 8, 128, torch.float16)),
        ("batch 256, lengths 1 to 2048, bf16", (mixed.tolist(), 16, 32, 8, 128,
                                                torch.bfloat16)),
        ("head dim 64, bf16", ([1000, 3000, 17], 16, 32, 8, 64, torch.bfloat16)),
        ("head dim 256, blocks of 32, bf16", ([1000, 3000, 17], 32, 32, 8, 256,
                                              torch.bfloat16)),
        ("fp32 (TF32 dots)", ([4097, 2], 16, 32, 8, 128, torch.float32)),
        (f"a pool of {INT32_BLOCKS + 200} blocks (more than 2^31 elements), fp16",
         ([40, 3000], 16, 32, 8, 128, torch.float16, INT32_BLOCKS)),
    ]


def check_production_shapes(fn: Callable) -> None:
    """``fn`` (a ``paged_attention`` wrapper) against chapter 6's reference on each case."""
    for description, arguments in production_cases():
        query, k_cache, v_cache, tables, seq_lens, scale = _case(*arguments)
        out = fn(query, k_cache, v_cache, tables, seq_lens, scale)
        want = paged_decode_attention(query, k_cache, v_cache, tables, seq_lens, scale)
        atol, rtol = _TOLERANCE[query.dtype]
        if out.isnan().any() or not torch.allclose(out.float(), want.float(), atol=atol,
                                                   rtol=rtol):
            error = (out.float() - want.float()).abs().nan_to_num(float("inf")).max().item()
            hint = ("Offsets past 2^31 wrap in int32: cast the block number to int64 before "
                    "multiplying by the block stride. " if "2^31" in description else "")
            raise AssertionError(f"paged_attention(...) on a GPU, {description}: off by up to "
                                 f"{error:.3g}. {hint}")
        del query, k_cache, v_cache, out, want
        torch.cuda.empty_cache()
