"""Chapter 13: chapter 9's engine serving a model with multi-head latent attention, whose
paged cache holds one latent record per token per layer.

    pool, per layer    [num_blocks, block_size, rank + rope]   float32, or FP8 records
                       (uint8 [num_blocks, block_size, record.num_bytes], ``LatentRecord``)
    a step, per layer  write each new token's record [latent ; rotary key] at its slot, then
                       decodes (one query token):  absorbed_decode over the records
                       prefill chunks:             the context's records up-projected to
                                                   every head's keys and values, attended
                                                   as chapter 9 attends

Why two paths (vLLM's ``MLACommonImpl`` splits a batch the same way): a decode reads a whole
context for one query token, so it is bound by the bytes it reads, and absorbing the
up-projections lets it read 576 values per token (DeepSeek-V3) where full keys and values
would be 128 heads x (192 + 128); a prefill chunk brings many query tokens per key, is
bound by arithmetic, and absorbed attention would do ``heads x (rank + rope)`` multiply-adds
per score instead of ``heads x (nope + rope)``, 3 times more for DeepSeek-V3.

The answer is ``absorbed_decode``'s body between ``### BEGIN SOLUTION`` and ``### END
SOLUTION``: chapter 13's notebook renders its cell from it, and a learner edition replaces it
with a stub.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from course.mla_model import TinyMLAModel
from course.tiny_model import causal_attention
from course.v0.paged_engine import KVPool
from course.v1.chunked_engine import ChunkedEngine, VarlenBatch
from kernels.latent_record import LatentRecord, pack_latent_fp8, unpack_latent_fp8
from kernels.varlen_attention_ref import varlen_paged_attention


def latent_attention(query: torch.Tensor, latent_cache: torch.Tensor, seq_lens: torch.Tensor,
                     block_tables: torch.Tensor, scale: float, kv_lora_rank: int
                     ) -> torch.Tensor:
    """Decode attention in latent space: ``query`` [num_seqs, heads, rank + rope] (one
    token per sequence) over each sequence's records in ``latent_cache`` [num_blocks,
    block_size, rank + rope], whose first ``kv_lora_rank`` values are also the values:
    [num_seqs, heads, rank]. Chapter 9's ``varlen_paged_attention`` with the records as one
    KV head serving every query head, keys and values alike (FlashMLA's "MQA mode")."""
    records = latent_cache[:, :, None, :]
    starts = torch.arange(len(seq_lens) + 1, dtype=torch.int32, device=query.device)
    out = varlen_paged_attention(query, records, records, starts, seq_lens, block_tables, scale)
    return out[..., :kv_lora_rank]


def absorbed_decode(query: torch.Tensor, latent_cache: torch.Tensor, seq_lens: torch.Tensor,
                    block_tables: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor,
                    scale: float, attention: Callable = latent_attention) -> torch.Tensor:
    """Decode attention of ``query`` [num_seqs, heads, nope + rope] (one token per sequence;
    the first ``nope`` values of a head meet the up-projected latent, the last ``rope`` the
    rotary key) over the paged latent cache, without computing a single key or value:

    * absorb: head h's latent query is ``q_nope[h] @ w_uk[h]`` ([nope] x [nope, rank]), then
      its rope part ``q_pe[h]`` after it: [num_seqs, heads, rank + rope];
    * ``attention(absorbed, latent_cache, seq_lens, block_tables, scale, rank)`` returns
      each head's weighted sum of latents, [num_seqs, heads, rank];
    * up-project: head h's output is that sum times ``w_uv[h]`` transposed ([rank] x
      [rank, v_dim]): [num_seqs, heads, v_dim].

    ``w_uk`` is [heads, nope, rank] and ``w_uv`` [heads, v_dim, rank]."""
    ### BEGIN SOLUTION
    nope, rank = w_uk.shape[1], w_uk.shape[2]
    q_nope, q_pe = query[..., :nope], query[..., nope:]
    absorbed = torch.cat([torch.einsum("nhd,hdr->nhr", q_nope, w_uk), q_pe], dim=-1)
    summed = attention(absorbed, latent_cache, seq_lens, block_tables, scale, rank)
    return torch.einsum("nhr,hvr->nhv", summed, w_uv)
    ### END SOLUTION


class MLAEngine(ChunkedEngine):
    """``ChunkedEngine`` serving a ``TinyMLAModel`` from a paged latent cache: float32
    records, or FP8 ones given a ``record`` (``LatentRecord``). ``decode`` is the absorbed
    decode (by default ``absorbed_decode``); ``decode_attention`` its attention in latent
    space (by default ``latent_attention``, over FP8 records the records dequantised first;
    ``kernels.mla_decode`` reads them in a Triton kernel)."""

    def __init__(self, model: TinyMLAModel, num_blocks: int, block_size: int,
                 max_num_batched_tokens: int, record: LatentRecord | None = None,
                 decode: Callable = absorbed_decode, decode_attention: Callable | None = None,
                 pack: Callable = pack_latent_fp8, **engine) -> None:
        c = model.config
        if record is not None and (record.kv_lora_rank, record.rope_dim) != (
                c.kv_lora_rank, c.qk_rope_head_dim):
            raise ValueError(f"a record of {record.kv_lora_rank} + {record.rope_dim} values "
                             f"does not hold this model's {c.kv_lora_rank} + "
                             f"{c.qk_rope_head_dim}")
        self.record, self.pack = record, pack
        self.decode = decode
        self.decode_attention = decode_attention or (
            _fp8_latent_attention(record) if record else latent_attention)
        super().__init__(model, num_blocks, block_size, max_num_batched_tokens, **engine)

    def empty_pool(self, num_blocks: int, block_size: int, places: int) -> KVPool:
        """One record tensor per layer in ``pool.k``; ``pool.v`` is empty (no values are
        kept). Unwritten records are NaN (float32) or 0xFF bytes (FP8: NaN latents)."""
        c, device = self.model.config, self.model.embedding.device
        if self.record is None:
            shape, fill, dtype = (num_blocks, block_size, c.record_dim), float("nan"), None
        else:
            shape, fill, dtype = (num_blocks, block_size, self.record.num_bytes), 0xFF, \
                torch.uint8
        return KVPool([torch.full(shape, fill, dtype=dtype, device=device)
                       for _ in range(places)], [])

    def records_of(self, cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
        """The float32 records of ``blocks`` [..., rank + rope]."""
        stored = cache[blocks]
        return stored if self.record is None else unpack_latent_fp8(stored, self.record)

    def attend(self, layer: int, q: torch.Tensor, latent: torch.Tensor, k_pe: torch.Tensor,
               batch: VarlenBatch) -> torch.Tensor:
        """Write the new tokens' records at their slots, then attend: each decode through
        ``self.decode`` over the latent cache, each prefill chunk over its context's keys
        and values computed from the records."""
        c, weights = self.model.config, self.model.layers[layer]
        cache = self.pool.k[self.place[layer][1]]
        rows = cache.view(-1, cache.shape[-1])
        rows[batch.slot_mapping] = (torch.cat([latent, k_pe], dim=1) if self.record is None
                                    else self.pack(latent, k_pe, self.record))
        out = torch.empty(len(q), c.num_heads, c.v_head_dim, device=q.device)
        starts, lens = batch.query_start_loc.long(), batch.seq_lens
        q_lens = starts[1:] - starts[:-1]
        decodes = (q_lens == 1).nonzero().flatten()
        if len(decodes):
            out[starts[decodes]] = self.decode(
                q[starts[decodes]], cache, lens[decodes], batch.block_tables[decodes],
                weights["w_uk"], weights["w_uv"], self.model.scale, self.decode_attention)
        for seq in (q_lens > 1).nonzero().flatten().tolist():
            start, end, length = int(starts[seq]), int(starts[seq + 1]), int(lens[seq])
            blocks = batch.block_tables[seq, :-(-length // cache.shape[1])].long()
            records = self.records_of(cache, blocks).reshape(-1, c.record_dim)[:length]
            keys, values = self.model.full_kv(layer, *records.split(
                [c.kv_lora_rank, c.qk_rope_head_dim], dim=1))
            out[start:end] = causal_attention(q[start:end], keys, values, self.model.scale,
                                              length - (end - start))
        return out


def _fp8_latent_attention(record: LatentRecord) -> Callable:
    """``latent_attention`` over FP8 records: the blocks the tables name dequantised to
    float32 records first (``kernels.mla_decode`` dequantises inside the kernel instead)."""

    def attend(query: torch.Tensor, cache: torch.Tensor, seq_lens: torch.Tensor,
               block_tables: torch.Tensor, scale: float, kv_lora_rank: int) -> torch.Tensor:
        used = block_tables.unique().long()
        records = torch.full((*cache.shape[:2], record.kv_lora_rank + record.rope_dim),
                             float("nan"), device=cache.device)
        records[used] = unpack_latent_fp8(cache[used], record)
        return latent_attention(query, records, seq_lens, block_tables, scale, kv_lora_rank)

    return attend
