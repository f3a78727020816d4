"""Chapter 13's Triton decode over a paged MLA cache (``kernels/mla_decode.py``): the e4m3
decoder equals PyTorch's on every byte; the kernel equals chapter 9's attention with the
records as one KV head (``mla_decode_reference``) for plain fp32 and bf16 caches and for FP8
records, at every head count, block size and ragged length tried, with slots past a
sequence's end holding NaN and table entries past its blocks holding -1 (neither may be
read); a decoder with a wrong exponent bias changes the output; bad inputs are refused with
a ValueError naming what is wrong; and on a GPU, DeepSeek-V3's shapes.

Small shapes: the interpreter takes about 3 ms per (program x block), and the file runs in
seconds there."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
import triton
import triton.language as tl

from course.notebook.paged_cases import kernel_device, on_gpu
from kernels.latent_record import LatentRecord, pack_latent_fp8
from kernels.mla_decode import decode_bytes, e4m3_to_float, mla_decode, mla_decode_reference

# --- the e4m3 decoder ------------------------------------------------------------------------


def _decoded(decode) -> torch.Tensor:
    """``decode`` applied to the bytes 0..255 inside a kernel: float32 [256], on the CPU."""
    return decode_bytes(torch.arange(256, dtype=torch.int32).to(torch.uint8).to(
        kernel_device()), decode).cpu()


def test_e4m3_to_float_equals_pytorch_on_all_256_bytes():
    got = _decoded(e4m3_to_float)
    want = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    assert torch.equal(got.isnan(), want.isnan())
    assert want.isnan().sum() == 2  # 0x7F and 0xFF
    number = ~want.isnan()
    # bit for bit: -0.0 (0x80) included, and every subnormal (exponent bits 0)
    assert torch.equal(got[number].view(torch.int32), want[number].view(torch.int32))


# --- cases -----------------------------------------------------------------------------------


@dataclass
class MLACase:
    """A paged MLA cache and a decode batch over it (tensors on the kernel's device)."""

    query: torch.Tensor         # [num_seqs, num_heads, rank + rope]
    cache: torch.Tensor         # plain [blocks, block_size, rank + rope], or FP8 records
    seq_lens: torch.Tensor      # int32 [num_seqs]
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks], -1 past a sequence's blocks
    scale: float
    kv_lora_rank: int
    record: LatentRecord | None = None

    def arguments(self) -> tuple:
        return (self.query, self.cache, self.seq_lens, self.block_tables, self.scale,
                self.kv_lora_rank, self.record)


def make_case(lens: list[int], block_size: int, num_heads: int, rank: int = 32,
              rope: int = 8, dtype: torch.dtype = torch.float32,
              record: LatentRecord | None = None, seed: int = 0) -> MLACase:
    """Sequences of ``lens`` tokens in a pool of shuffled blocks (three owned by no
    sequence); every slot past a sequence's end holds NaN (plain) or 0xFF bytes (FP8: NaN
    latent, scales and rotary key), which a kernel that read it would pass on."""
    generator = torch.Generator().manual_seed(seed)
    used = [-(-n // block_size) for n in lens]
    num_blocks = sum(used) + 3
    ids = torch.randperm(num_blocks, generator=generator).tolist()
    tables = torch.full((len(lens), max(used) + 1), -1, dtype=torch.int32)
    live = torch.zeros(num_blocks, block_size, dtype=torch.bool)
    for seq, (length, count) in enumerate(zip(lens, used, strict=True)):
        blocks, ids = ids[:count], ids[count:]
        tables[seq, :count] = torch.tensor(blocks, dtype=torch.int32)
        for token in range(length):
            live[blocks[token // block_size], token % block_size] = True

    records = torch.randn(num_blocks, block_size, rank + rope, generator=generator)
    if record is None:
        cache = records.to(dtype)
        cache[~live] = float("nan")
    else:
        flat = records.reshape(-1, rank + rope)
        cache = pack_latent_fp8(flat[:, :rank], flat[:, rank:], record)
        cache = cache.reshape(num_blocks, block_size, record.num_bytes)
        cache[~live] = 0xFF
    query = torch.randn(len(lens), num_heads, rank + rope, generator=generator).to(dtype)
    device = kernel_device()
    return MLACase(query.to(device), cache.to(device),
                   torch.tensor(lens, dtype=torch.int32, device=device), tables.to(device),
                   1 / math.sqrt(rank + rope), rank, record)


def _close(got: torch.Tensor, want: torch.Tensor, atol: float) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.float().cpu(), want.float().cpu(), atol=atol, rtol=atol)


# --- plain caches ----------------------------------------------------------------------------

# ragged: a single token, lengths ending mid-block and exactly at a block's end (16 and 32
# for every block size tried)
LENS = [1, 7, 16, 21, 32]


@pytest.mark.parametrize("block_size", [1, 4, 16], ids=lambda b: f"block{b}")
@pytest.mark.parametrize("num_heads", [1, 4, 20], ids=lambda h: f"{h}heads")
def test_a_plain_fp32_cache_equals_the_reference(num_heads, block_size):
    case = make_case(LENS, block_size, num_heads)
    got = mla_decode(*case.arguments())
    assert got.shape == (len(LENS), num_heads, case.kv_lora_rank)
    _close(got, mla_decode_reference(*case.arguments()), atol=1e-5)


def test_heads_in_two_tiles_equal_one_tile_of_32():
    case = make_case([5, 12], 4, 20)
    _close(mla_decode(*case.arguments()), mla_decode(*case.arguments(), head_tile=32),
           atol=1e-6)


def test_a_sequence_of_length_0_gets_zeros():
    case = make_case([0, 9, 0], 4, 4)
    got = mla_decode(*case.arguments())
    assert got[0].abs().max() == 0 and got[2].abs().max() == 0
    _close(got, mla_decode_reference(*case.arguments()), atol=1e-5)


@pytest.mark.parametrize("block_size", [4, 16], ids=lambda b: f"block{b}")
def test_a_bf16_cache_equals_the_reference(block_size):
    case = make_case(LENS, block_size, 20, dtype=torch.bfloat16)
    _close(mla_decode(*case.arguments()), mla_decode_reference(*case.arguments()),
           atol=1e-2)


# --- FP8 records -----------------------------------------------------------------------------

RECORDS = [LatentRecord(32, 8, 16), LatentRecord(64, 8, 32)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16],
                         ids=lambda d: f"{str(d)[6:]}_query")
@pytest.mark.parametrize("block_size", [4, 16], ids=lambda b: f"block{b}")
@pytest.mark.parametrize("record", RECORDS,
                         ids=lambda r: f"rank{r.kv_lora_rank}_tile{r.tile}_{r.num_bytes}B")
def test_fp8_records_equal_the_reference_reading_the_same_bytes(record, block_size, dtype):
    case = make_case(LENS, block_size, 20, rank=record.kv_lora_rank, dtype=dtype,
                     record=record)
    got = mla_decode(*case.arguments())
    want = mla_decode_reference(*case.arguments())
    _close(got, want, atol=1e-5 if dtype == torch.float32 else 1e-2)


@triton.jit
def _exponent_bias_8(bits):
    """A wrong decoder: e4m3 read with exponent bias 8 (every normal number halved)."""
    bits = bits.to(tl.int32)
    exponent = (bits >> 3) & 0xF
    normal = (((bits >> 7) << 31) | ((exponent + 119) << 23) | ((bits & 0x7) << 20)).to(
        tl.float32, bitcast=True)
    return tl.where(exponent == 0, (bits & 0x7).to(tl.float32) * 0.001953125, normal)


def test_a_wrong_decoder_is_caught_by_the_output():
    case = make_case([9, 20], 4, 4, record=RECORDS[0])
    want = mla_decode_reference(*case.arguments())
    _close(mla_decode(*case.arguments(), decode=e4m3_to_float), want, atol=1e-5)
    wrong = mla_decode(*case.arguments(), decode=_exponent_bias_8)
    assert not torch.allclose(wrong.cpu(), want.cpu(), atol=1e-3, rtol=1e-3)


# --- the launcher's refusals -----------------------------------------------------------------


def _bad(case: MLACase, **changes) -> tuple:
    arguments = dict(query=case.query, cache=case.cache, seq_lens=case.seq_lens,
                     block_tables=case.block_tables, scale=case.scale,
                     kv_lora_rank=case.kv_lora_rank, record=case.record)
    arguments.update(changes)
    return tuple(arguments.values())


BAD_INPUTS = {
    "query_2d": (False, lambda c: _bad(c, query=c.query[0]), "query must be"),
    "cache_4d": (False, lambda c: _bad(c, cache=c.cache[:, :, None]), "cache must be"),
    "cache_width": (False, lambda c: _bad(c, cache=c.cache[..., :-1]), "last size"),
    "record_bytes": (True, lambda c: _bad(c, cache=c.cache[..., :-4]), "num_bytes"),
    "rank_not_records": (True, lambda c: _bad(c, kv_lora_rank=16), "record's"),
    "uint8_without_record": (True, lambda c: _bad(c, record=None, cache=c.cache[..., :40]),
                             "pass record="),
    "record_with_floats": (False, lambda c: _bad(c, record=LatentRecord(32, 8, 16)),
                           "uint8"),
    "cache_dtype": (False, lambda c: _bad(c, cache=c.cache.half()), "query's dtype"),
    "query_dtype": (False, lambda c: _bad(c, query=c.query.long()), "query must be float32"),
    "rank_too_large": (False, lambda c: _bad(c, kv_lora_rank=41), "kv_lora_rank must be"),
    "table_int64": (False, lambda c: _bad(c, block_tables=c.block_tables.long()),
                    "block_tables must be int32"),
    "table_rows": (False, lambda c: _bad(c, block_tables=c.block_tables[:1]),
                   "block_tables must be"),
    "seq_lens_length": (False, lambda c: _bad(c, seq_lens=c.seq_lens[:1]), "seq_lens must be"),
    "devices": (False, lambda c: _bad(c, seq_lens=c.seq_lens.to("meta")), "one device"),
    "past_the_table": (False, lambda c: _bad(c, seq_lens=c.seq_lens + 8), "outside"),
    "block_not_in_pool": (False, lambda c: _bad(c, block_tables=c.block_tables + 100),
                          "not a block of the pool"),
}


@pytest.mark.parametrize("what", list(BAD_INPUTS))
def test_bad_inputs_are_refused_with_a_value_error(what):
    fp8, build, message = BAD_INPUTS[what]
    case = make_case([5, 3], 4, 4, record=LatentRecord(32, 8, 16) if fp8 else None)
    with pytest.raises(ValueError, match=message):
        mla_decode(*build(case))


def test_a_head_tile_under_16_rows_is_refused():
    case = make_case([5, 3], 4, 4)
    with pytest.raises(ValueError, match="head_tile"):
        mla_decode(*case.arguments(), head_tile=8)


# --- DeepSeek-V3 on a GPU --------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not on_gpu(), reason="needs a CUDA GPU (the interpreter runs the small "
                    "shapes above)")
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8_record"])
def test_deepseek_v3_shapes_on_the_gpu(fp8):
    record = LatentRecord(512, 64) if fp8 else None
    assert record is None or record.num_bytes == 656
    case = make_case([1, 700, 4096, 2049], 64, 128, rank=512, rope=64, dtype=torch.bfloat16,
                     record=record, seed=3)
    case.scale = 1 / math.sqrt(192)  # DeepSeek-V3's qk_nope_head_dim + qk_rope_head_dim
    got = mla_decode(*case.arguments())
    _close(got, mla_decode_reference(*case.arguments()), atol=2e-2)
