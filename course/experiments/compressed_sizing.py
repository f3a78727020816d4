"""What a compressed KV cache buys: FP8, and multi-head latent attention (MLA). ``python -m
course.experiments.compressed_sizing``.

Per token and layer, a cache holds (chapter 1's ``kv_sizing``, called here, never re-derived)::

    GQA   2 (K and V) x kv_heads x head_dim values         Llama-3.1-405B: 2 x 8 x 128 = 2048
    MLA   kv_lora_rank + qk_rope_head_dim values           DeepSeek-V3:    512 + 64    =  576

at 2 bytes a value in bf16 and 1 in FP8 (``"fp8"``: vLLM's ``kv_cache_dtype="fp8"``, one
``k_scale`` and one ``v_scale`` per layer, chapter 13's ``course.v1.kv_quant``: 8 bytes per layer
whatever the context, which this sizing leaves out). FlashMLA's FP8 record (``"fp8-record"``,
``kernels.latent_record.LatentRecord``) keeps the latent in e4m3 with a float32 scale per tile of
128 values and the rotary key in bf16: 512 + 4 x 4 + 2 x 64 = 656 bytes for DeepSeek-V3, so it
saves 1.76x on bf16's 1152, not 2x.

How many requests fit is a KV budget over one request's cache: here one GPU's whole memory
(80 GiB, an H100; 141 GiB, an H200) given to KV alone, GiB = 2**30 bytes. A model this size
spreads its weights over a node, so the budget stands for what one GPU's worth of memory holds
of the whole model's cache; it is not what one GPU of a tensor-parallel group holds (there a
GQA model's KV heads are split between the GPUs, while MLA's latent, which every head reads, is
copied on each one unless attention runs data-parallel).

What MLA buys besides memory: decode attention reads each token's KV once per step, and every
query head that shares it computes with it. GQA shares a KV head among ``heads / kv_heads``
query heads; MLA's latent is shared by all of them (the up-projections absorbed into the query
and the output, DeepSeek-V2's section 2.1.2), so decode attention does more arithmetic per byte
it reads (``decode_intensity``). A batch does not change that: each sequence reads its own KV.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from course.experiments import kv_sizing
from course.experiments.models import MODELS, ModelConfig
from course.language import tr_later
from kernels.latent_record import LatentRecord

if TYPE_CHECKING:
    import plotly.graph_objects as go

GIB = 2**30  # the budgets are in GiB; chapter 1's GPUS are in datasheet GB (10**9)
BUDGETS_GIB = (80, 141)  # one H100's memory, one H200's, given wholly to KV
CONTEXTS = (8192, 32768, 131072)  # 8k, 32k and 128k tokens per request
SIZING_MODELS = ("DeepSeek-V3", "Kimi-K2", "Qwen3-235B-A22B", "Llama-3.1-405B")

BF16, FP8, FP8_RECORD = "bf16", "fp8", "fp8-record"
FORMATS = (BF16, FP8, FP8_RECORD)
# bytes per value of the per-value formats; a per-tensor FP8 scale adds 8 bytes a layer
BYTES_PER_ELEMENT = {BF16: 2, FP8: 1}


def formats_for(model: ModelConfig) -> tuple[str, ...]:
    """The formats sized for ``model``: bf16 and fp8 for every model, and FlashMLA's record
    as well for an MLA model."""
    return FORMATS if model.attention == "MLA" else (BF16, FP8)


def _record(model: ModelConfig) -> LatentRecord:
    if model.kv_lora_rank is None:
        raise ValueError(f"{model.name} is {model.attention}: the fp8-record format is "
                         "FlashMLA's latent record, for an MLA model only")
    return LatentRecord(model.kv_lora_rank, model.qk_rope_head_dim)


def _bytes_per_element(kv_format: str) -> int:
    if kv_format not in BYTES_PER_ELEMENT:
        raise ValueError(f"unknown KV format {kv_format!r}: one of {', '.join(FORMATS)}")
    return BYTES_PER_ELEMENT[kv_format]


def _per_value_bytes(model: ModelConfig, bytes_per_element: float) -> float:
    """Bytes one token takes in one layer at ``bytes_per_element`` a value: chapter 1's
    answers with one layer (looked up in ``kv_sizing`` at each call, so that a learner's, or a
    test's, replacement is the one used)."""
    if model.kv_lora_rank is not None:
        return kv_sizing.mla_kv_bytes_per_token(1, model.kv_lora_rank, model.qk_rope_head_dim,
                                                bytes_per_element)
    return kv_sizing.kv_bytes_per_token(1, model.num_kv_heads, model.head_dim,
                                        bytes_per_element)


def bytes_per_token_per_layer(model: ModelConfig, kv_format: str) -> float:
    """Bytes one token's cache takes in one layer of ``model`` in ``kv_format``:

    * ``"bf16"``, ``"fp8"``: 2 or 1 bytes a value, by chapter 1's ``kv_bytes_per_token`` (GQA,
      MHA, MQA) or ``mla_kv_bytes_per_token`` (MLA) with ``num_layers=1``; fp8's per-tensor
      scales (8 bytes a layer, however many tokens) are left out;
    * ``"fp8-record"``: FlashMLA's record, ``LatentRecord(kv_lora_rank,
      qk_rope_head_dim).num_bytes`` (656 for DeepSeek-V3); an MLA model only.

    Raises ``ValueError`` for another format, or the record for a model without MLA."""
    if kv_format == FP8_RECORD:
        return _record(model).num_bytes
    return _per_value_bytes(model, _bytes_per_element(kv_format))


def request_bytes(model: ModelConfig, kv_format: str, context_tokens: int) -> float:
    """Bytes of cache one request of ``context_tokens`` tokens holds in ``model`` (every
    layer): chapter 1's ``kv_bytes_per_sequence`` at the format's bytes per value, or the
    record's size x layers x tokens."""
    if kv_format == FP8_RECORD:
        return _record(model).num_bytes * model.num_layers * context_tokens
    return kv_sizing.kv_bytes_per_sequence(model, context_tokens,
                                           _bytes_per_element(kv_format))


def requests_that_fit(model: ModelConfig, kv_format: str, context_tokens: int,
                      kv_budget_bytes: float) -> int:
    """How many whole requests of ``context_tokens`` tokens each ``kv_budget_bytes`` of KV
    holds at once in ``model`` and ``kv_format`` (an ``int``, 0 when not one fits). Whole
    requests, no blocks: a paged pool rounds each request up to its last block, which at these
    lengths changes nothing. A request of no tokens puts no bound on the count: ``ValueError``.
    """
    if context_tokens <= 0:
        raise ValueError(f"a request of {context_tokens} tokens holds no cache: no bound")
    return int(kv_budget_bytes // request_bytes(model, kv_format, context_tokens))


@dataclass(frozen=True)
class SizingRow:
    """One model in one format: its bytes per token and layer, and the requests that fit in
    each budget (GiB) at each context (tokens): ``requests[(budget_gib, context)]``."""

    model: str
    attention: str
    kv_format: str
    bytes_per_token_per_layer: float
    requests: dict[tuple[int, int], int]


def sizing_table(models: tuple[str, ...] = SIZING_MODELS,
                 budgets_gib: tuple[int, ...] = BUDGETS_GIB,
                 contexts: tuple[int, ...] = CONTEXTS) -> list[SizingRow]:
    """A row per model of ``models`` (names in ``MODELS``) and format of ``formats_for``, in
    that order: its bytes per token per layer, and ``requests_that_fit`` in each budget of
    ``budgets_gib`` (GiB, 2**30 bytes) at each context of ``contexts``."""
    rows = []
    for name in models:
        model = MODELS[name]
        for kv_format in formats_for(model):
            rows.append(SizingRow(
                model.name, model.attention, kv_format,
                bytes_per_token_per_layer(model, kv_format),
                {(gib, tokens): requests_that_fit(model, kv_format, tokens, gib * GIB)
                 for gib in budgets_gib for tokens in contexts}))
    return rows


# --- decode attention's arithmetic intensity ------------------------------------------------


def decode_flops_per_token_per_layer(model: ModelConfig) -> int:
    """FLOPs one decode step of one sequence spends on each token of its context in one layer
    of ``model``'s attention (a multiply-add is 2 FLOPs; softmax left out):

    * GQA / MHA / MQA: each query head takes a dot product with the token's key and adds its
      value times the weight, ``head_dim`` values each: 2 x 2 x heads x head_dim;
    * MLA, absorbed (DeepSeek-V2, section 2.1.2: ``W_UK`` folded into the query, ``W_UV`` into
      the output): each head's query of ``kv_lora_rank + qk_rope_head_dim`` values against the
      cached latent and rotary key, then the weight times the ``kv_lora_rank`` latent:
      2 x heads x (rank + rope) + 2 x heads x rank."""
    heads = model.num_attention_heads
    if model.kv_lora_rank is not None:
        return (2 * heads * (model.kv_lora_rank + model.qk_rope_head_dim)
                + 2 * heads * model.kv_lora_rank)
    return 2 * 2 * heads * model.head_dim


def decode_intensity(model: ModelConfig, bytes_per_element: float) -> float:
    """FLOPs per byte of KV read by decode attention in ``model``, its cache at
    ``bytes_per_element`` a value: ``decode_flops_per_token_per_layer`` over the bytes the
    token takes in the layer (chapter 1's answers, read once per step: a KV head's K and V by
    its group of query heads, MLA's latent by every head). The same at any batch and context:
    each sequence reads its own KV, and both grow by the token."""
    return decode_flops_per_token_per_layer(model) / _per_value_bytes(model, bytes_per_element)


def format_intensity(model: ModelConfig, kv_format: str) -> float:
    """``decode_intensity`` for a format of ``FORMATS``: the record's bytes for
    ``"fp8-record"``, whose arithmetic is the same."""
    return decode_flops_per_token_per_layer(model) / bytes_per_token_per_layer(model, kv_format)


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """The roofline's ridge, in FLOPs per byte: a kernel doing fewer FLOPs per byte it reads
    than ``peak_flops / bandwidth`` (FLOP/s over bytes/s) waits on memory, one doing more on
    arithmetic."""
    return peak_flops / bandwidth


@dataclass(frozen=True)
class Roofline:
    """A GPU's dense BF16 peak and HBM bandwidth, from its datasheet."""

    name: str
    peak_flops: float
    hbm_bytes_per_s: float
    source: str

    @property
    def ridge(self) -> float:
        return ridge_point(self.peak_flops, self.hbm_bytes_per_s)


# Dense BF16: the datasheets print 1,979 TFLOPS "with sparsity", twice the dense figure. The
# ridge is in BF16 FLOPs for FP8 caches too: an FP8 cache is converted to BF16 before the
# matmuls (FlashMLA's README, commit 066b5ba6: its FP8 decoding kernel "dequantizes the cache
# to bfloat16 and performs attention computation in bfloat16").
GPU_ROOFLINES: dict[str, Roofline] = {
    r.name: r
    for r in [
        Roofline("H100 SXM", 989e12, 3.35e12,
                 "NVIDIA H100 Tensor Core GPU datasheet: BF16 1,979 TFLOPS with sparsity, "
                 "HBM3 3.35 TB/s"),
        Roofline("H200", 989e12, 4.8e12,
                 "NVIDIA H200 Tensor Core GPU datasheet: BF16 1,979 TFLOPS with sparsity, "
                 "HBM3e 4.8 TB/s"),
    ]
}


def intensity_table(models: tuple[str, ...] = SIZING_MODELS
                    ) -> list[tuple[str, str, str, float]]:
    """(model, attention, format, FLOPs per byte) for each model and its formats."""
    return [(name, MODELS[name].attention, kv_format, format_intensity(MODELS[name], kv_format))
            for name in models for kv_format in formats_for(MODELS[name])]


# --- charts -----------------------------------------------------------------------------------

_MODEL_COLOURS = ("#264653", "#2a9d8f", "#e76f51", "#e9c46a", "#8d99ae", "#6d597a")
_FORMAT_PATTERNS = {BF16: "", FP8: "/", FP8_RECORD: "x"}


def _series_name(model: str, kv_format: str) -> str:
    return f"{model}, {kv_format}"


def _context_label(tokens: int) -> str:
    return f"{tokens // 1024}k"


def sizing_chart(rows: list[SizingRow]) -> go.Figure:
    """Requests that fit (log y) at each context, grouped bars: one bar series per model and
    format of ``rows`` (``sizing_table``), a panel per budget. Colour is the model, hatching
    the format. A panel holds one trace per row; a series' traces share a legend entry."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from course.notebook.charts import localized

    budgets = sorted({gib for row in rows for gib, _ in row.requests})
    contexts = sorted({tokens for row in rows for _, tokens in row.requests})
    figure = make_subplots(rows=1, cols=len(budgets), shared_yaxes=True, subplot_titles=[
        tr_later(f"{gib} GiB of KV") for gib in budgets])
    colours = {name: _MODEL_COLOURS[i % len(_MODEL_COLOURS)]
               for i, name in enumerate(dict.fromkeys(row.model for row in rows))}
    for column, gib in enumerate(budgets, start=1):
        for row in rows:
            counts = [row.requests[(gib, tokens)] for tokens in contexts]
            label = _series_name(row.model, row.kv_format)
            figure.add_trace(go.Bar(
                x=[_context_label(t) for t in contexts], y=counts, name=label,
                legendgroup=label, showlegend=column == 1, text=counts,
                textposition="outside", marker_color=colours[row.model],
                marker_pattern_shape=_FORMAT_PATTERNS[row.kv_format],
                hovertemplate="%{x}: %{y}<extra>" + label + "</extra>"), 1, column)
    figure.update_xaxes(title_text="context per request (tokens)")
    figure.update_yaxes(type="log", title_text="requests that fit", row=1, col=1)
    figure.update_layout(title="Requests that fit when one GPU's memory holds only KV",
                         barmode="group", template="plotly_white", height=480)
    return localized(figure)


def intensity_chart(models: tuple[str, ...] = SIZING_MODELS,
                    rooflines: tuple[Roofline, ...] = tuple(GPU_ROOFLINES.values())
                    ) -> go.Figure:
    """Decode attention's FLOPs per byte of KV read (``format_intensity``) per model, a bar
    series per format (none where a model lacks it), against each GPU's ridge point as a
    dotted line: below its line a GPU waits on memory."""
    import plotly.graph_objects as go

    from course.notebook.charts import localized

    figure = go.Figure()
    for kv_format in FORMATS:
        values = [format_intensity(MODELS[name], kv_format)
                  if kv_format in formats_for(MODELS[name]) else None for name in models]
        figure.add_trace(go.Bar(
            x=list(models), y=values, name=kv_format,
            marker_pattern_shape=_FORMAT_PATTERNS[kv_format],
            text=[f"{v:.0f}" if v is not None else "" for v in values], textposition="outside",
            hovertemplate="%{x}: %{y:.1f}<extra>" + kv_format + "</extra>"))
    for roofline in rooflines:
        figure.add_hline(y=roofline.ridge, line=dict(dash="dot", color="grey", width=1),
                         annotation_text=tr_later(f"{roofline.name} ridge point"),
                         annotation_position="top left")
    figure.update_layout(title="Decode attention: FLOPs per byte of KV read",
                         xaxis_title="model", yaxis_title="FLOPs per byte",
                         barmode="group", template="plotly_white", height=440)
    return localized(figure)


# --- the figures --------------------------------------------------------------------------------


def main() -> None:
    """Print ``sizing_table`` and the intensities against the GPUs' ridge points."""
    rows = sizing_table()
    print("requests that fit when one GPU's memory holds only KV (GiB = 2**30 bytes): "
          "`python -m course.experiments.compressed_sizing`")
    heading = "".join(f"{f'{gib} GiB @ {_context_label(t)}':>15}"
                      for gib in BUDGETS_GIB for t in CONTEXTS)
    print(f"{'model':<17}{'attn':<5}{'format':<11}{'B/token/layer':>14}{heading}")
    for row in rows:
        counts = "".join(f"{row.requests[(gib, t)]:>15,}" for gib in BUDGETS_GIB for t in CONTEXTS)
        print(f"{row.model:<17}{row.attention:<5}{row.kv_format:<11}"
              f"{row.bytes_per_token_per_layer:>14,.0f}{counts}")
    print()
    ridges = ", ".join(f"{r.name} {r.ridge:.0f} ({r.peak_flops / 1e12:.0f} TFLOP/s / "
                       f"{r.hbm_bytes_per_s / 1e12:g} TB/s)" for r in GPU_ROOFLINES.values())
    print(f"decode attention, FLOPs per byte of KV read (any batch); ridge points: {ridges}")
    print(f"{'model':<17}{'attn':<5}{'format':<11}{'FLOPs/token/layer':>18}{'FLOPs/byte':>12}"
          + "".join(f"{'x ' + r.name + ' ridge':>18}" for r in GPU_ROOFLINES.values()))
    for name, attention, kv_format, intensity in intensity_table():
        flops = decode_flops_per_token_per_layer(MODELS[name])
        print(f"{name:<17}{attention:<5}{kv_format:<11}{flops:>18,}{intensity:>12.1f}"
              + "".join(f"{intensity / r.ridge:>18.2f}" for r in GPU_ROOFLINES.values()))


if __name__ == "__main__":
    main()
