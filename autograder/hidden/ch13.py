"""Chapter 13's hidden checks: hypothesis-drawn batches, scales, latent caches and records, and
the decode kernel over FP8 records, each checked against an oracle written another way: scales
by a loop over heads in Python floats; e4m3 bytes by a search of the table of all 256 e4m3
numbers (built from the format's formula) for the nearest, ties to the even byte, never by
PyTorch's cast; the absorbed decode by attention over every head's keys and values
up-projected from the records, its softmax written out, in float64; records token by token
and tile by tile, each scale's power of two from ``math.frexp``, the rotary key's bfloat16 by
its bits; the decoder against the formula over every byte, then inside the decode kernel
against PyTorch reading the same records. And the known mistakes a hint names.
"""

from __future__ import annotations

import bisect
import math
import struct
import sys
from collections.abc import Callable

import numpy as np
import torch
from hypothesis import strategies as st

from autograder.checks._helpers import for_all, learner_call
from autograder.checks.ch07_audit import quiet
from autograder.checks.ch13 import (
    E4M3_IDEA,
    PACK_CASES,
    QUANTIZE_CASES,
    SEED,
    LatentCase,
    output_close,
    pack_inputs,
    run_absorbed,
    run_bytes,
    run_pack,
    run_quantize,
    run_scale,
)
from autograder.private import thorough
from course.notebook.paged_cases import kernel_device, on_gpu
from kernels.latent_record import LatentRecord

# --- e4m3, from the format's formula ----------------------------------------------------------


def _e4m3(code: int) -> float:
    """The number byte ``code`` stands for: sign bit 7, exponent bits 6..3 (bias 7), mantissa
    bits 2..0; exponent 0 subnormal; 0x7F and 0xFF NaN."""
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = (code >> 3) & 0xF, code & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return math.nan
    if exponent == 0:
        return sign * mantissa * 2.0**-9
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


E4M3 = [_e4m3(code) for code in range(256)]
_MAGNITUDES = E4M3[:0x7F]  # 0x00 .. 0x7E: 0 up to 448, increasing with the byte
_LARGEST = _MAGNITUDES[-1]


def _nearest(q: float, ties: str = "even", toward_zero: bool = False,
             largest: float = _LARGEST) -> int:
    """The byte of the e4m3 number nearest ``q`` once saturated to [-largest, largest]; a tie
    to the even byte (``ties="away"``: to the larger magnitude); ``toward_zero``: the
    largest magnitude not above |q| instead. A negative number that rounds to zero is 0x80."""
    if math.isnan(q):
        return 0x7F
    sign = 0x80 if math.copysign(1.0, q) < 0 else 0
    m = min(abs(q), largest)
    i = bisect.bisect_right(_MAGNITUDES, m) - 1  # _MAGNITUDES[i] <= m
    if i < len(_MAGNITUDES) - 1 and not toward_zero:
        below, above = m - _MAGNITUDES[i], _MAGNITUDES[i + 1] - m
        if above < below or (above == below and (ties == "away" or i % 2 == 1)):
            i += 1
    return sign | i


def _f32(value: float) -> float:
    """``value`` rounded to float32."""
    with np.errstate(all="ignore"):
        return float(np.float32(value))


def _divided(x: float, s: float) -> float:
    """x / s in float32, as a float32 tensor divides (inf past its range)."""
    with np.errstate(all="ignore"):
        return float(np.float32(x) / np.float32(s))


# --- kv_scale ---------------------------------------------------------------------------------


def _head_extremes(x: torch.Tensor) -> list[tuple[float, float]]:
    """Per KV head, looping in Python floats: (largest |value|, the largest value)."""
    tokens, heads, dim = x.shape
    values = x.double().tolist()
    found = []
    for h in range(heads):
        row = [values[t][h][d] for t in range(tokens) for d in range(dim)]
        found.append((max(abs(v) for v in row), max(row)))
    return found


def _scale_with(x, range_constant, per_head, size=lambda magnitude, largest: magnitude,
                divisor=None, zero=1.0):
    """Scales per head (or over the whole batch) from ``size`` of each head's extremes."""
    divisor = divisor or range_constant
    extremes = _head_extremes(x)
    if not per_head:
        extremes = [(max(m for m, _ in extremes), max(v for _, v in extremes))]
    scales = [size(m, v) / divisor if m > 0 else zero for m, v in extremes]
    return torch.tensor(scales if per_head else scales[0], dtype=torch.float32)


_SCALE_MISTAKES = [
    (lambda x, range_constant, per_head: _scale_with(x, range_constant, per_head,
                                                     size=lambda m, v: v),
     "It matches the largest value, not the largest absolute value: a batch whose largest "
     "magnitude is negative is scaled by that magnitude, so that x / scale stays within "
     "[-448, 448] both ways."),
    (lambda x, range_constant, per_head: _scale_with(x, range_constant, per_head,
                                                     divisor=448.0),
     "It matches dividing by 448, e4m3's largest number: the scale divides by range_constant, "
     "as given (vLLM's 200 for keys, 100 for values), which leaves headroom for later values "
     "larger than the calibration's."),
    (lambda x, range_constant, per_head: _scale_with(x, range_constant, per_head, zero=0.0),
     "A scale is never 0 (x / 0 would be inf or NaN): where every value is 0 (the whole batch, "
     "or per_head a head of zeros), the scale is 1.0."),
]


def scale_case(x: torch.Tensor, range_constant: float, per_head: bool) -> dict:
    case = dict(x=x, range_constant=range_constant, per_head=per_head)
    known = []
    for wrong, text in _SCALE_MISTAKES:
        value = wrong(**case)
        same = value.shape == _scale_with(**case).shape and torch.equal(value,
                                                                         _scale_with(**case))
        known.append((None if same else value, text))
    return {"want": _scale_with(**case), "known": known}


def _about(x: torch.Tensor) -> str:
    """The largest |value| of each head, with its sign: what a scale is made of."""
    sizes = []
    for magnitude, largest in _head_extremes(x):
        sign = "" if magnitude == 0 or largest == magnitude else "-"
        sizes.append(f"{sign}{magnitude:.3g}" if magnitude else "0 (all zeros)")
    return f"each head's largest |value|, signed: {', '.join(sizes)}"


@st.composite
def _batches(draw):
    tokens, heads, dim = draw(st.integers(1, 6)), draw(st.integers(1, 4)), draw(st.integers(1, 8))
    sizes = draw(st.lists(st.one_of(st.none(), st.integers(-6, 4)), min_size=heads,
                          max_size=heads))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    x = torch.randn(tokens, heads, dim, generator=gen)
    x *= torch.tensor([0.0 if e is None else 10.0**e for e in sizes])[None, :, None]
    return dict(x=x, range_constant=draw(st.sampled_from([100.0, 200.0, 448.0])),
                per_head=draw(st.booleans()))


@thorough
def check_kv_scale_thoroughly(fn: Callable) -> None:
    """Drawn batches of 1 to 6 tokens and 1 to 4 heads of 1 to 8 values, each head 10^-6 to
    10^4 in size or all zeros, per tensor and per head, range constants 100, 200 and 448."""
    for_all(_batches(), lambda case: run_scale(fn, case, _about(case["x"]),
                                                 scale_case(**case)))


# --- quantize_fp8 -----------------------------------------------------------------------------


def _bytes_with(x: torch.Tensor, scale: torch.Tensor, divide=_divided,
                divisor=lambda scales, h, d: scales[h], **rounding) -> torch.Tensor:
    """Value by value: divided by its head's scale (``divisor``), then the nearest byte."""
    heads, dim = x.shape[-2:]
    rows = x.reshape(-1, heads, dim).tolist()
    scales = scale.reshape(-1).tolist() * (heads if scale.dim() == 0 else 1)
    codes = [[[_nearest(divide(v, divisor(scales, h, d)), **rounding) for d, v in enumerate(row)]
              for h, row in enumerate(token)] for token in rows]
    return torch.tensor(codes, dtype=torch.uint8).reshape(x.shape)


def _on_the_last_dim(x, scale):
    heads, dim = x.shape[-2:]
    if scale.dim() == 0 or heads != dim or heads == 1:
        return None
    return _bytes_with(x, scale, divisor=lambda scales, h, d: scales[d])


_QUANTIZE_MISTAKES = [
    (lambda x, scale: _bytes_with(x, scale, divide=lambda v, s: _f32(_f32(v) * _f32(s))),
     "It matches x times the scale: a write stores x / scale, which a read multiplies back "
     "by the scale."),
    (_on_the_last_dim,
     "It matches scale[j] dividing position j of head_dim: head h's values x[..., h, :] are "
     "divided by scale[h], a scale [num_kv_heads] lined up with x's dimension -2."),
    (lambda x, scale: _bytes_with(x, scale, toward_zero=True),
     "It matches rounding toward zero: each value becomes the nearest e4m3 number, below or "
     "above it."),
    (lambda x, scale: _bytes_with(x, scale, ties="away"),
     "It matches ties rounded away from zero: a value halfway between two e4m3 numbers goes "
     "to the one whose byte is even (ties to even, as PyTorch's cast does)."),
    (lambda x, scale: _bytes_with(x, scale, largest=240.0),
     "It matches saturating at 240 (the largest of e4m3fnuz, AMD's variant): float8_e4m3fn's "
     "largest is 448, so values are kept within [-448, 448]."),
]


def quantize_case(x: torch.Tensor, scale: torch.Tensor) -> dict:
    """The bytes, divided in float32 (``want``) and in float64 (``also``: as right), and what
    the known mistakes give (None where they give the same numbers)."""
    want = _bytes_with(x, scale)
    numbers = torch.tensor(E4M3, dtype=torch.float64)
    same = lambda a, b: bool(((numbers[a.long()] == numbers[b.long()])  # noqa: E731
                              | (numbers[a.long()].isnan() & numbers[b.long()].isnan())).all())
    known = []
    for wrong, text in _QUANTIZE_MISTAKES:
        value = wrong(x, scale)
        known.append((None if value is None or same(value, want) else value, text))
    return {"want": want, "also": _bytes_with(x, scale, divide=lambda v, s: v / s),
            "known": known}


def _ties(count: int, gen: torch.Generator) -> torch.Tensor:
    """``count`` numbers halfway between two neighbouring e4m3 numbers, either sign."""
    lower = torch.randint(0, 0x7E, (count,), generator=gen).tolist()
    sign = torch.randint(0, 2, (count,), generator=gen).tolist()
    return torch.tensor([(-1.0 if s else 1.0) * (E4M3[i] + E4M3[i + 1]) / 2
                         for i, s in zip(lower, sign, strict=True)])


@st.composite
def _quantize_cases(draw):
    lead = draw(st.lists(st.integers(1, 3), max_size=2))
    heads, dim = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    per_head = draw(st.booleans())
    ties = draw(st.booleans())
    exponents = draw(st.lists(st.integers(-12, 8), min_size=heads, max_size=heads))
    factor = 1.0 if ties else draw(st.sampled_from([1.0, 0.7, 1.3]))
    scales = torch.tensor([factor * 2.0**e for e in exponents], dtype=torch.float32)
    if not per_head:
        scales = scales[:1].expand(heads)
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    shape = (*lead, heads, dim)
    # x / scale from 10^-7 (zero) through e4m3's subnormals to 10^3 (past 448)
    ratio = torch.randn(shape, generator=gen) * 10.0 ** (torch.rand(shape, generator=gen) * 10
                                                         - 7)
    if ties:
        pick = torch.rand(shape, generator=gen) < 0.5
        ratio[pick] = _ties(int(pick.sum()), gen)
    x = (ratio * scales[:, None]).float()
    text = ("values 10^-7 to 10^3 times their head's scale"
            + (", about half halfway between two e4m3 numbers" if ties else ""))
    return dict(x=x, scale=scales.clone() if per_head else scales[0].clone()), text


@thorough
def check_quantize_fp8_thoroughly(fn: Callable) -> None:
    """The visible cases, then drawn ones: 0 to 2 leading dimensions, 1 to 4 heads of 1 to 6
    values, one scale or one per head (2^-12 to 2^8), values from 10^-7 to 10^3 times their
    scale (zero, e4m3's subnormals, past the range), ties."""
    for case, text in QUANTIZE_CASES:
        run_quantize(fn, case, text, quantize_case(**case))
    for_all(_quantize_cases(), lambda drawn: run_quantize(fn, drawn[0], drawn[1],
                                                            quantize_case(**drawn[0])))


# --- absorbed_decode --------------------------------------------------------------------------


def _records(case: LatentCase, args: dict, seq: int) -> torch.Tensor:
    """Sequence ``seq``'s records, position by position through its block table: float64."""
    table = args["block_tables"][seq].tolist()
    return torch.stack([args["latent_cache"][table[p // case.block_size], p % case.block_size]
                        for p in range(case.lens[seq])]).double()


def _full_attention(case: LatentCase, args: dict, rope: bool = True, uv_head: int | None = None,
                    uk_transposed: bool = False, scale: float | None = None,
                    up: bool = True) -> torch.Tensor | None:
    """Every head's keys and values up-projected from the records, and softmax attention
    written out, in float64: [num_seqs, heads, v_dim]. The keywords model mistakes (None
    where the shapes do not allow one)."""
    if (uk_transposed and case.nope != case.rank) or (not up and case.v_dim > case.rank):
        return None
    scale = args["scale"] if scale is None else scale
    w_uk, w_uv = args["w_uk"].double(), args["w_uv"].double()
    out = torch.empty(len(case.lens), case.heads, case.v_dim, dtype=torch.float64)
    for seq in range(len(case.lens)):
        records = _records(case, args, seq)
        latent, k_pe = records[:, :case.rank], records[:, case.rank:]
        query = args["query"][seq].double()
        for h in range(case.heads):
            k_nope = latent @ (w_uk[h] if uk_transposed else w_uk[h].T)
            value = latent @ w_uv[h if uv_head is None else uv_head].T if up \
                else latent[:, :case.v_dim]
            scores = [scale * (float(query[h, :case.nope] @ k_nope[t])
                               + (float(query[h, case.nope:] @ k_pe[t]) if rope else 0.0))
                      for t in range(len(records))]
            top = max(scores)
            weights = torch.tensor([math.exp(s - top) for s in scores], dtype=torch.float64)
            out[seq, h] = (weights / weights.sum()) @ value
    return out


def _absorbed(case: LatentCase, args: dict) -> torch.Tensor:
    """The absorbed query, head by head: [q_nope[h] @ w_uk[h] ; q_pe[h]], float64."""
    query, w_uk = args["query"].double(), args["w_uk"].double()
    rows = [[torch.cat([query[s, h, :case.nope] @ w_uk[h], query[s, h, case.nope:]])
             for h in range(case.heads)] for s in range(len(case.lens))]
    return torch.stack([torch.stack(row) for row in rows])


def _rope_first(case: LatentCase, args: dict) -> torch.Tensor:
    """What attention over the records gives for [q_pe[h] ; q_nope[h] @ w_uk[h]], each head's
    sum of latents up-projected."""
    absorbed = _absorbed(case, args)
    swapped = torch.cat([absorbed[..., case.rank:], absorbed[..., :case.rank]], dim=-1)
    out = torch.empty(len(case.lens), case.heads, case.v_dim, dtype=torch.float64)
    for seq in range(len(case.lens)):
        records = _records(case, args, seq)
        weights = torch.softmax(records @ swapped[seq].T * args["scale"], dim=0)  # [t, heads]
        for h in range(case.heads):
            out[seq, h] = args["w_uv"][h].double() @ (weights[:, h] @ records[:, :case.rank])
    return out


_ABSORBED_MISTAKES = [
    (lambda case, args: _full_attention(case, args, rope=False),
     "It matches scores without the rotary part: the absorbed query is q_nope[h] @ w_uk[h] "
     "followed by q_pe[h] (rank + rope values), whose rope part meets each record's rotary "
     "key."),
    (_rope_first,
     "It matches q_pe[h] put first: the absorbed query is the latent part, then q_pe[h], in "
     "the order of a record [latent ; rotary key]."),
    (lambda case, args: _full_attention(case, args, uk_transposed=True),
     "It matches q_nope[h] @ w_uk[h] transposed: w_uk[h] is [nope, rank], and head h's "
     "latent query is q_nope[h] @ w_uk[h], [nope] x [nope, rank] = [rank]."),
    (lambda case, args: _full_attention(case, args, uv_head=0),
     "It matches every head up-projected with head 0's w_uv: head h's output is its own sum "
     "times w_uv[h] transposed."),
    (lambda case, args: _full_attention(case, args, up=False),
     "It matches the weighted sum of latents itself, cut to v_dim values: head h's output is "
     "that sum up-projected, times w_uv[h] transposed ([rank] x [rank, v_dim])."),
    (lambda case, args: _full_attention(case, args, scale=1 / math.sqrt(case.rank + case.rope)),
     "It matches scores scaled by 1 / sqrt(rank + rope): the scale is the model's, passed to "
     "attention as given; absorbing changes the query's length, not its scores."),
]


def absorbed_answers(**spec) -> dict:
    """The output from full keys and values, the absorbed query, and what the known mistakes
    give (None where the shapes do not allow one, or it gives the same output)."""
    case = LatentCase(**{**spec, "lens": tuple(spec["lens"])})
    args = case.inputs()
    want = _full_attention(case, args)
    known = []
    for wrong, text in _ABSORBED_MISTAKES:
        value = wrong(case, args)
        known.append((None if value is None or output_close(value, want) else value, text))
    return {"want": want, "absorbed": _absorbed(case, args), "known": known}


@st.composite
def _latent_cases(draw):
    rank = draw(st.sampled_from([4, 8, 16]))
    square = draw(st.booleans())
    return LatentCase(
        lens=tuple(draw(st.lists(st.integers(1, 20), min_size=1, max_size=4))),
        block_size=draw(st.sampled_from([1, 2, 4, 8])), heads=draw(st.integers(1, 6)),
        nope=rank if square else draw(st.sampled_from([2, 4, 8, 16])),
        rope=draw(st.sampled_from([2, 4, 8])), rank=rank,
        v_dim=draw(st.sampled_from([2, 4, rank, 12])), seed=draw(st.integers(0, 2**16)),
        model=draw(st.booleans()), given=draw(st.booleans()))


_ABSORBED_CASES = [  # the tiny model's shapes with 8 heads, long sequences, blocks of 16
    LatentCase((3, 17, 1, 40), 16, 8, 16, 8, 32, 16, model=True),
    LatentCase((33, 2), 1, 2, 8, 8, 8, 8, given=False),
]


def _run_absorbed(fn: Callable, case: LatentCase) -> None:
    run_absorbed(fn, case, absorbed_answers(**case.spec()))


@thorough
def check_absorbed_decode_thoroughly(fn: Callable) -> None:
    """Drawn batches of 1 to 4 sequences of 1 to 20 tokens, blocks of 1 to 8 (shuffled, NaN
    in unused slots), 1 to 6 heads, ranks 4 to 16 (square ones: nope = rank), random weights
    or the tiny MLA model's own, the attention given or left to its default; then the tiny
    model's shapes with 8 heads over up to 40 tokens in blocks of 16, and a square one (nope =
    rank = rope) over 33 tokens in blocks of 1."""
    for_all(_latent_cases(), lambda case: _run_absorbed(fn, case), max_examples=80)
    for case in _ABSORBED_CASES:
        _run_absorbed(fn, case)


# --- pack_latent_fp8 --------------------------------------------------------------------------


def _power_at_or_above(ratio: float) -> float:
    """The smallest power of two at or above ``ratio`` (> 0): ``ratio`` = m x 2^e with m in
    [0.5, 1), so 2^e, or 2^(e - 1) where m is 0.5 (``ratio`` a power of two itself)."""
    m, e = math.frexp(ratio)
    return 2.0 ** (e - 1) if m == 0.5 else 2.0**e


_FLOOR = _f32(1e-4)  # FlashMLA's, in float32


def _tile_scale(amax: float, floor: bool = True, power: bool = True) -> float:
    ratio = _divided(amax, 448.0)
    if floor:
        ratio = max(ratio, _FLOOR)
    if not power:
        return ratio
    return _power_at_or_above(ratio) if ratio > 0 else 0.0


def _bf16_bytes(value: float, half: bool = False) -> bytes:
    """``value``'s bfloat16 (``half``: float16) in the machine's order: bfloat16 is float32's
    upper 16 bits, rounded to nearest, ties to even."""
    order = "<" if sys.byteorder == "little" else ">"
    if half:
        return struct.pack(f"{order}e", value)
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return struct.pack(f"{order}H", bits)


def _records_with(latent: torch.Tensor, rope: torch.Tensor, record: LatentRecord,
                  token_scale: bool = False, strided: bool = False, floor: bool = True,
                  power: bool = True, scales_last: bool = False, half: bool = False
                  ) -> torch.Tensor:
    """Token by token, tile by tile: the latent's bytes, the scales, the rotary key. The
    keywords model mistakes."""
    order = "<" if sys.byteorder == "little" else ">"
    records = []
    for values, rotary in zip(latent.tolist(), rope.tolist(), strict=True):
        tiles = ([values[t::record.num_tiles] for t in range(record.num_tiles)] if strided
                 else [values[t * record.tile:(t + 1) * record.tile]
                       for t in range(record.num_tiles)])
        whole = max(abs(v) for v in values)
        scales = [_tile_scale(whole if token_scale else max(abs(v) for v in tile), floor,
                              power) for tile in tiles]
        codes = [0] * record.kv_lora_rank
        for t, (tile, scale) in enumerate(zip(tiles, scales, strict=True)):
            for i, v in enumerate(tile):
                q = v / scale if power and scale else _divided(v, scale)
                codes[t + i * record.num_tiles if strided else t * record.tile + i] = \
                    _nearest(q)
        scale_bytes = struct.pack(f"{order}{record.num_tiles}f", *scales)
        rope_bytes = b"".join(_bf16_bytes(r, half) for r in rotary)
        tail = rope_bytes + scale_bytes if scales_last else scale_bytes + rope_bytes
        records.append(list(bytes(codes)) + list(tail))
    return torch.tensor(records, dtype=torch.uint8).reshape(len(records), record.num_bytes)


_PACK_MISTAKES = [
    (dict(token_scale=True),
     "It matches one scale for the whole token: each tile of record.tile values has its own "
     "scale, from its own largest |value|."),
    (dict(strided=True),
     "It matches tiles taken every num_tiles-th value: tile t is the record.tile values in "
     "a row from t x record.tile."),
    (dict(power=False),
     "It matches scales of amax / 448 itself: tile_scale rounds it up to a power of two, so "
     "that dividing by it is exact."),
    (dict(floor=False),
     "It matches scales without tile_scale's floor: tile_scale floors the scale at 1e-4 "
     "(then a power of two, 2^-13), so a tile whose largest |value| is under 448 x 1e-4 is "
     "scaled by 2^-13, and a tile of zeros is stored as zero bytes, not NaN (0 / 0)."),
    (dict(scales_last=True),
     "It matches the scales after the rotary key: a record is the latent's bytes, then the "
     "scales, then the rotary key."),
    (dict(half=True),
     "It matches the rotary key stored as float16: it is bfloat16 (float32's 8 exponent "
     "bits), 2 bytes a value."),
]


def pack_case(latent: torch.Tensor, rope: torch.Tensor, record: LatentRecord) -> dict:
    """The records, and what the known mistakes give (None where they are the same)."""
    want = _records_with(latent, rope, record)
    numbers = torch.tensor(E4M3, dtype=torch.float64)

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        head = slice(0, record.scales_at)
        x, y = numbers[a[:, head].long()], numbers[b[:, head].long()]
        return bool(((x == y) | (x.isnan() & y.isnan())).all()) and torch.equal(
            a[:, record.scales_at:], b[:, record.scales_at:])

    known = []
    for keywords, text in _PACK_MISTAKES:
        value = _records_with(latent, rope, record, **keywords)
        known.append((None if same(value, want) else value, text))
    return {"want": want, "known": known}


@st.composite
def _pack_cases(draw):
    tile = draw(st.sampled_from([4, 8, 16, 32, 128]))
    record = LatentRecord(tile * draw(st.integers(1, 4)), draw(st.sampled_from([1, 2, 8, 64])),
                          tile)
    n = draw(st.integers(1, 4))
    sizes = draw(st.lists(st.lists(st.one_of(st.none(), st.integers(-8, 6)),
                                   min_size=record.num_tiles, max_size=record.num_tiles),
                          min_size=n, max_size=n))
    magnitudes = [[0.0 if e is None else 10.0**e for e in token] for token in sizes]
    seed = draw(st.integers(0, 2**16))
    case = pack_inputs(record, magnitudes, 10.0 ** draw(st.integers(-3, 3)), seed)
    if draw(st.booleans()):  # values spread over 6 orders of magnitude inside each tile
        gen = torch.Generator().manual_seed(seed + 1)
        case["latent"] *= 10.0 ** -(torch.rand(case["latent"].shape, generator=gen) * 6)
    sizes_text = "; ".join("[" + ", ".join("0" if e is None else f"1e{e}" for e in token) + "]"
                           for token in sizes)
    return case, f"its tiles about {sizes_text} in size, token by token"


@thorough
def check_pack_latent_fp8_thoroughly(fn: Callable) -> None:
    """The visible cases, then drawn records: tiles of 4 to 128 values, 1 to 4 of them,
    rotary keys of 1 to 64 values, 1 to 4 tokens, each tile 10^-8 to 10^6 in size or all
    zeros, values spread inside a tile down to e4m3's subnormals."""
    for case, text in PACK_CASES:
        run_pack(fn, case, text, pack_case(**case))
    for_all(_pack_cases(), lambda drawn: run_pack(fn, drawn[0], drawn[1],
                                                    pack_case(**drawn[0])), max_examples=60)


# --- e4m3_to_float ----------------------------------------------------------------------------


def _decoded_with(bias: int = 7, subnormal: bool = True, nan: bool = True, sign: bool = True,
                  shift: int = 20) -> list[float]:
    """Every byte read by a decoder with the given flaws: float32's bits assembled from the
    byte's fields, as a decoder written with integer operations would."""
    table = []
    for code in range(256):
        s, e, m = (code >> 7 if sign else 0), (code >> 3) & 0xF, code & 0x7
        if e == 0 and subnormal:
            value = (-1.0 if s else 1.0) * m * 2.0**-9
        else:
            bits = ((s << 31) | ((e + 127 - bias) << 23) | (m << shift)) & 0xFFFFFFFF
            value = struct.unpack("<f", struct.pack("<I", bits))[0]
        table.append(math.nan if nan and code & 0x7F == 0x7F else value)
    return table


_BYTE_MISTAKES = [
    (dict(bias=8),
     "It matches exponent bias 8 (every normal number halved): e4m3's bias is 7, so exponent "
     "bits e stand for 2^(e - 7)."),
    (dict(subnormal=False),
     "It matches exponent 0 read as a normal number: exponent 0 is subnormal, mantissa x "
     "2^-9, with no leading 1."),
    (dict(nan=False),
     "It matches 0x7F and 0xFF read as numbers (480 and -480): e4m3 has no infinity, and "
     "those two bytes are NaN."),
    (dict(sign=False),
     "It matches every byte read as positive: bit 7 is the sign, and 0x80 to 0xFF are "
     "negative."),
    (dict(shift=21),
     "It matches the mantissa bits placed one bit too high in float32's: a normal byte is "
     "(1 + mantissa / 8) x 2^(exponent - 7), its 3 mantissa bits float32's top 3 of 23."),
]


def byte_answers() -> dict:
    """Every byte's number, from the format's formula, and what each known mistake reads."""
    return {"want": list(E4M3),
            "mistakes": {text: _decoded_with(**keywords) for keywords, text in _BYTE_MISTAKES}}


def _fp8_case(lens: list[int], block_size: int, heads: int, record: LatentRecord, seed: int,
              dtype: torch.dtype = torch.float32) -> dict:
    """An FP8 cache of shuffled blocks holding the sequences' records (tiles of sizes 10^-3
    to 10^3, by the course's own packing), 0xFF in every unused slot, and one query per
    sequence: the arguments of ``mla_decode`` without the decoder."""
    from kernels.latent_record import pack_latent_fp8

    gen = torch.Generator().manual_seed(seed)
    used = [-(-n // block_size) for n in lens]
    num_blocks = sum(used) + 2
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.full((len(lens), max(used) + 1), -1, dtype=torch.int32)
    live = torch.zeros(num_blocks, block_size, dtype=torch.bool)
    for seq, (length, count) in enumerate(zip(lens, used, strict=True)):
        blocks, ids = ids[:count], ids[count:]
        tables[seq, :count] = torch.tensor(blocks, dtype=torch.int32)
        for token in range(length):
            live[blocks[token // block_size], token % block_size] = True
    slots = num_blocks * block_size
    sizes = 10.0 ** (torch.rand(slots, record.num_tiles, 1, generator=gen) * 6 - 3)
    latent = (torch.randn(slots, record.num_tiles, record.tile, generator=gen) * sizes)
    rope = torch.randn(slots, record.rope_dim, generator=gen)
    cache = pack_latent_fp8(latent.reshape(slots, -1), rope, record)
    cache = cache.reshape(num_blocks, block_size, record.num_bytes)
    cache[~live] = 0xFF
    query = torch.randn(len(lens), heads, record.kv_lora_rank + record.rope_dim, generator=gen)
    query = query / 10.0 ** (sum(lens) % 3)  # scores of several sizes
    device = kernel_device()
    return dict(query=query.to(dtype).to(device), cache=cache.to(device),
                seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
                block_tables=tables.to(device),
                scale=1 / math.sqrt(record.kv_lora_rank + record.rope_dim),
                kv_lora_rank=record.kv_lora_rank, record=record)


_KERNEL_CASES = [  # (lens, block size, heads, record): the interpreter's, a few ms a block
    ([5, 12], 4, 20, LatentRecord(32, 8, 16)),
    ([1, 9, 16], 16, 4, LatentRecord(64, 8, 32)),
    ([7], 2, 16, LatentRecord(32, 4, 8)),
]
_GPU_CASES = [  # DeepSeek-V3: rank 512 in tiles of 128, rope 64, 128 heads, blocks of 64
    ([1, 700, 4096, 2049], 64, 128, LatentRecord(512, 64)),
]


def _run_kernel(fn: Callable, spec: tuple, dtype: torch.dtype, tolerance: float) -> None:
    from kernels.mla_decode import mla_decode, mla_decode_reference

    lens, block_size, heads, record = spec
    args = _fp8_case(lens, block_size, heads, record, SEED + sum(lens), dtype)
    where = (f"the decode kernel (mla_decode) reading FP8 records with e4m3_to_float, on "
             f"sequences of {lens} tokens in blocks of {block_size}; heads {heads}, "
             f"LatentRecord(kv_lora_rank={record.kv_lora_rank}, "
             f"rope_dim={record.rope_dim}, tile={record.tile}), a {str(dtype)[6:]} query")
    want = mla_decode_reference(*args.values())
    with quiet():
        got = learner_call("e4m3_to_float", mla_decode, *args.values(), decode=fn)
    got, want = got.double().cpu(), want.double().cpu()
    size = max(1.0, want.abs().max().item())
    wrong = got.isnan() | ((got - want).abs() > tolerance * size)
    if not wrong.any():
        return
    seq, head, _ = (int(i) for i in wrong.nonzero()[0])
    raise AssertionError(
        f"{where}: sequence {seq}, head {head} is off by up to "
        f"{(got[seq, head] - want[seq, head]).abs().max().item():.3g} from PyTorch reading the "
        f"same bytes. The kernel turns a whole block of latent bytes [block, rank] into floats "
        f"with it, so it must work element by element on a block of any shape. {E4M3_IDEA}")


@thorough
def check_e4m3_to_float_thoroughly(fn: Callable) -> None:
    """The 256 bytes again, then the decode kernel over FP8 records (built by the course's
    packing) with ``fn`` as its decoder, against PyTorch reading the same bytes: tiles of 8
    to 32, 4 to 20 heads, blocks of 2 to 16; on a GPU, DeepSeek-V3's shapes too."""
    run_bytes(fn, byte_answers())
    for spec in _KERNEL_CASES:
        _run_kernel(fn, spec, torch.float32, 1e-4)
    if on_gpu():
        for spec in _GPU_CASES:
            _run_kernel(fn, spec, torch.bfloat16, 2e-2)
