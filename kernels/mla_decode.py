"""Chapter 13: decode attention over a paged multi-head latent attention (MLA) cache, in
Triton, from plain records or from FP8 records with scales.

An MLA layer caches one record per token, ``kv_lora_rank + rope_dim`` values (DeepSeek-V3:
512 + 64 = 576), and every query head reads the same record: one KV "head" shared by all of
them. The caller has absorbed each head's key up-projection into its query, so a query is
``[num_seqs, num_heads, kv_lora_rank + rope_dim]`` and a decode is chapter 7's with the
value being the record's latent part::

    score_t      = scale * q_h . record_t                    all rank + rope values
    out[s, h, :] = sum_t softmax(score)_t * record_t[:rank]  the latent only: [rank]

(vLLM's ``vllm/v1/attention/backends/mla/``, FlashMLA's "MQA mode"). One program per
(sequence, tile of ``HEAD_TILE`` query heads); each block's records are loaded once per
program and used by all the tile's heads, which is where MLA's saving in bytes read comes
from: the KV bytes of a sequence are read once per ``HEAD_TILE`` heads, not once per head::

    block_tables[seq]  [ 7 | 2 | . ]              seq_len = 21, block_size = 16
    program (seq, head tile):
        q         [HEAD_TILE, RANK_PAD] latent part, [HEAD_TILE, ROPE_PAD] rotary part
        for each block:
            records   [BLOCK_PAD, RANK_PAD] latent, [BLOCK_PAD, ROPE_PAD] rotary key
            scores  = q_latent @ latent^T + q_rope @ rope^T     [HEAD_TILE, BLOCK_PAD]
            acc     = acc * rescale + softmax weights @ latent  [HEAD_TILE, RANK_PAD]
        out = acc / l

Two cache formats, chosen by the compile-time flag ``FP8``:

* plain: ``cache [num_blocks, block_size, rank + rope]`` in float32, float16 or bfloat16;
* FP8 records (``kernels.latent_record.LatentRecord``, FlashMLA's layout):
  ``cache uint8 [num_blocks, block_size, record.num_bytes]``, each record the latent as e4m3
  bytes, one float32 scale per tile of ``record.tile`` values, then the rotary key in
  bfloat16. The kernel reads the three parts through three typed views of one storage
  (bytes, float32, bfloat16) and turns each byte into a float with ``DECODE``, a
  ``triton.jit`` function given as a compile-time constant (by default ``e4m3_to_float``;
  a check hands the kernel a learner's).

Heads, block size, rank and rope sizes are padded to powers of two of at least 16 (what
``tl.arange`` and NVIDIA's ``tl.dot`` need), with masks for the padding.

The answer is ``e4m3_to_float``'s body between ``### BEGIN SOLUTION`` and ``### END
SOLUTION``: chapter 13's notebook renders its cell from it, and a learner edition replaces it
with a stub.
Import after ``course.setup()``.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels.latent_record import LatentRecord, unpack_latent_fp8
from kernels.split_kv import run_on_grid, table_layout
from kernels.varlen_attention_ref import varlen_paged_attention

__all__ = ["decode_bytes", "e4m3_to_float", "mla_decode", "mla_decode_kernel",
           "mla_decode_reference",
           "validate_mla_inputs"]

DEFAULT_HEAD_TILE = 16
"""Query heads per program unless told: the fewest rows NVIDIA's ``tl.dot`` takes."""


@triton.jit
def e4m3_to_float(bits):
    """The float32 values of e4m3 bytes ``bits`` (uint8), exactly as PyTorch's
    ``torch.float8_e4m3fn`` gives them: sign bit 7, exponent bits 6..3 (bias 7), mantissa
    bits 2..0; exponent 0 is subnormal (mantissa x 2^-9); 0x7F and 0xFF are NaN (e4m3 has no
    infinity)."""
    ### BEGIN SOLUTION
    bits = bits.to(tl.int32)
    sign = bits >> 7
    exponent = (bits >> 3) & 0xF
    mantissa = bits & 0x7
    # a normal number is float32 with the exponent re-biased (7 -> 127) and the 3 mantissa
    # bits at the top of float32's 23
    normal = ((sign << 31) | ((exponent + 120) << 23) | (mantissa << 20)).to(
        tl.float32, bitcast=True)
    subnormal = mantissa.to(tl.float32) * 0.001953125  # 2^-9, exact
    subnormal = tl.where(sign == 1, -subnormal, subnormal)  # 0x80 is -0.0, as in PyTorch
    value = tl.where(exponent == 0, subnormal, normal)
    return tl.where((bits & 0x7F) == 0x7F, float("nan"), value)
    ### END SOLUTION


@triton.jit
def mla_decode_kernel(
    out_ptr, query_ptr, cache_ptr, scales_ptr, rope_ptr, block_tables_ptr, seq_lens_ptr, scale,
    stride_q_seq, stride_q_head,      # query [seqs, heads, rank + rope]
    stride_out_seq, stride_out_head,  # out [seqs, heads, rank]
    stride_kv_block, stride_kv_token,  # cache [blocks, block, record], in cache_ptr's elements
    stride_table_seq,                 # block_tables [seqs, max_blocks]
    NUM_HEADS: tl.constexpr, HEAD_TILE: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_PAD: tl.constexpr, RANK: tl.constexpr, RANK_PAD: tl.constexpr, ROPE: tl.constexpr,
    ROPE_PAD: tl.constexpr, FP8: tl.constexpr, TILE: tl.constexpr, SCALES_AT: tl.constexpr,
    ROPE_AT: tl.constexpr, DECODE: tl.constexpr,
):
    """Decode attention of one sequence's query heads [t x HEAD_TILE, (t + 1) x HEAD_TILE)
    (t the program's second index) over its seq_len records (a sequence of length 0 gets
    zeros); the output is the weighted sum of the records' latent parts, [RANK] per head.

    Plain (``FP8`` false): a record is RANK latent values then ROPE rotary values, in
    ``cache_ptr``'s dtype; ``scales_ptr``, ``rope_ptr``, TILE, SCALES_AT and ROPE_AT are not
    read. FP8: a record is bytes at ``cache_ptr`` starting at a multiple of 4: latent bytes
    0..RANK-1 (value i is ``DECODE(byte) x scale[i // TILE]``, TILE a power of two), the
    float32 scales from byte SCALES_AT (read through ``scales_ptr``, the same storage seen as
    float32), the bfloat16 rotary key from byte ROPE_AT (through ``rope_ptr``, the same
    storage seen as bfloat16)."""
    seq = tl.program_id(0)
    head_tile = tl.program_id(1)
    heads = head_tile * HEAD_TILE + tl.arange(0, HEAD_TILE)
    real = heads < NUM_HEADS
    dims = tl.arange(0, RANK_PAD)
    in_rank = dims < RANK
    rope_dims = tl.arange(0, ROPE_PAD)
    in_rope = rope_dims < ROPE
    slots = tl.arange(0, BLOCK_PAD)
    in_block = slots < BLOCK_SIZE

    # the tile's queries in two parts: the latent part meets the records' latents, the
    # rotary part their rotary keys (two dots, summed: no concatenation in the kernel)
    q_rows = seq.to(tl.int64) * stride_q_seq + heads[:, None] * stride_q_head
    q_latent = tl.load(query_ptr + q_rows + dims[None, :],
                       mask=real[:, None] & in_rank[None, :], other=0.0)
    q_rope = tl.load(query_ptr + q_rows + RANK + rope_dims[None, :],
                     mask=real[:, None] & in_rope[None, :], other=0.0)
    seq_len = tl.load(seq_lens_ptr + seq)

    m = tl.full([HEAD_TILE], float("-inf"), tl.float32)
    total = tl.zeros([HEAD_TILE], tl.float32)
    acc = tl.zeros([HEAD_TILE, RANK_PAD], tl.float32)
    for index in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):
        block = tl.load(block_tables_ptr + seq * stride_table_seq + index).to(tl.int64)
        valid = in_block & (index * BLOCK_SIZE + slots < seq_len)
        record = block * stride_kv_block + slots * stride_kv_token  # [BLOCK_PAD], int64
        latent_mask = valid[:, None] & in_rank[None, :]
        rope_mask = valid[:, None] & in_rope[None, :]
        # once per program, for all HEAD_TILE heads: the point of MLA's one shared KV head
        if FP8:
            bits = tl.load(cache_ptr + record[:, None] + dims[None, :], mask=latent_mask,
                           other=0)
            tiles = tl.arange(0, RANK_PAD // TILE)
            scale_offsets = (record[:, None] + SCALES_AT) // 4 + tiles[None, :]
            tile_scale = tl.load(scales_ptr + scale_offsets,  # [BLOCK_PAD, tiles]
                                 mask=valid[:, None] & (tiles < RANK // TILE)[None, :],
                                 other=0.0)
            # each tile times its scale: seen as [BLOCK_PAD, tiles, TILE], the scales
            # broadcast along the tile (loading a scale per value instead took 215 KB of
            # shared memory for sm_80 at DeepSeek-V3's shapes, not 150 KB: over an A100's)
            values = tl.reshape(DECODE(bits), [BLOCK_PAD, RANK_PAD // TILE, TILE])
            latent = tl.reshape(values * tile_scale[:, :, None], [BLOCK_PAD, RANK_PAD])
            rope = tl.load(rope_ptr + (record[:, None] + ROPE_AT) // 2 + rope_dims[None, :],
                           mask=rope_mask, other=0.0)
        else:
            latent = tl.load(cache_ptr + record[:, None] + dims[None, :], mask=latent_mask,
                             other=0.0)
            rope = tl.load(cache_ptr + record[:, None] + RANK + rope_dims[None, :],
                           mask=rope_mask, other=0.0)
        # tl.dot in the query's dtype: an FP8 record's latent is exact in bf16 (3 mantissa
        # bits times a power of two), and fp32 queries (the interpreter's, which has no
        # bf16 tl.dot) stay fp32, at IEEE precision rather than a GPU's default TF32
        latent = latent.to(q_latent.dtype)
        rope = rope.to(q_rope.dtype)

        scores = (tl.dot(q_latent, tl.trans(latent), input_precision="ieee")
                  + tl.dot(q_rope, tl.trans(rope), input_precision="ieee")) * scale
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        rescale = tl.exp(m - m_new)  # what the old max's exponentials are worth now
        weights = tl.exp(scores - m_new[:, None])
        total = total * rescale + tl.sum(weights, axis=1)
        acc = acc * rescale[:, None] + tl.dot(weights.to(latent.dtype), latent,
                                              input_precision="ieee")
        m = m_new

    # total >= 1 wherever a record was seen; a sequence of length 0 has acc = 0: zeros
    out = acc / tl.where(total > 0, total, 1.0)[:, None]
    out_offsets = seq.to(tl.int64) * stride_out_seq + heads[:, None] * stride_out_head
    tl.store(out_ptr + out_offsets + dims[None, :], out.to(out_ptr.dtype.element_ty),
             mask=real[:, None] & in_rank[None, :])


def _pad(size: int) -> int:
    return max(16, triton.next_power_of_2(size))


def validate_mla_inputs(query: torch.Tensor, cache: torch.Tensor, seq_lens: torch.Tensor,
                        block_tables: torch.Tensor, scale: float, kv_lora_rank: int,
                        record: LatentRecord | None = None,
                        head_tile: int = DEFAULT_HEAD_TILE) -> None:
    """Refuse what ``mla_decode_kernel`` cannot run correctly, with a message that names the
    argument, what it is and the rule: ``TypeError`` for an argument of the wrong kind (not a
    tensor, a record that is not a ``LatentRecord``), ``ValueError`` for everything else, in
    this order:

    1. shapes and the cache's format: query [num_seqs, num_heads, kv_lora_rank + rope_dim],
       num_heads >= 1, 1 <= kv_lora_rank <= the query's last size; where a record is given,
       kv_lora_rank its rank, the query's last size its rank + rope, its tile a power of
       two; cache [num_blocks, block_size, D], uint8 exactly where a record is given,
       block_size >= 1, D the query's last size (plain) or ``record.num_bytes`` (FP8);
       block_tables [num_seqs, max_blocks]; seq_lens [num_seqs]; ``head_tile`` a power of
       two >= 16.
    2. dtypes: query float32, float16 or bfloat16; a plain cache the query's dtype;
       block_tables int32; seq_lens int32 or int64.
    3. devices: all on one device; compiled (not on the interpreter), CUDA.
    4. layout: the cache's last dimension contiguous; an FP8 cache's records at multiples of
       4 bytes (its float32 scales are read in place).
    5. values: every length in [0, max_blocks x block_size]; the block ids a sequence uses
       in [0, num_blocks).
    """
    tensors = {"query": query, "cache": cache, "seq_lens": seq_lens,
               "block_tables": block_tables}
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if record is not None and not isinstance(record, LatentRecord):
        raise TypeError(f"record must be a LatentRecord or None, got {type(record).__name__}")
    if isinstance(scale, bool) or not isinstance(scale, int | float):
        raise TypeError(f"scale must be a real number, got {type(scale).__name__}")
    if isinstance(kv_lora_rank, bool) or not isinstance(kv_lora_rank, int):
        raise TypeError(f"kv_lora_rank must be an int, got {type(kv_lora_rank).__name__}")

    if query.dim() != 3:
        raise ValueError(f"query must be [num_seqs, num_heads, kv_lora_rank + rope_dim], got "
                         f"shape {tuple(query.shape)}")
    num_seqs, num_heads, width = query.shape
    if num_heads < 1:
        raise ValueError(f"num_heads must be at least 1, got {num_heads}")
    if not 1 <= kv_lora_rank <= width:
        raise ValueError(f"kv_lora_rank must be in [1, {width}] (the query's last size, rank "
                         f"+ rope), got {kv_lora_rank}")
    if record is not None:
        if kv_lora_rank != record.kv_lora_rank:
            raise ValueError(f"kv_lora_rank is {kv_lora_rank} but the record's is "
                             f"{record.kv_lora_rank}")
        if record.tile & (record.tile - 1):  # the kernel sees a record as [tiles, TILE]
            raise ValueError(f"the kernel reads FP8 records whose tile is a power of two, got "
                             f"record.tile = {record.tile}")
        if width != record.kv_lora_rank + record.rope_dim:
            raise ValueError(f"query's last size must be the record's rank + rope = "
                             f"{record.kv_lora_rank} + {record.rope_dim}, got {width}")
    if cache.dim() != 3:
        raise ValueError(f"cache must be [num_blocks, block_size, record], got shape "
                         f"{tuple(cache.shape)}")
    num_blocks, block_size, record_size = cache.shape
    # the format first: a record's size is only meaningful for the format it belongs to
    if record is not None and cache.dtype != torch.uint8:
        raise ValueError(f"with a record the cache holds FP8 records: uint8, got {cache.dtype}")
    if record is None and cache.dtype == torch.uint8:
        raise ValueError("a uint8 cache holds FP8 records: pass record=LatentRecord(...)")
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    wanted = width if record is None else record.num_bytes
    if record_size != wanted:
        what = ("the query's last size (rank + rope)" if record is None
                else "record.num_bytes (an FP8 record's bytes)")
        raise ValueError(f"the cache's last size must be {what} = {wanted}, got {record_size}")
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables must be [num_seqs={num_seqs}, max_blocks], got "
                         f"{tuple(block_tables.shape)}")
    if tuple(seq_lens.shape) != (num_seqs,):
        raise ValueError(f"seq_lens must be [num_seqs={num_seqs}], got {tuple(seq_lens.shape)}")
    if isinstance(head_tile, bool) or not isinstance(head_tile, int) or head_tile < 16 or \
            head_tile & (head_tile - 1):
        raise ValueError(f"head_tile must be a power of two >= 16 (tl.dot's rows), got "
                         f"{head_tile}")

    if query.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"query must be float32, float16 or bfloat16, got {query.dtype}")
    if record is None and cache.dtype != query.dtype:
        raise ValueError(f"a plain cache must have the query's dtype {query.dtype}, got "
                         f"{cache.dtype}")
    if block_tables.dtype != torch.int32:
        raise ValueError(f"block_tables must be int32, got {block_tables.dtype}")
    if seq_lens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"seq_lens must be int32 or int64, got {seq_lens.dtype}")

    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        where = ", ".join(f"{name} on {t.device}" for name, t in tensors.items())
        raise ValueError(f"query, cache, seq_lens and block_tables must be on one device, got "
                         f"{where}")
    if os.environ.get("TRITON_INTERPRET") != "1" and query.device.type != "cuda":
        raise ValueError(f"compiled Triton kernels need CUDA tensors, got {query.device}; "
                         "without a GPU, run course.setup() before importing kernels")

    if cache.stride(2) != 1:
        raise ValueError(f"the cache's last dimension must be contiguous (stride 1), got "
                         f"strides {cache.stride()}")
    if record is not None and (cache.stride(0) % 4 or cache.stride(1) % 4
                               or cache.storage_offset() % 4):
        raise ValueError(f"an FP8 cache's records must start at multiples of 4 bytes (its "
                         f"float32 scales are read in place), got strides {cache.stride()} "
                         f"and offset {cache.storage_offset()}")

    lengths = seq_lens.long()
    covered = block_tables.shape[1] * block_size
    outside = (lengths < 0) | (lengths > covered)
    if outside.any():
        seq = int(outside.nonzero()[0, 0])
        raise ValueError(f"seq_lens[{seq}] = {int(lengths[seq])} is outside [0, {covered}]: a "
                         f"row of block_tables holds {block_tables.shape[1]} blocks of "
                         f"{block_size} tokens")
    entries = torch.arange(block_tables.shape[1], device=lengths.device)
    used = entries[None, :] < ((lengths + block_size - 1) // block_size)[:, None]
    tables = block_tables.long()
    unknown = used & ((tables < 0) | (tables >= num_blocks))
    if unknown.any():
        seq, index = (int(i) for i in unknown.nonzero()[0])
        raise ValueError(f"block_tables[{seq}, {index}] = {int(tables[seq, index])} is not a "
                         f"block of the pool (0 to {num_blocks - 1}), and sequence {seq} (length "
                         f"{int(lengths[seq])}) uses it")


def mla_decode(query: torch.Tensor, cache: torch.Tensor, seq_lens: torch.Tensor,
               block_tables: torch.Tensor, scale: float, kv_lora_rank: int,
               record: LatentRecord | None = None, decode=e4m3_to_float, *,
               head_tile: int = DEFAULT_HEAD_TILE, kernel=None) -> torch.Tensor:
    """Absorbed MLA decode attention over a paged latent cache: ``[num_seqs, num_heads,
    kv_lora_rank]`` in the query's dtype (fp32 arithmetic inside), what
    ``mla_decode_reference`` computes; a sequence of length 0 gets zeros.

    ``cache`` is plain ``[num_blocks, block_size, kv_lora_rank + rope_dim]`` in the query's
    dtype with ``record=None``, or uint8 ``[num_blocks, block_size, record.num_bytes]`` laid
    out as ``record`` (a ``LatentRecord``) says; ``decode`` turns an e4m3 byte into a float
    inside the kernel. ``head_tile`` query heads share a program (a power of two >= 16; the
    records are read once per tile); ``kernel`` is the kernel launched (by default the
    course's). Inputs are checked by ``validate_mla_inputs``. On the interpreter (no bf16
    ``tl.dot``) a bfloat16 query, and a plain bfloat16 cache, are computed in float32 and
    the output returned in bfloat16."""
    validate_mla_inputs(query, cache, seq_lens, block_tables, scale, kv_lora_rank, record,
                        head_tile)
    kernel = kernel or mla_decode_kernel
    dtype = query.dtype
    if dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1":
        query = query.float()
        cache = cache if record is not None else cache.float()
    query = query.contiguous()
    block_tables, seq_lens = table_layout(block_tables, seq_lens)
    num_seqs, num_heads, width = query.shape
    _, block_size, _ = cache.shape
    rope_dim = width - kv_lora_rank
    out = torch.empty(num_seqs, num_heads, kv_lora_rank, dtype=query.dtype,
                      device=query.device)
    if num_seqs == 0:
        return out.to(dtype)
    if record is None:  # the scales and rope pointers are not read: any tensor will do
        scales, rope, tile, scales_at, rope_at = cache, cache, 1, 0, kv_lora_rank
    else:  # one storage, three views: element i of a view is at byte i x its size
        scales, rope = cache.view(torch.float32), cache.view(torch.bfloat16)
        tile, scales_at, rope_at = record.tile, record.scales_at, record.rope_at
    run_on_grid(
        kernel, (num_seqs, triton.cdiv(num_heads, head_tile)),
        out, query, cache, scales, rope, block_tables, seq_lens.to(torch.int32), scale,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        cache.stride(0), cache.stride(1), block_tables.stride(0),
        NUM_HEADS=num_heads, HEAD_TILE=head_tile, BLOCK_SIZE=block_size,
        BLOCK_PAD=_pad(block_size), RANK=kv_lora_rank, RANK_PAD=_pad(kv_lora_rank),
        ROPE=rope_dim, ROPE_PAD=_pad(rope_dim), FP8=record is not None, TILE=tile,
        SCALES_AT=scales_at, ROPE_AT=rope_at, DECODE=decode,
    )
    return out.to(dtype)


def mla_decode_reference(query: torch.Tensor, cache: torch.Tensor, seq_lens: torch.Tensor,
                         block_tables: torch.Tensor, scale: float, kv_lora_rank: int,
                         record: LatentRecord | None = None) -> torch.Tensor:
    """What ``mla_decode`` computes, in PyTorch: chapter 9's ``varlen_paged_attention`` with
    one query token per sequence and the records as one KV head, keys and values both (FP8
    records unpacked to float32 by ``unpack_latent_fp8`` first), the output's latent part
    kept: ``[num_seqs, num_heads, kv_lora_rank]`` in the query's dtype."""
    records = cache if record is None else unpack_latent_fp8(cache, record)
    num_blocks, block_size, width = records.shape
    pool = records.reshape(num_blocks, block_size, 1, width)  # one KV head
    starts = torch.arange(query.shape[0] + 1, device=query.device)  # a query per sequence
    out = varlen_paged_attention(query, pool, pool, starts, seq_lens, block_tables, scale)
    return out[..., :kv_lora_rank].contiguous()


@triton.jit
def decode_bytes_kernel(out_ptr, codes_ptr, count, BLOCK: tl.constexpr, DECODE: tl.constexpr):
    """``out[i] = DECODE(codes[i])`` for the ``count`` bytes, one program per BLOCK."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < count
    codes = tl.load(codes_ptr + offsets, mask=inside, other=0)
    tl.store(out_ptr + offsets, DECODE(codes), mask=inside)


def decode_bytes(codes: torch.Tensor, decode=e4m3_to_float) -> torch.Tensor:
    """The float32 values ``decode`` (a ``triton.jit`` function, as the decode kernel takes
    it) gives the uint8 bytes ``codes``, computed in a Triton kernel."""
    if codes.dtype != torch.uint8:
        raise ValueError(f"codes must be uint8 bytes, not {codes.dtype}")
    flat = codes.contiguous().reshape(-1)
    out = torch.empty(flat.shape, dtype=torch.float32, device=codes.device)
    if len(flat):
        run_on_grid(decode_bytes_kernel, (triton.cdiv(len(flat), 256),), out, flat, len(flat),
                    BLOCK=256, DECODE=decode)
    return out.reshape(codes.shape)
