"""Plotly charts for the notebooks."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import plotly.graph_objects as go

from course.experiments.models import GPU, ModelConfig
from course.language import tr, tr_later

GB = 10**9


def kv_memory_chart(
    models: Iterable[ModelConfig],
    gpus: Iterable[GPU],
    kv_bytes_per_sequence: Callable[..., float],
    context_lengths: Sequence[int] = tuple(2**k for k in range(10, 18)),
    bytes_per_element: float = 2,
) -> go.Figure:
    """KV cache of one sequence (GB) against its context length, one line per model, with each
    GPU's whole memory as a horizontal line. Log-log: the lines are straight and parallel, and
    their vertical gaps are the ratios between models' per-token footprints."""
    figure = go.Figure()
    for model in models:
        sizes = [kv_bytes_per_sequence(model, n, bytes_per_element) / GB for n in context_lengths]
        figure.add_trace(go.Scatter(
            x=list(context_lengths), y=sizes, mode="lines+markers",
            name=f"{model.name} ({model.attention})",
            hovertemplate=tr("%{x} tokens: %{y:.2f} GB") + "<extra>" + model.name + "</extra>",
        ))
    span = [min(context_lengths), max(context_lengths)]
    for gpu in gpus:
        # a trace, not add_hline: on a log axis add_hline places its label at 10**y
        figure.add_trace(go.Scatter(
            x=span, y=[gpu.memory_gb] * 2, mode="lines+text", text=[gpu.name, ""],
            textposition="top right", line=dict(dash="dot", color="grey", width=1),
            showlegend=False, hoverinfo="skip", textfont=dict(color="grey"),
        ))
    figure.update_layout(
        title="KV cache of one sequence vs context length "
              f"({8 * bytes_per_element:g}-bit KV; dotted: a whole GPU's memory)",
        xaxis_title="context length (tokens)", yaxis_title="KV cache (GB)",
        xaxis_type="log", yaxis_type="log", template="plotly_white", height=480,
    )
    return localized(figure)


_CATEGORY_STYLE = {  # category: (label, colour)
    "token_states": (tr_later("token states"), "#2a9d8f"),
    "reserved": (tr_later("reserved for future tokens"), "#e9c46a"),
    "internal": (tr_later("internal fragmentation"), "#f4a261"),
    "external": (tr_later("external fragmentation"), "#e76f51"),
    "free": (tr_later("free (usable)"), "#d9d9d9"),
}


def memory_breakdown_chart(shares: dict[str, dict[str, float]],
                           paper: dict[str, float], title: str) -> go.Figure:
    """Stacked bars in the shape of the vLLM paper's Fig. 2: each strategy's KV pool split by
    category (simulated), with the paper's token-state share beside each bar as a marker."""
    strategies = list(shares)
    figure = go.Figure()
    for category, (label, colour) in _CATEGORY_STYLE.items():
        values = [100 * shares[s][category] for s in strategies]
        figure.add_trace(go.Bar(
            x=strategies, y=values, name=label, marker_color=colour,
            text=[f"{v:.1f}%" if v >= 4 else "" for v in values], textposition="inside",
            insidetextanchor="middle",
            hovertemplate="%{x}: %{y:.1f}%<extra>" + tr(label) + "</extra>"))
    known = [s for s in strategies if s in paper]
    figure.add_trace(go.Scatter(
        x=known, y=[100 * paper[s] for s in known], mode="markers+text",
        name="paper's token-state share (Kwon et al., Fig. 2)",
        marker=dict(symbol="diamond", size=12, color="black"),
        text=[tr(f"paper {100 * paper[s]:.1f}%") for s in known], textposition="middle right",
        cliponaxis=False))
    figure.update_layout(barmode="stack", title=title, yaxis_title="share of the KV pool (%)",
                         yaxis_range=[0, 100], template="plotly_white", height=480,
                         margin=dict(r=40))
    return localized(figure)


def resident_requests_chart(series: dict[str, list[int]], title: str) -> go.Figure:
    """Requests resident in the pool at each step, one line per strategy."""
    figure = go.Figure()
    for name, counts in series.items():
        figure.add_trace(go.Scatter(y=counts, mode="lines", name=name))
    figure.update_layout(title=title, xaxis_title="step (one token per request)",
                         yaxis_title="requests resident", template="plotly_white", height=420)
    return localized(figure)


def block_size_sweep_chart(sweeps: dict[str, list]) -> go.Figure:
    """Token-state share and mean block-table length against block size, one line per mix."""
    from plotly.subplots import make_subplots

    figure = make_subplots(rows=1, cols=2, subplot_titles=(
        "token states / KV pool (under load)", "block-table entries per request"))
    palette = ["#264653", "#e76f51", "#2a9d8f", "#e9c46a"]
    for index, (name, points) in enumerate(sweeps.items()):
        colour = palette[index % len(palette)]
        sizes = [p.block_size for p in points]
        style = dict(mode="lines+markers", name=name, legendgroup=name, line_color=colour)
        figure.add_trace(go.Scatter(x=sizes, y=[100 * p.token_state_share for p in points],
                                    **style), 1, 1)
        figure.add_trace(go.Scatter(x=sizes, y=[p.mean_table_length for p in points],
                                    showlegend=False, **style), 1, 2)
    figure.update_xaxes(type="log", title_text="block size (tokens)", dtick=0.30103)
    figure.update_yaxes(title_text="%", row=1, col=1)
    figure.update_yaxes(type="log", title_text="entries", row=1, col=2)
    figure.update_layout(template="plotly_white", height=420)
    return localized(figure)


def batch_name(batch: int) -> str:
    """A series' name for a batch of ``batch`` sequences, in the learner's language."""
    return tr(f"batch {batch}")


def lines_chart(x: list, series: dict[str, list[float]], title: str, x_title: str,
                y_title: str, log_x: bool = False) -> go.Figure:
    """One line per series over a shared x axis."""
    figure = go.Figure()
    for name, values in series.items():
        figure.add_trace(go.Scatter(x=x, y=values, mode="lines+markers", name=name))
    figure.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title,
                         template="plotly_white", height=420)
    if log_x:
        figure.update_xaxes(type="log")
    return localized(figure)


def serving_timeline_chart(timeline, title: str) -> go.Figure:
    """Queue length, batch size, blocks used and preemptions against simulated time."""
    from plotly.subplots import make_subplots

    figure = make_subplots(rows=4, cols=1, shared_xaxes=True, vertical_spacing=0.04,
                           subplot_titles=("waiting requests", "running requests (batch)",
                                           "KV blocks in use", "preemptions per step"))
    for row, values in enumerate([timeline.waiting, timeline.running, timeline.used_blocks,
                                  timeline.preemptions], start=1):
        figure.add_trace(go.Scatter(x=timeline.time, y=values, mode="lines",
                                    showlegend=False), row, 1)
    figure.update_xaxes(title_text="simulated time (s)", row=4, col=1)
    figure.update_layout(title=title, template="plotly_white", height=720)
    return localized(figure)


def decode_intensity_chart(batches: list[int], weights_intensity: list[float],
                           attention_intensity: list[float], ridges: dict[str, float]
                           ) -> go.Figure:
    """FLOPs per byte read in a decode step against batch size: the weight matmuls (whose
    bytes the batch shares) and attention (whose KV bytes it does not), against GPUs' ridge
    points (peak FLOP/s over bandwidth: below it a kernel is memory-bound)."""
    figure = go.Figure()
    figure.add_trace(go.Scatter(x=batches, y=weights_intensity, mode="lines+markers",
                                name="weight matmuls"))
    figure.add_trace(go.Scatter(x=batches, y=attention_intensity, mode="lines+markers",
                                name="attention over the KV cache"))
    for name, ridge in ridges.items():
        figure.add_trace(go.Scatter(x=[batches[0], batches[-1]], y=[ridge, ridge],
                                    mode="lines+text", text=[name, ""],
                                    textposition="top right", showlegend=False,
                                    line=dict(dash="dot", color="grey", width=1)))
    figure.update_layout(title="Decode: FLOPs per byte read vs batch size",
                         xaxis_title="batch (sequences)", yaxis_title="FLOPs per byte",
                         xaxis_type="log", yaxis_type="log", template="plotly_white",
                         height=420)
    return localized(figure)


def decode_bandwidth_chart(rows: list[dict], ceilings: dict[str, float], title: str
                           ) -> go.Figure:
    """Bandwidth of a decode step per shape (GB/s, log x: bytes the step moves), one marker
    series per block size and length mix, with each bandwidth ceiling as a line. ``rows``
    carry ``bytes``, ``bandwidth``, ``batch``, ``context``, ``block_size`` and ``mix``."""
    figure = go.Figure()
    for block_size, mix in sorted({(r["block_size"], r["mix"]) for r in rows}):
        chosen = [r for r in rows if (r["block_size"], r["mix"]) == (block_size, mix)]
        figure.add_trace(go.Scatter(
            x=[r["bytes"] / GB for r in chosen], y=[r["bandwidth"] / GB for r in chosen],
            mode="markers", name=f"block {block_size}, {mix}",
            text=[tr(f"batch {r['batch']}, context {r['context']}") for r in chosen],
            hovertemplate="%{text}: %{y:.0f} GB/s<extra></extra>",
        ))
    span = [min(r["bytes"] for r in rows) / GB, max(r["bytes"] for r in rows) / GB]
    for name, bandwidth in ceilings.items():
        figure.add_trace(go.Scatter(
            x=span, y=[bandwidth / GB] * 2, mode="lines+text", text=[name, ""],
            textposition="top right", line=dict(dash="dot", color="grey", width=1),
            showlegend=False, hoverinfo="skip", textfont=dict(color="grey"),
        ))
    figure.update_layout(title=title, xaxis_title="bytes one decode step moves (GB)",
                         yaxis_title="GB/s", xaxis_type="log", template="plotly_white")
    return localized(figure)


def localized(figure: go.Figure) -> go.Figure:
    """``figure`` with its title, axis titles, subplot titles and trace names in the chosen
    language (``course.language``; the texts are collected from the keyword arguments that set
    them)."""
    layout = figure.layout
    if layout.title.text:
        layout.title.text = tr(layout.title.text)
    for axis in [*figure.select_xaxes(), *figure.select_yaxes()]:
        if axis.title.text:
            axis.title.text = tr(axis.title.text)
    for annotation in layout.annotations or ():
        annotation.text = tr(annotation.text)
    for trace in figure.data:
        if trace.name:
            trace.name = tr(trace.name)
    return figure
