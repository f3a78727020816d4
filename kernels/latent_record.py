"""Chapter 13: the FP8 record of a multi-head latent attention cache, as FlashMLA lays it
out: what ``course.v1.mla_engine`` writes and ``kernels.mla_decode`` reads.

Answers are the bodies between ``### BEGIN SOLUTION`` and ``### END SOLUTION``: chapter 13's
notebook renders its cells from them, and a learner edition replaces them with stubs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

E4M3_MAX = 448.0  # the largest finite e4m3 value: 1.75 x 2^8


@dataclass(frozen=True)
class LatentRecord:
    """One token's cache entry in an MLA layer, FP8 with scales, as FlashMLA lays it out
    (its README, "FP8 with scale"; DeepSeek-V3: ``kv_lora_rank`` 512, rope 64, tiles of 128,
    656 bytes)::

        bytes  0 .. rank-1              the latent in e4m3, tile t scaled by scales[t]
               rank .. +4 x tiles       one float32 scale per tile (a power of two)
               ..  end                  the rotary key in bfloat16, not quantised

    ``kv_lora_rank`` is a multiple of ``tile``; with both multiples of 4 every part starts
    where its dtype can be read."""

    kv_lora_rank: int
    rope_dim: int
    tile: int = 128

    def __post_init__(self) -> None:
        if self.kv_lora_rank % self.tile or self.kv_lora_rank % 4 or self.tile < 1:
            raise ValueError(f"kv_lora_rank {self.kv_lora_rank} must be a multiple of the tile "
                             f"({self.tile}) and of 4")

    @property
    def num_tiles(self) -> int:
        return self.kv_lora_rank // self.tile

    @property
    def scales_at(self) -> int:
        """The byte where the scales start."""
        return self.kv_lora_rank

    @property
    def rope_at(self) -> int:
        """The byte where the rotary key starts."""
        return self.kv_lora_rank + 4 * self.num_tiles

    @property
    def num_bytes(self) -> int:
        return self.rope_at + 2 * self.rope_dim


def tile_scale(amax: torch.Tensor) -> torch.Tensor:
    """A tile's scale from its largest absolute value: the power of two at or above
    ``amax / 448``, floored at 1e-4 (as FlashMLA's tests quantise, in their ``quant.py``), so
    that dividing by it is exact and the tile's largest value fits. Read from the float's own
    exponent (``frexp``): a ``log2`` rounded to float32 would give the power just below where
    the ratio is a few ulps above one."""
    ratio = torch.clamp_min(amax.float() / E4M3_MAX, 1e-4)
    mantissa, exponent = torch.frexp(ratio)  # ratio = mantissa x 2^exponent, 0.5 <= m < 1
    return torch.ldexp(torch.ones_like(ratio), exponent - (mantissa == 0.5).int())


def pack_latent_fp8(latent: torch.Tensor, rope: torch.Tensor,
                    record: LatentRecord) -> torch.Tensor:
    """Tokens' records (uint8 [n, record.num_bytes]) from their latents [n, kv_lora_rank]
    and rotary keys [n, rope_dim]: each tile of ``record.tile`` latent values scaled by its
    own ``tile_scale`` and stored as e4m3 bytes, then the scales as float32, then the rotary
    key as bfloat16 (its bytes in the machine's order, as ``Tensor.view`` gives them)."""
    ### BEGIN SOLUTION
    n = latent.shape[0]
    tiles = latent.float().reshape(n, record.num_tiles, record.tile)
    scales = tile_scale(tiles.abs().amax(dim=-1))  # [n, num_tiles]
    codes = (tiles / scales[..., None]).to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.cat([codes.reshape(n, -1),
                      scales.contiguous().view(torch.uint8),
                      rope.to(torch.bfloat16).contiguous().view(torch.uint8)], dim=1)
    ### END SOLUTION


def unpack_latent_fp8(records: torch.Tensor, record: LatentRecord) -> torch.Tensor:
    """The float32 [..., kv_lora_rank + rope_dim] that records [..., record.num_bytes] stand
    for: each latent tile's bytes times its scale, then the rotary key."""
    shape = records.shape[:-1]
    flat = records.reshape(-1, record.num_bytes)
    codes = flat[:, :record.scales_at].view(torch.float8_e4m3fn).float()
    scales = flat[:, record.scales_at:record.rope_at].contiguous().view(torch.float32)
    rope = flat[:, record.rope_at:].contiguous().view(torch.bfloat16).float()
    latent = codes.reshape(-1, record.num_tiles, record.tile) * scales[..., None]
    return torch.cat([latent.reshape(len(flat), -1), rope], dim=1).reshape(*shape, -1)
