"""Visible checks for chapter 13, compressed KV: each TODO's readable cases. Expected values,
and what known mistakes give, come from the chapter's hidden module (``autograder.private``),
asked with the inputs the checks build, never with anything the code under test produced;
the thorough checks are there too.

FP8 results are compared as the numbers their bytes stand for (0x00 and 0x80 are both zero,
0x7F and 0xFF both NaN); scales, records' scales and rotary keys bit for bit; the absorbed
decode against attention over every head's keys and values computed in full, in float64, at
fp32's tolerance; the e4m3 decoder byte by byte inside a Triton kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from autograder.checks._helpers import LearnerRaised, learner_call
from autograder.checks._tensors import expect_attention_output
from autograder.checks.ch07_audit import quiet
from autograder.private import private, visible
from autograder.seal import opened
from course.mla_model import MLAConfig, TinyMLAModel
from course.notebook.paged_cases import dtype_name, kernel_device
from course.v1.mla_engine import latent_attention
from kernels.latent_record import LatentRecord
from kernels.mla_decode import decode_bytes

SEED = 2037  # random cases are seeded: grading a notebook twice gives the same score

SCALE_IDEA = ("A scale is the largest absolute value (a negative value counts by its size) "
              "divided by range_constant: over the whole batch, a 0-d float32 tensor; "
              "per_head, over each KV head apart (its tokens and head_dim together, dimensions "
              "0 and 2), float32 [num_kv_heads]. A scale is never 0: where every value is 0, "
              "it is 1.0.")
QUANTIZE_IDEA = ("Head h's values x[..., h, :] are divided by scale[h] (a 0-d scale divides "
                 "every head), kept within [-448, 448], and rounded to the nearest e4m3 "
                 "number, a tie going to the one whose byte is even; the result is those "
                 "bytes, uint8, of x's shape.")
ABSORB_IDEA = ("For each head h: the absorbed query is q_nope[h] @ w_uk[h] ([nope] x [nope, "
               "rank] = [rank]) followed by q_pe[h], rank + rope values; attention(absorbed, "
               "latent_cache, seq_lens, block_tables, scale, rank) gives each head's weighted "
               "sum of latents [rank]; head h's output is that sum up-projected, times "
               "w_uv[h] transposed ([rank] x [rank, v_dim] = [v_dim]).")
PACK_IDEA = ("A record is the latent's bytes (tile t is the record.tile values in a row from "
             "t x record.tile, each divided by tile_scale of that tile's largest |value| and "
             "rounded to e4m3), then one float32 scale per tile, then the rotary key in "
             "bfloat16: uint8 [n, record.num_bytes].")
E4M3_IDEA = ("A byte is sign bit 7, exponent bits 6..3 and mantissa bits 2..0: exponent 1 to 15 "
             "stands for (-1)^sign x (1 + mantissa / 8) x 2^(exponent - 7), exponent 0 for "
             "(-1)^sign x mantissa x 2^-9 (a subnormal), and 0x7F and 0xFF are NaN.")
NOT_JIT = ("e4m3_to_float is called inside a Triton kernel (the decode kernel reads every "
           "latent byte through it), so it must be a Triton function: keep the @triton.jit the "
           "cell gives it.")


# --- showing tensors --------------------------------------------------------------------------


def _number(value: float) -> str:
    return f"{value:.6g}"


def shown(value: object) -> str:
    """A tensor (or what came back instead) as a hint shows it: its first 8 numbers (bytes
    in hex), its dtype and its shape."""
    if not isinstance(value, torch.Tensor):
        return repr(value) if len(repr(value)) <= 80 else \
            f"an object of type {type(value).__name__}"
    flat = value.detach().cpu().reshape(-1)
    if flat.dtype in (torch.uint8, torch.float8_e4m3fn):
        flat = flat.view(torch.uint8)
        items = [f"0x{int(v):02X}" for v in flat[:8]]
    else:
        items = [_number(float(v)) for v in flat[:8].double()]
    more = ", ..." if flat.numel() > 8 else ""
    text = items[0] if value.dim() == 0 else f"[{', '.join(items)}{more}]"
    return f"tensor({text}, {dtype_name(value.dtype)}, shape {tuple(value.shape)})"


def shown_list(values: list[float]) -> str:
    return "[" + ", ".join(_number(v) for v in values) + "]"


def _fails(call: str, got: object, want: torch.Tensor, said: str) -> AssertionError:
    return AssertionError(f"{call} returned {shown(got)}, expected {shown(want)}. {said}")


def _matching(got: torch.Tensor, known: list, same: Callable) -> list[str]:
    """What the known mistakes that give exactly ``got`` miss."""
    return [text for value, text in known if value is not None
            and tuple(value.shape) == tuple(got.shape) and bool(same(got, value))]


def _said(found: list[str], idea: str) -> str:
    if not found:
        return idea
    return ("Perhaps: " if len(found) > 1 else "") + " Or: ".join(found)


# --- kv_scale ---------------------------------------------------------------------------------


def scale_close(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Equal but for float32's last bits (amax / c, or amax x (1 / c))."""
    got, want = got.detach().double().cpu(), want.double()
    return ((got - want).abs() <= 1e-6 * want.abs()).all()


def run_scale(fn: Callable, case: dict, text: str, answers: dict) -> None:
    """``fn(**case)`` (x, range_constant, per_head) against ``answers``: the scale, and what
    the known mistakes give. ``text`` says what the batch holds."""
    per_head = case["per_head"]
    call = (f"kv_scale(x, range_constant={case['range_constant']:g}, per_head={per_head}) on "
            f"x of shape {tuple(case['x'].shape)} ({text})")
    got = learner_call("kv_scale", fn, **{**case, "x": case["x"].clone()})
    want = answers["want"]
    if not isinstance(got, torch.Tensor):
        if per_head:
            raise AssertionError(f"{call} returned {shown(got)}, a {type(got).__name__}; it "
                                 f"promises a float32 tensor of one scale per KV head: "
                                 f"{shown(want)}.")
        raise AssertionError(f"{call} returned {shown(got)}, a {type(got).__name__}; it "
                             f"promises a 0-d float32 tensor: {shown(want)}.")
    if tuple(got.shape) != tuple(want.shape):
        raise _fails(call, got, want, "per_head gives one scale per KV head, x's dimension 1: "
                     "the largest |value| over that head's tokens and head_dim, dimensions 0 "
                     "and 2." if per_head else "Without per_head the scale is one number, a "
                     "0-d tensor (shape ()).")
    if got.isnan().any() or not scale_close(got, want):
        raise _fails(call, got, want, _said(_matching(got, answers["known"], scale_close),
                                            SCALE_IDEA))
    if got.dtype != torch.float32:
        raise AssertionError(f"{call} returned {shown(got)}: the right numbers, but a scale is "
                             "float32, whatever x's dtype.")


def _batch(values: list, heads: int) -> torch.Tensor:
    """[tokens, heads, head_dim] from rows of head_dim values, head by head, token by
    token."""
    rows = torch.tensor(values, dtype=torch.float32)
    return rows.reshape(-1, heads, rows.shape[-1])


SCALE_CASES = [
    (dict(x=_batch([[1.5, -2.0, 0.25, 6.0], [0.5, 3.0, -1.0, 2.0],
                    [-4.0, 1.0, 0.75, 2.5], [1.0, -0.5, 4.5, 0.0],
                    [0.5, 0.25, -3.5, 1.0], [2.0, 1.0, 0.5, -5.5]], 2),
          range_constant=200.0, per_head=False),
     "3 tokens, 2 heads of 4 values; its largest |value| 6 (token 0, head 0)"),
    (dict(x=_batch([[1.5, -2.0, 0.25, 6.0], [0.5, 3.0, -1.0, 2.0],
                    [-4.0, 1.0, 0.75, 2.5], [1.0, -0.5, 4.5, 0.0],
                    [0.5, 0.25, -3.5, 1.0], [2.0, 1.0, 0.5, -5.5]], 2),
          range_constant=100.0, per_head=True),
     "the same batch; head 0's largest |value| 6, head 1's -5.5"),
    (dict(x=_batch([[0.5, -1.0, 2.0], [0.0, 0.0, 0.0], [3.0, 0.25, -0.5],
                    [0.0, 0.0, 0.0]], 2), range_constant=200.0, per_head=True),
     "2 tokens, 2 heads of 3 values; head 1 all zeros"),
    (dict(x=torch.zeros(2, 3, 2), range_constant=200.0, per_head=False),
     "2 tokens, 3 heads of 2 values, all zeros"),
    (dict(x=_batch([[0.5, -8.0, 1.0, 3.0], [2.0, -1.0, -0.25, 1.5]], 2), range_constant=448.0,
          per_head=False),
     "1 token, 2 heads of 4 values; its largest |value| is negative, -8 (head 0)"),
]


@visible
def check_kv_scale(fn: Callable) -> None:
    """A batch of 3 tokens and 2 heads per tensor (200) and per head (100); a head of zeros;
    a batch of zeros; a largest value that is negative (-8, with 448)."""
    answers = [private("13").scale_case(**case) for case, _ in SCALE_CASES]  # asked first
    for (case, text), answer in zip(SCALE_CASES, answers, strict=True):
        run_scale(fn, case, text, answer)


# --- quantize_fp8 -----------------------------------------------------------------------------


def e4m3_numbers(codes: torch.Tensor) -> torch.Tensor:
    """The float64 numbers e4m3 bytes stand for, read by PyTorch's own e4m3 type (as the
    notebook's table of bytes reads them)."""
    return codes.detach().cpu().contiguous().view(torch.float8_e4m3fn).double()


def same_numbers(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Element by element: bytes that stand for the same number (either zero, either NaN)."""
    a, b = e4m3_numbers(got), e4m3_numbers(want)
    return (a == b) | (a.isnan() & b.isnan())


def _byte(code: int) -> str:
    number = e4m3_numbers(torch.tensor([code], dtype=torch.uint8))[0].item()
    return f"0x{code:02X} ({_number(number)})"


def run_quantize(fn: Callable, case: dict, text: str, answers: dict) -> None:
    """``fn(**case)`` (x, scale) against ``answers``: the bytes (``want``; ``also``: what
    dividing in float64 gives, right too), and what the known mistakes give."""
    x, scale = case["x"], case["scale"]
    per_head = scale.dim() == 1
    scales = (f"a scale per head {shown_list(scale.tolist())}" if per_head
              else f"one scale {_number(scale.item())}")
    call = f"quantize_fp8(x, scale) on x of shape {tuple(x.shape)}, {scales} ({text})"
    try:
        got = learner_call("quantize_fp8", fn, x.clone(), scale.clone())
    except LearnerRaised as failure:
        raise AssertionError(f"{failure}, when called as {call}. {QUANTIZE_IDEA}") from None
    want, also = answers["want"], answers["also"]
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
        raise _fails(call, got, want, "The result has x's shape: one byte per value.")
    if got.dtype != torch.uint8:
        raise AssertionError(f"{call} returned {shown(got)}: the result is the e4m3 bytes, "
                             "uint8 (a float8 tensor seen through .view(torch.uint8)), which the "
                             "cache stores.")
    right = same_numbers(got, want) | same_numbers(got, also)
    if right.all():
        return
    index = tuple(int(i) for i in (~right).nonzero()[0])
    head = index[-2]
    divisor = scale[head].item() if per_head else scale.item()
    value = x[index].item()
    whose = f" (head {head}'s scale)" if per_head else ""
    where = (f"x{list(index)} = {_number(value)}, divided by {_number(divisor)}{whose}: "
             f"{_number(value / divisor)}")
    number = ~x.isnan()  # what a known mistake does with NaN is its own
    said = _said(_matching(got, answers["known"],
                           lambda a, b: same_numbers(a, b)[number].all()), QUANTIZE_IDEA)
    raise AssertionError(f"{call}: {int((~right).sum())} of {right.numel()} bytes are wrong; "
                         f"the first, {where}, gave {_byte(int(got[index]))}, expected "
                         f"{_byte(int(want[index]))}. {said}")


QUANTIZE_CASES = [
    (dict(x=torch.tensor([[[0.5, 0.53125, -0.59375, 3.0, 300.0, -1000.0, 0.0, 0.0017],
                           [1e-5, -0.75, 0.0009765625, 0.00146484375, 2.25, -2.375, 0.0625,
                            float("nan")]]]), scale=torch.tensor(0.5)),
     "1 token, 2 heads of 8 values: numbers e4m3 holds, two halfway between two (1.0625 and "
     "1.1875 once divided), values past 448 x 0.5, zero, a subnormal, NaN"),
    (dict(x=torch.tensor([[[0.3, -0.02, 0.75], [30.0, -250.0, 7.0]],
                          [[1.0, 0.001, -0.4], [900.0, 100.0, -2.0]]]),
          scale=torch.tensor([0.0625, 2.0])),
     "2 tokens, 2 heads of 3 values, head 1 about 100 times head 0"),
]


@visible
def check_quantize_fp8(fn: Callable) -> None:
    """One scale over 2 heads: values e4m3 holds, ties (to the even byte), past the range
    (saturated), zero, a subnormal, NaN; then a scale per head, the heads 100 times apart."""
    answers = [private("13").quantize_case(**case) for case, _ in QUANTIZE_CASES]
    for (case, text), answer in zip(QUANTIZE_CASES, answers, strict=True):
        run_quantize(fn, case, text, answer)


# --- absorbed_decode --------------------------------------------------------------------------


@dataclass(frozen=True)
class LatentCase:
    """Sequences of ``lens`` tokens whose records [latent ; rotary key] sit slot by slot in a
    pool of shuffled blocks (every unused slot NaN, table entries past a sequence's blocks
    -1), and one decode query per sequence. ``model``: the tiny MLA model's own weights and
    scale, its records and queries computed from tokens; else random ones. ``given``: the
    attention is passed to the function under test (watched), else left to its default."""

    lens: tuple[int, ...]
    block_size: int
    heads: int
    nope: int
    rope: int
    rank: int
    v_dim: int
    seed: int = SEED
    model: bool = False
    given: bool = True

    def spec(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        weights = ("the tiny MLA model's own weights, records and queries" if self.model
                   else "random weights and records")
        attention = ("the attention given" if self.given
                     else "its attention left to the default")
        return (f"sequences of {list(self.lens)} tokens in blocks of {self.block_size}; heads "
                f"{self.heads}, nope {self.nope}, rope {self.rope}, rank {self.rank}, v_dim "
                f"{self.v_dim} ({weights}; {attention})")

    def inputs(self) -> dict:
        """query, latent_cache, seq_lens, block_tables, w_uk, w_uv, scale."""
        gen = torch.Generator().manual_seed(self.seed)
        if self.model:
            config = MLAConfig(num_heads=self.heads, kv_lora_rank=self.rank,
                               qk_nope_head_dim=self.nope, qk_rope_head_dim=self.rope,
                               v_head_dim=self.v_dim)
            model = TinyMLAModel(config, seed=self.seed)
            w_uk, w_uv, scale = model.layers[0]["w_uk"], model.layers[0]["w_uv"], model.scale
            records, queries = [], []
            for length in self.lens:
                tokens = torch.randint(0, config.vocab_size, (length,), generator=gen)
                q, latent, k_pe = model.qkv(0, model.embed(tokens), torch.arange(length))
                records.append(torch.cat([latent, k_pe], dim=1))
                queries.append(q[-1])
            query = torch.stack(queries)
        else:
            w_uk = torch.randn(self.heads, self.nope, self.rank, generator=gen) / math.sqrt(
                self.rank)
            w_uv = torch.randn(self.heads, self.v_dim, self.rank, generator=gen) / math.sqrt(
                self.rank)
            scale = 1 / math.sqrt(self.nope + self.rope)
            records = [torch.randn(length, self.rank + self.rope, generator=gen)
                       for length in self.lens]
            query = torch.randn(len(self.lens), self.heads, self.nope + self.rope,
                                generator=gen)
        used = [-(-length // self.block_size) for length in self.lens]
        num_blocks = sum(used) + 2
        ids = torch.randperm(num_blocks, generator=gen).tolist()
        cache = torch.full((num_blocks, self.block_size, self.rank + self.rope), float("nan"))
        tables = torch.full((len(self.lens), max(used) + 1), -1, dtype=torch.int32)
        for seq, (count, rows) in enumerate(zip(used, records, strict=True)):
            blocks, ids = ids[:count], ids[count:]
            tables[seq, :count] = torch.tensor(blocks, dtype=torch.int32)
            for position, row in enumerate(rows):
                cache[blocks[position // self.block_size], position % self.block_size] = row
        return dict(query=query.contiguous(), latent_cache=cache,
                    seq_lens=torch.tensor(self.lens, dtype=torch.int32), block_tables=tables,
                    w_uk=w_uk.contiguous(), w_uv=w_uv.contiguous(), scale=scale)


class WatchedAttention:
    """The attention ``absorbed_decode`` is given: the course's ``latent_attention``, with
    the absorbed queries it was called with kept."""

    def __init__(self) -> None:
        self.queries: list = []

    def __call__(self, query, *args, **kwargs):
        self.queries.append(query.detach().clone() if isinstance(query, torch.Tensor)
                            else query)
        return latent_attention(query, *args, **kwargs)


def output_close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """fp32 arithmetic's error: 1e-4 of the output's magnitude (at least 1)."""
    got, want = got.detach().double().cpu(), want.double()
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    return not got.isnan().any() and bool(((got - want).abs() <= 1e-4 * scale).all())


def _absorbed_query(watched: WatchedAttention, want: torch.Tensor, rank: int) -> str:
    """What the absorbed query the attention was given says, against the right one."""
    got = watched.queries[-1]
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
        return (f"The query it handed attention is {shown(got)}, where the absorbed query is "
                f"[num_seqs, heads, rank + rope] = {list(want.shape)}. ")
    if not output_close(got[..., :rank], want[..., :rank]):
        return ("The absorbed query's first rank values, which meet each record's latent, are "
                "not q_nope[h] @ w_uk[h]. ")
    if not output_close(got[..., rank:], want[..., rank:]):
        return ("The absorbed query's last rope values, which meet each record's rotary key, "
                "are not q_pe[h], the query's last rope values. ")
    return ("The absorbed query it handed attention is right; what it did with attention's "
            "weighted sums of latents is not. ")


def run_absorbed(fn: Callable, case: LatentCase, answers: dict) -> None:
    """``fn`` on ``case`` against ``answers`` (the output computed from full keys and
    values, the absorbed query, what the known mistakes give)."""
    args = case.inputs()
    query = args["query"]
    call = "absorbed_decode(query, latent_cache, seq_lens, block_tables, w_uk, w_uv, scale" + (
        ", attention)" if case.given else ")")
    watched = opened(WatchedAttention()) if case.given else None
    try:
        out = learner_call("absorbed_decode", fn, *args.values(),
                           *([watched] if case.given else []))
    except LearnerRaised as failure:
        raise AssertionError(f"{failure}, when called on {case.describe()}. {ABSORB_IDEA}"
                             ) from None
    if watched is not None and not watched.queries:
        raise AssertionError(f"{call} on {case.describe()}: the attention it was given (its "
                             "`attention` argument) was never called. The engine passes its "
                             "own there (over FP8 records, one that reads their bytes), and "
                             "that is the one that must run.")
    want = answers["want"]
    expect_attention_output(out, call, case.describe(), query, tuple(want.shape),
                            " ([num_seqs, heads, v_dim])", ABSORB_IDEA)
    if out.isnan().any():
        raise AssertionError(f"{call} on {case.describe()} returned NaN: every slot no token "
                             "holds is NaN here, and only attention, given seq_lens and "
                             "block_tables, reads the cache's slots that hold tokens. "
                             + ABSORB_IDEA)
    for seq in range(len(case.lens)):
        if output_close(out[seq], want[seq]):
            continue
        error = (out[seq].double() - want[seq]).abs().max().item()
        found = [text for value, text in answers["known"]
                 if value is not None and output_close(out, value)]
        said = _said(found, "")
        if not found and watched is not None:
            said = _absorbed_query(watched, answers["absorbed"], case.rank)
        raise AssertionError(f"{call} on {case.describe()}: sequence {seq} (length "
                             f"{case.lens[seq]}) is off by up to {error:.3g} from attention "
                             f"over every head's keys and values computed in full. {said}"
                             + ("" if found else ABSORB_IDEA))


ABSORBED_CASES = [
    LatentCase((5,), 4, 3, 8, 4, 8, 6),
    LatentCase((1, 6, 9), 4, 4, 16, 8, 32, 16, model=True, given=False),
]


@visible
def check_absorbed_decode(fn: Callable) -> None:
    """One sequence of 5 tokens (blocks of 4, 3 heads, nope 8, rope 4, rank 8, v_dim 6, the
    attention given); then three of 1, 6 and 9 tokens with the tiny MLA model's weights, the
    attention left to its default."""
    answers = [private("13").absorbed_answers(**case.spec()) for case in ABSORBED_CASES]
    for case, answer in zip(ABSORBED_CASES, answers, strict=True):
        run_absorbed(fn, case, answer)


# --- pack_latent_fp8 --------------------------------------------------------------------------


def _parts(record: LatentRecord) -> list[tuple[str, slice]]:
    return [("the latent's e4m3 bytes", slice(0, record.scales_at)),
            ("the float32 scales", slice(record.scales_at, record.rope_at)),
            ("the bfloat16 rotary key", slice(record.rope_at, record.num_bytes))]


def same_records(got: torch.Tensor, want: torch.Tensor, record: LatentRecord) -> torch.Tensor:
    """Byte by byte: the latent's bytes as the numbers they stand for, the rest exactly."""
    latent = slice(0, record.scales_at)
    same = got.detach().cpu() == want
    same[:, latent] = same_numbers(got[:, latent], want[:, latent])
    return same


def _record_place(record: LatentRecord, byte: int) -> str:
    if byte < record.scales_at:
        return f"latent value {byte}, of tile {byte // record.tile}"
    if byte < record.rope_at:
        return f"tile {(byte - record.scales_at) // 4}'s scale"
    return f"rotary value {(byte - record.rope_at) // 2}"


def _record_value(record: LatentRecord, row: torch.Tensor, byte: int) -> str:
    """What the record ``row`` holds at ``byte``: the e4m3 byte and its number, or the
    float32 scale or bfloat16 value whose bytes include it."""
    if byte < record.scales_at:
        return _byte(int(row[byte]))
    size, dtype, start = ((4, torch.float32, record.scales_at) if byte < record.rope_at
                          else (2, torch.bfloat16, record.rope_at))
    first = start + (byte - start) // size * size
    number = row[first:first + size].contiguous().view(dtype).item()
    return f"{_number(number)} ({dtype_name(dtype)})"


def run_pack(fn: Callable, case: dict, text: str, answers: dict) -> None:
    """``fn(**case)`` (latent, rope, record) against ``answers``: the records, and what the
    known mistakes give."""
    record = case["record"]
    call = (f"pack_latent_fp8(latent, rope, record) on latent of shape "
            f"{tuple(case['latent'].shape)}, LatentRecord(kv_lora_rank={record.kv_lora_rank}, "
            f"rope_dim={record.rope_dim}, tile={record.tile}) of {record.num_bytes} bytes "
            f"({text})")
    try:
        got = learner_call("pack_latent_fp8", fn, case["latent"].clone(), case["rope"].clone(),
                           record)
    except LearnerRaised as failure:
        raise AssertionError(f"{failure}, when called as {call}. {PACK_IDEA}") from None
    want = answers["want"]
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
        raise _fails(call, got, want, f"A token's record is record.num_bytes = "
                     f"{record.kv_lora_rank} latent bytes + 4 x {record.num_tiles} scale bytes "
                     f"+ 2 x {record.rope_dim} rotary bytes. " + PACK_IDEA)
    if got.dtype != torch.uint8:
        raise AssertionError(f"{call} returned {shown(got)}: a record is bytes, uint8 (each part "
                             "seen through .view(torch.uint8)). " + PACK_IDEA)
    right = same_records(got, want, record)
    if right.all():
        return
    token, byte = (int(i) for i in (~right).nonzero()[0])
    part = next(name for name, where in _parts(record) if where.start <= byte < where.stop)
    wrong = [name for name, where in _parts(record) if not right[:, where].all()]
    found = _matching(got, answers["known"],
                      lambda a, b: same_records(a, b, record).all())
    raise AssertionError(f"{call}: token {token}'s record goes wrong at byte {byte} "
                         f"({_record_place(record, byte)}, in {part}): it holds "
                         f"{_record_value(record, got[token].cpu(), byte)}, expected "
                         f"{_record_value(record, want[token], byte)}; wrong: "
                         f"{', '.join(wrong)}. {_said(found, PACK_IDEA)}")


def pack_inputs(record: LatentRecord, magnitudes: list[list[float]], rope_size: float = 1.0,
                seed: int = SEED) -> dict:
    """Latents whose tile t of token i is unit normal times ``magnitudes[i][t]`` (0: a tile
    of zeros), and unit normal rotary keys times ``rope_size``."""
    gen = torch.Generator().manual_seed(seed)
    n = len(magnitudes)
    latent = torch.randn(n, record.num_tiles, record.tile, generator=gen)
    latent = (latent * torch.tensor(magnitudes, dtype=torch.float32)[..., None]).reshape(n, -1)
    rope = torch.randn(n, record.rope_dim, generator=gen) * rope_size
    return dict(latent=latent, rope=rope, record=record)


def _one_large_value(case: dict, where: int, value: float) -> dict:
    case["latent"][0, where] = value
    return case


PACK_CASES = [
    (_one_large_value(pack_inputs(LatentRecord(512, 64), [[0.001, 1.0, 30.0, 30.0]]), 384,
                      -20000.0),
     "DeepSeek-V3's record; its 4 tiles about 0.001, 1, 30 and 30 in size, the last one's "
     "first value -20000"),
    (pack_inputs(LatentRecord(32, 8, 16), [[1.0, 1.0], [0.5, 4.0], [3.0, 0.05]], 2.0),
     "the tiny model's record: 2 tiles of 16"),
    (pack_inputs(LatentRecord(32, 8, 16), [[2.0, 0.0], [0.0, 0.0]]),
     "token 0's tile 1 all zeros, token 1 all zeros"),
]


@visible
def check_pack_latent_fp8(fn: Callable) -> None:
    """One token of DeepSeek-V3's record (4 tiles of 128, their sizes far apart); three of
    the tiny model's (2 tiles of 16); tiles of zeros."""
    answers = [private("13").pack_case(**case) for case, _ in PACK_CASES]
    for (case, text), answer in zip(PACK_CASES, answers, strict=True):
        run_pack(fn, case, text, answer)


# --- e4m3_to_float ----------------------------------------------------------------------------


def _fields(code: int) -> str:
    return f"sign {code >> 7}, exponent {(code >> 3) & 0xF}, mantissa {code & 7}"


def same_floats(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Element by element: the same number (0.0 and -0.0 alike), or both NaN."""
    got, want = got.detach().double().cpu(), want.double()
    return (got == want) | (got.isnan() & want.isnan())


def run_bytes(fn: Callable, answers: dict) -> None:
    """``fn`` turning the bytes 0 to 255 into floats inside a kernel of one block, against
    ``answers`` (``want``; ``mistakes``: what each known mistake gives)."""
    if type(fn).__name__ not in ("JITFunction", "InterpretedFunction"):
        raise AssertionError(NOT_JIT)
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).to(kernel_device())
    with quiet():
        got = learner_call("e4m3_to_float", decode_bytes, codes, fn)
    want = torch.tensor(answers["want"], dtype=torch.float64)
    call = "e4m3_to_float(bits) in a kernel of one block, over the bytes 0 to 255,"
    if not isinstance(got, torch.Tensor) or got.numel() != 256:
        raise AssertionError(f"{call} gave {shown(got)}, expected 256 numbers. {E4M3_IDEA}")
    got = got.reshape(-1)
    right = same_floats(got, want)
    if right.all():
        return
    code = int((~right).nonzero()[0])
    found = [text for text, table in answers["mistakes"].items()
             if same_floats(got, torch.tensor(table, dtype=torch.float64)).all()]
    raise AssertionError(f"{call} gave {int((~right).sum())} of them wrong: the first, byte "
                         f"0x{code:02X} ({_fields(code)}), gave {_number(got[code].item())}, "
                         f"expected {_number(want[code].item())}. {_said(found, E4M3_IDEA)}")


@visible
def check_e4m3_to_float(fn: Callable) -> None:
    """The 256 bytes, each turned into a float by ``fn`` inside a Triton kernel of one block,
    against the format's own reading of each (NaN where e4m3 has NaN; 0x80 may be 0.0 or
    -0.0)."""
    run_bytes(fn, private("13").byte_answers())
