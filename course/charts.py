"""Plotly charts for the notebooks."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import plotly.graph_objects as go

from course.models import GPU, ModelConfig

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
            hovertemplate="%{x} tokens: %{y:.2f} GB<extra>" + model.name + "</extra>",
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
    return figure
