"""Wrong chapter 13 solutions, as learners write them, with the hint each must get; and
``RULES``: each rule the notebook states about a TODO, with the mutants that break it alone."""

from __future__ import annotations

import math

import torch

from course.v1.mla_engine import latent_attention
from kernels.latent_record import E4M3_MAX, tile_scale
from mutants import Rule, kernel_mutant


def _named(name: str, fn):
    fn.__name__ = name
    return fn


# --- kv_scale ---------------------------------------------------------------------------------


def _scale(size=lambda x: x.abs(), divisor=None, dims=(0, 2), zero=1.0, whole_zero=False,
           as_float=False):
    def kv_scale(x, range_constant, per_head=False):
        values = size(x.float())
        amax = values.amax(dim=dims) if per_head else values.max()
        if whole_zero:  # zeros looked for in the whole batch only
            if x.abs().max() == 0:
                return torch.ones_like(amax)
            return amax / range_constant
        scale = torch.where(amax != 0, amax / (divisor or range_constant),
                            torch.full_like(amax, zero))
        return float(scale) if as_float and not per_head else scale

    return kv_scale


_max_without_abs = _named("_max_without_abs", _scale(size=lambda x: x))
_divides_by_448 = _named("_divides_by_448", _scale(divisor=E4M3_MAX))
_per_head_over_the_wrong_dims = _named("_per_head_over_the_wrong_dims", _scale(dims=(0, 1)))
_scale_0_for_zeros = _named("_scale_0_for_zeros", _scale(zero=0.0))
_zeros_looked_for_in_the_whole_batch = _named("_zeros_looked_for_in_the_whole_batch",
                                              _scale(whole_zero=True))
_a_python_float = _named("_a_python_float", _scale(as_float=True))


# --- quantize_fp8 -----------------------------------------------------------------------------

_MAGNITUDES = torch.arange(0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).double()


def _rounded(q: torch.Tensor, mode: str) -> torch.Tensor:
    """e4m3 bytes of ``q`` (within range) rounded toward zero, or to nearest with ties away
    from zero: a search of the table of magnitudes."""
    m = q.double().abs()
    below = (torch.searchsorted(_MAGNITUDES, m, right=True) - 1).clamp(max=0x7E)
    if mode == "away":
        above = (below + 1).clamp(max=0x7E)
        up = (_MAGNITUDES[above] - m) <= (m - _MAGNITUDES[below])
        below = torch.where(up, above, below)
    codes = below | torch.where(q < 0, 0x80, 0)
    return codes.to(torch.uint8)


def _quantize(multiply=False, last_dim=False, as_float8=False, rounding="even", largest=448.0):
    def quantize_fp8(x, scale):
        s = scale.float() if last_dim else scale.float().reshape(-1, 1)
        scaled = (x.float() * s if multiply else x.float() / s).clamp(-largest, largest)
        if rounding != "even":
            return _rounded(scaled, rounding)
        codes = scaled.to(torch.float8_e4m3fn)
        return codes if as_float8 else codes.view(torch.uint8)

    return quantize_fp8


_multiplies_by_the_scale = _named("_multiplies_by_the_scale", _quantize(multiply=True))
_scale_on_the_last_dim = _named("_scale_on_the_last_dim", _quantize(last_dim=True))
_float8_not_bytes = _named("_float8_not_bytes", _quantize(as_float8=True))
_rounds_toward_zero = _named("_rounds_toward_zero", _quantize(rounding="zero"))
_ties_away_from_zero = _named("_ties_away_from_zero", _quantize(rounding="away"))
_saturates_at_240 = _named("_saturates_at_240", _quantize(largest=240.0))


# --- absorbed_decode --------------------------------------------------------------------------


def _absorb(rope="after", uk="nhd,hdr->nhr", uv="nhr,hvr->nhv", up=True, rescale=False,
            own_attention=False):
    def absorbed_decode(query, latent_cache, seq_lens, block_tables, w_uk, w_uv, scale,
                        attention=latent_attention):
        nope, rank = w_uk.shape[1], w_uk.shape[2]
        q_nope, q_pe = query[..., :nope], query[..., nope:]
        q_latent = torch.einsum(uk, q_nope, w_uk)
        parts = {"after": [q_latent, q_pe], "first": [q_pe, q_latent],
                 "dropped": [q_latent, torch.zeros_like(q_pe)]}[rope]
        absorbed = torch.cat(parts, dim=-1)
        if rescale:
            scale = 1 / math.sqrt(absorbed.shape[-1])
        attend = latent_attention if own_attention else attention
        summed = attend(absorbed, latent_cache, seq_lens, block_tables, scale, rank)
        if not up:
            return summed[..., :w_uv.shape[1]]
        return torch.einsum(uv, summed, w_uv[0] if uv == "nhr,vr->nhv" else w_uv)

    return absorbed_decode


_rope_part_dropped = _named("_rope_part_dropped", _absorb(rope="dropped"))
_rope_part_first = _named("_rope_part_first", _absorb(rope="first"))
_w_uk_transposed = _named("_w_uk_transposed", _absorb(uk="nhd,hrd->nhr"))
_head_0_w_uv_for_every_head = _named("_head_0_w_uv_for_every_head",
                                     _absorb(uv="nhr,vr->nhv"))
_no_up_projection = _named("_no_up_projection", _absorb(up=False))
_scale_of_the_absorbed_query = _named("_scale_of_the_absorbed_query", _absorb(rescale=True))
_attention_argument_ignored = _named("_attention_argument_ignored",
                                     _absorb(own_attention=True))


# --- pack_latent_fp8 --------------------------------------------------------------------------


def _pack(whole_token=False, strided=False, power=True, floor=True, scales_last=False,
          rope_dtype=torch.bfloat16):
    def pack_latent_fp8(latent, rope, record):
        n = latent.shape[0]
        if strided:
            tiles = latent.float().reshape(n, record.tile, record.num_tiles).transpose(1, 2)
        else:
            tiles = latent.float().reshape(n, record.num_tiles, record.tile)
        amax = tiles.abs().amax(dim=-1)
        if whole_token:
            amax = amax.amax(dim=-1, keepdim=True).expand(n, record.num_tiles)
        if not power:
            scales = torch.clamp_min(amax / E4M3_MAX, 1e-4)
        elif not floor:
            scales = torch.exp2(torch.ceil(torch.log2(amax / E4M3_MAX)))
        else:
            scales = tile_scale(amax)
        codes = (tiles / scales[..., None]).to(torch.float8_e4m3fn).view(torch.uint8)
        if strided:
            codes = codes.transpose(1, 2)
        parts = [codes.reshape(n, -1), scales.contiguous().view(torch.uint8),
                 rope.to(rope_dtype).contiguous().view(torch.uint8)]
        if scales_last:
            parts = [parts[0], parts[2], parts[1]]
        return torch.cat(parts, dim=1)

    return pack_latent_fp8


_one_scale_per_token = _named("_one_scale_per_token", _pack(whole_token=True))
_tiles_strided = _named("_tiles_strided", _pack(strided=True))
_scale_not_a_power_of_two = _named("_scale_not_a_power_of_two", _pack(power=False))
_zero_tile_scaled_by_0 = _named("_zero_tile_scaled_by_0", _pack(floor=False))
_scales_after_the_rope = _named("_scales_after_the_rope", _pack(scales_last=True))
_rope_as_float16 = _named("_rope_as_float16", _pack(rope_dtype=torch.float16))


# --- e4m3_to_float ----------------------------------------------------------------------------


def _decoder(name: str, old: str, new: str):
    """The course's ``e4m3_to_float`` with one edit, renamed ``name``."""
    from kernels.mla_decode import e4m3_to_float

    return kernel_mutant(e4m3_to_float, name, old, new)


def _decoders() -> list:
    return [
        (_decoder("exponent_bias_8", "(exponent + 120) << 23", "(exponent + 119) << 23"),
         "e4m3's bias is 7"),
        (_decoder("subnormals_read_as_normals",
                  "value = tl.where(exponent == 0, subnormal, normal)", "value = normal"),
         "exponent 0 is subnormal"),
        (_decoder("no_nan", 'return tl.where((bits & 0x7F) == 0x7F, float("nan"), value)',
                  "return value"), "those two bytes are NaN"),
        (_decoder("sign_ignored", "sign = bits >> 7", "sign = (bits >> 7) * 0"),
         "bit 7 is the sign"),
        (_decoder("mantissa_one_bit_high", "(mantissa << 20)", "(mantissa << 21)"),
         "its 3 mantissa bits float32's top 3"),
    ]


MUTANTS = {
    "kv_scale": [
        (_max_without_abs, "not the largest absolute value"),
        (_divides_by_448, "divides by range_constant, as given"),
        (_per_head_over_the_wrong_dims, "dimensions 0 and 2"),
        (_scale_0_for_zeros, "A scale is never 0"),
        (_zeros_looked_for_in_the_whole_batch, "A scale is never 0"),
        (_a_python_float, "it promises a 0-d float32 tensor"),
    ],
    "quantize_fp8": [
        (_multiplies_by_the_scale, "a write stores x / scale"),
        (_scale_on_the_last_dim, "are divided by scale[h]"),
        (_float8_not_bytes, "the result is the e4m3 bytes, uint8"),
        (_rounds_toward_zero, "It matches rounding toward zero"),
        (_ties_away_from_zero, "goes to the one whose byte is even"),
        (_saturates_at_240, "values are kept within [-448, 448]"),
    ],
    "absorbed_decode": [
        (_rope_part_dropped, "scores without the rotary part"),
        (_rope_part_first, "in the order of a record"),
        (_w_uk_transposed, "[nope] x [nope, rank] = [rank]"),
        (_head_0_w_uv_for_every_head, "its own sum times w_uv[h] transposed"),
        (_no_up_projection, "that sum up-projected, times w_uv[h] transposed"),
        (_scale_of_the_absorbed_query, "passed to attention as given"),
        (_attention_argument_ignored, "was never called"),
    ],
    "pack_latent_fp8": [
        (_one_scale_per_token, "has its own scale"),
        (_tiles_strided, "in a row from t x record.tile"),
        (_scale_not_a_power_of_two, "rounds it up to a power of two"),
        (_zero_tile_scaled_by_0, "floors the scale at 1e-4"),
        (_scales_after_the_rope, "then the scales, then the rotary key"),
        (_rope_as_float16, "it is bfloat16"),
    ],
    "e4m3_to_float": _decoders(),
}

RULES = [
    Rule("its largest absolute value", "kv_scale", ("_max_without_abs",)),
    Rule("divided by ``range_constant``", "kv_scale", ("_divides_by_448",)),
    Rule("or, ``per_head``, over each KV head apart (float32, shape [num_kv_heads])",
         "kv_scale", ("_per_head_over_the_wrong_dims",)),
    Rule("A scale is never 0: where every value is 0 it is 1.0.", "kv_scale",
         ("_scale_0_for_zeros", "_zeros_looked_for_in_the_whole_batch")),
    Rule("over the whole tensor (a 0-d float32 tensor)", "kv_scale", ("_a_python_float",)),
    Rule("each value divided by its head's scale", "quantize_fp8",
         ("_multiplies_by_the_scale",)),
    Rule("(``scale`` 0-d, or [num_kv_heads])", "quantize_fp8", ("_scale_on_the_last_dim",)),
    Rule("as e4m3 bytes (uint8, same shape)", "quantize_fp8", ("_float8_not_bytes",)),
    Rule("rounded to the nearest e4m3 number", "quantize_fp8", ("_rounds_toward_zero",)),
    Rule("ties to even, as PyTorch's cast to ``torch.float8_e4m3fn`` does", "quantize_fp8",
         ("_ties_away_from_zero",)),
    Rule("saturated to [-448, 448]", "quantize_fp8", ("_saturates_at_240",)),
    Rule("then its rope part ``q_pe[h]`` after it: [num_seqs, heads, rank + rope]",
         "absorbed_decode", ("_rope_part_dropped", "_rope_part_first")),
    Rule("head h's latent query is ``q_nope[h] @ w_uk[h]`` ([nope] x [nope, rank])",
         "absorbed_decode", ("_w_uk_transposed",)),
    Rule("up-project: head h's output is that sum times ``w_uv[h]`` transposed ([rank] x "
         "[rank, v_dim]): [num_seqs, heads, v_dim]", "absorbed_decode",
         ("_head_0_w_uv_for_every_head", "_no_up_projection")),
    Rule("``attention(absorbed, latent_cache, seq_lens, block_tables, scale, rank)`` returns "
         "each head's weighted sum of latents", "absorbed_decode",
         ("_scale_of_the_absorbed_query", "_attention_argument_ignored")),
    Rule("each tile of ``record.tile`` latent values", "pack_latent_fp8",
         ("_one_scale_per_token", "_tiles_strided")),
    Rule("scaled by its own ``tile_scale``", "pack_latent_fp8", ("_zero_tile_scaled_by_0",)),
    Rule("the power of two at or above the tile's largest absolute value divided by 448 "
         "(`tile_scale`)", "pack_latent_fp8", ("_scale_not_a_power_of_two",)),
    Rule("then the scales as float32, then the rotary key", "pack_latent_fp8",
         ("_scales_after_the_rope",)),
    Rule("the rotary key as bfloat16", "pack_latent_fp8", ("_rope_as_float16",)),
    Rule("sign bit 7", "e4m3_to_float", ("sign_ignored",)),
    Rule("exponent bits 6..3 (bias 7)", "e4m3_to_float", ("exponent_bias_8",)),
    Rule("mantissa bits 2..0", "e4m3_to_float", ("mantissa_one_bit_high",)),
    Rule("exponent 0 is subnormal (mantissa x 2^-9)", "e4m3_to_float",
         ("subnormals_read_as_normals",)),
    Rule("0x7F and 0xFF are NaN (e4m3 has no infinity)", "e4m3_to_float", ("no_nan",)),
]
