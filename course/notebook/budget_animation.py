"""Chapter 9's animation: one step's token budget filled by decodes and prefill chunks, step
by step, from a ``ChunkedEngine``'s records.

Core ipywidgets and HTML/CSS only. Stable hooks for browser tests: the view's root element has
the class ``kv-budget-animation`` and ``data-step``, ``data-steps``, ``data-tokens`` (tokens
computed in the step), ``data-budget`` and ``data-preempted`` (requests preempted in the
step); each chunk's box has ``data-request``, ``data-start``, ``data-tokens`` and
``data-kind``.
"""

from __future__ import annotations

from html import escape

import ipywidgets as widgets

from course.language import tr
from course.notebook.player import frame_player

_KIND_COLOURS = {"decode": "#8ecae6", "prefill": "#ffb703", "recompute": "#f28482"}
_STYLE = """<style>
.kv-budget-animation {font-family: monospace; font-size: 13px}
.kv-budget-animation .budget {display: flex; gap: 2px; margin: 6px 0}
.kv-budget-animation .slot {height: 34px; border: 1px solid #999; border-radius: 3px;
  text-align: center; line-height: 1.2; font-size: 11px; overflow: hidden}
.kv-budget-animation .unused {background: #f1f1f1; color: #aaa}
.kv-budget-animation .event {margin: 6px 0; padding: 4px; background: #f7f7f7}
</style>"""


def frame_html(records: list, step: int, slot_px: int = 36) -> str:
    """The budget of ``records[step]``: one box per chunk, as wide as its tokens."""
    record = records[step]
    tokens = sum(n for _, _, n, _ in record.chunks)
    boxes = []
    for request, start, count, kind in record.chunks:
        boxes.append(
            f'<div class="slot chunk" style="width: {count * slot_px}px; background: '
            f'{_KIND_COLOURS[kind]}" data-request="{request}" data-start="{start}" '
            f'data-tokens="{count}" data-kind="{kind}">{tr(f"req {request}")}<br>{tr(kind)} '
            f"{start}..{start + count - 1}</div>")
    unused = max(0, record.budget - tokens)
    if unused:
        boxes.append(f'<div class="slot unused" style="width: {unused * slot_px}px">'
                     + tr(f"{unused} unused") + "</div>")
    preempted = ", ".join(map(str, record.preempted)) or tr("none")
    at = tr(f"step {step} / {len(records) - 1}: {tokens} of {record.budget} tokens; "
            f"preempted: {escape(preempted)}")
    return (
        f'{_STYLE}<div class="kv-budget-animation" data-step="{step}" '
        f'data-steps="{len(records)}" data-tokens="{tokens}" data-budget="{record.budget}" '
        f'data-preempted="{len(record.preempted)}">'
        f'<div class="event">{at}</div><div class="budget">{"".join(boxes)}</div><div>'
        + tr("blue: a decode (1 token); amber: a chunk of a prompt; red: a chunk recomputed "
             "after a preemption") + "</div></div>")


def budget_animation(records: list, interval_ms: int = 700) -> widgets.VBox:
    """Play / Step / slider controls over an engine's step records."""
    return frame_player(lambda step: frame_html(records, step), len(records),
                        "kv-budget-animation", interval_ms)
