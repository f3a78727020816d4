"""Chapter 13: chapter 9's engine with its KV cache in FP8 (vLLM's ``kv_cache_dtype="fp8"``).

The pool holds e4m3 bytes, half of bf16's and a quarter of float32's. Each layer has a key
scale and a value scale (one per tensor, or one per KV head), fixed for the engine's life:
given, or computed from the first batch the layer sees, as vLLM's ``calc_kv_scales`` does
(``course.v1.kv_quant``). A step then writes and reads::

    write   quantize_fp8(k, k_scale) -> bytes, through the slot mapping (chapter 6's write_kv)
    read    the blocks the step's tables name, dequantised, then chapter 9's attention

vLLM's kernels dequantise as they load each block; here the blocks a step reads are
dequantised into a float copy just before attention, which computes the same numbers. A slot
nothing wrote holds the byte 0x7F, e4m3's NaN, so a read of it poisons the output at once, as
chapter 8's NaN-filled pool does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from course.tiny_model import TinyModel
from course.v0.paged_engine import KVPool
from course.v1.chunked_engine import ChunkedEngine, VarlenBatch
from course.v1.kv_quant import (
    K_SCALE_CONSTANT,
    V_SCALE_CONSTANT,
    dequantize_fp8,
    kv_scale,
    quantize_fp8,
)
from kernels.paged_attention_ref import write_kv

E4M3_NAN = 0x7F


@dataclass
class KVScales:
    """Each layer's (k_scale, v_scale): 0-d per tensor, [num_kv_heads] per head, computed by
    ``scale`` (by default ``kv_scale``)."""

    per_head: bool = False
    layers: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    scale: Callable = kv_scale

    def calibrate(self, layer: int, k: torch.Tensor, v: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's scales, computed from ``k`` and ``v`` the first time it is asked."""
        if layer not in self.layers:
            self.layers[layer] = (self.scale(k, K_SCALE_CONSTANT, self.per_head),
                                  self.scale(v, V_SCALE_CONSTANT, self.per_head))
        return self.layers[layer]


class Fp8Engine(ChunkedEngine):
    """``ChunkedEngine`` whose pool stores K/V as e4m3 bytes. ``scales``: each layer's, given
    (another engine's, after a calibration run) or computed from the first batch each layer
    sees (per head with ``per_head``). ``quantize`` turns values into bytes (by default
    ``quantize_fp8``)."""

    def __init__(self, model: TinyModel, num_blocks: int, block_size: int,
                 max_num_batched_tokens: int, scales: KVScales | None = None,
                 per_head: bool = False, quantize: Callable = quantize_fp8,
                 **engine) -> None:
        self.scales = scales or KVScales(per_head)
        self.quantize = quantize
        super().__init__(model, num_blocks, block_size, max_num_batched_tokens, **engine)

    def empty_pool(self, num_blocks: int, block_size: int, places: int) -> KVPool:
        c, device = self.model.config, self.model.embedding.device
        shape = (num_blocks, block_size, c.num_kv_heads, c.head_dim)
        return KVPool(*([torch.full(shape, E4M3_NAN, dtype=torch.uint8, device=device)
                         for _ in range(places)] for _ in range(2)))

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               batch: VarlenBatch) -> torch.Tensor:
        """Quantise the new K/V with the layer's scales and write their bytes; attend over
        the blocks the step reads, dequantised."""
        group, place = self.place[layer]
        k_scale, v_scale = self.scales.calibrate(layer, k, v)
        k_bytes, v_bytes = self.pool.k[place], self.pool.v[place]
        write_kv(k_bytes, v_bytes, self.quantize(k, k_scale), self.quantize(v, v_scale),
                 batch.group_slots[group])
        used = batch.group_tables[group].unique().long()
        return self.read_attention(layer, q, _dequantized(k_bytes, used, k_scale),
                                   _dequantized(v_bytes, used, v_scale), batch)


def _dequantized(codes: torch.Tensor, blocks: torch.Tensor, scale: torch.Tensor
                 ) -> torch.Tensor:
    """A float32 pool of ``codes``' shape holding the ``blocks`` dequantised, NaN elsewhere."""
    values = torch.full(codes.shape, float("nan"), device=codes.device)
    values[blocks] = dequantize_fp8(codes[blocks], scale)
    return values
