"""Chapter 13 solved another way: scales from a stack of each head's largest magnitude, e4m3
bytes found by searching a table of the format's numbers, the absorbed decode head by head
with plain matrix products, records assembled byte by byte with ``struct``, and the decoder
as (8 + mantissa) times a power of two.

Each function stands alone (``tests/notebook_variants.py`` puts its source alone in the
notebook's cell), using only what the notebook imports."""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from course.v1.mla_engine import latent_attention
from kernels.latent_record import tile_scale


def kv_scale(x, range_constant, per_head=False):
    maxima = torch.stack([x[:, head].detach().float().abs().max()
                          for head in range(x.shape[1])])
    if not per_head:
        maxima = maxima.max()
    return (maxima / range_constant).masked_fill(maxima == 0, 1.0)


def quantize_fp8(x, scale):
    # the numbers of the bytes 0x00 .. 0x7E, in order: (8 + m) x 2^(e - 10), or m x 2^-9
    codes = torch.arange(0x7F)
    exponent, mantissa = codes >> 3, (codes & 7).double()
    table = torch.where(exponent == 0, mantissa * 2.0**-9,
                        (8 + mantissa) * torch.pow(2.0, exponent.double() - 10))
    per_head = scale.float().expand(x.shape[-2]) if scale.dim() == 0 else scale.float()
    q = (x.float() / per_head.unsqueeze(-1)).double()
    m = q.abs().clamp(max=448.0)
    low = (torch.searchsorted(table, m, right=True) - 1).clamp(0, 0x7E)
    high = (low + 1).clamp(max=0x7E)
    below, above = m - table[low], table[high] - m
    pick = torch.where((above < below) | ((above == below) & (low % 2 == 1)), high, low)
    byte = pick + 0x80 * torch.signbit(q).long()
    return torch.where(q.isnan(), 0x7F, byte).to(torch.uint8)


def absorbed_decode(query, latent_cache, seq_lens, block_tables, w_uk, w_uv, scale,
                    attention=latent_attention):
    heads, nope, rank = w_uk.shape
    rows = []
    for head in range(heads):
        q_latent = query[:, head, :nope] @ w_uk[head]  # [seqs, rank]
        rows.append(torch.cat([q_latent, query[:, head, nope:]], dim=1))
    latents = attention(torch.stack(rows, dim=1), latent_cache, seq_lens, block_tables, scale,
                        rank)
    return torch.stack([latents[:, head] @ w_uv[head].T for head in range(heads)], dim=1)


def pack_latent_fp8(latent, rope, record):
    import struct

    codes = torch.arange(0x7F)
    exponent, mantissa = codes >> 3, (codes & 7).double()
    table = torch.where(exponent == 0, mantissa * 2.0**-9,
                        (8 + mantissa) * torch.pow(2.0, exponent.double() - 10))
    order = "<" if sys.byteorder == "little" else ">"
    out = []
    for token in range(latent.shape[0]):
        raw = b""
        scales = []
        for t in range(record.num_tiles):
            tile = latent[token, t * record.tile:(t + 1) * record.tile].float()
            scale = tile_scale(tile.abs().max())
            q = (tile / scale).double()
            m = q.abs().clamp(max=448.0)
            low = (torch.searchsorted(table, m, right=True) - 1).clamp(0, 0x7E)
            high = (low + 1).clamp(max=0x7E)
            below, above = m - table[low], table[high] - m
            pick = torch.where((above < below) | ((above == below) & (low % 2 == 1)), high,
                               low)
            raw += bytes((pick + 0x80 * torch.signbit(q).long()).tolist())
            scales.append(float(scale))
        raw += struct.pack(f"{order}{len(scales)}f", *scales)
        rotary = rope[token].to(torch.bfloat16).view(torch.int16).tolist()
        raw += struct.pack(f"{order}{len(rotary)}h", *rotary)
        out.append(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
    return torch.stack(out)


@triton.jit
def e4m3_to_float(bits):
    code = bits.to(tl.int32)
    magnitude_bits = code & 0x7F
    exponent = magnitude_bits >> 3
    mantissa = (magnitude_bits & 7).to(tl.float32)
    # 2^(exponent - 10) as float32 bits: (8 + mantissa) x 2^(exponent - 10) for a normal byte;
    # exponent 0 is mantissa x 2^-9, the same power with no leading 8
    power = ((tl.maximum(exponent, 1) + 117) << 23).to(tl.float32, bitcast=True)
    magnitude = tl.where(exponent == 0, mantissa, mantissa + 8.0) * power
    value = tl.where(code >= 128, -magnitude, magnitude)
    return tl.where(magnitude_bits == 0x7F, float("nan"), value)
