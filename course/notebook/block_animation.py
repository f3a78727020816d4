"""The chapter 3 animation: a recorded BlockManager trace, played in the notebook.

Core ipywidgets (Play, IntSlider, Buttons, HTML) and HTML/CSS only, no front-end extension.
Stable hooks for browser tests: the view's root element has the class ``kv-block-animation``
and ``data-step``, ``data-steps``, ``data-used-blocks`` and ``data-cow`` (1 on a
copy-on-write step) attributes; each block cell has ``data-block`` and ``data-refs``.
"""

from __future__ import annotations

from html import escape

import ipywidgets as widgets

from course.language import tr
from course.notebook import NotReady
from course.notebook.block_scenarios import Operation, record
from course.notebook.player import frame_player
from course.v0.frames import Frame

_COLOURS = ["#8ecae6", "#ffb703", "#90be6d", "#f28482", "#b392ac", "#f4a261", "#84a59d",
            "#cdb4db"]
_STYLE = """<style>
.kv-block-animation {font-family: monospace; font-size: 13px}
.kv-block-animation .pool {display: grid; grid-template-columns: repeat(8, 58px); gap: 4px}
.kv-block-animation .block {height: 40px; border: 1px solid #999; border-radius: 4px;
  text-align: center; line-height: 1.25; padding-top: 2px}
.kv-block-animation .free {background: #f1f1f1; color: #aaa}
.kv-block-animation .cow-src {outline: 3px dashed #d62828}
.kv-block-animation .cow-dst {outline: 3px solid #d62828}
.kv-block-animation .event {margin: 6px 0; padding: 4px; background: #f7f7f7}
.kv-block-animation .failed {background: #fde2e2}
.kv-block-animation .log {color: #777; white-space: pre}
</style>"""


def _colour(seq: int) -> str:
    return _COLOURS[seq % len(_COLOURS)]


def frame_html(frames: list[Frame], step: int) -> str:
    """The pool, the block tables and the event log at ``step``."""
    frame = frames[step]
    owners: dict[int, list[int]] = {}
    for seq, table in frame.tables.items():
        for block in table:
            owners.setdefault(block, []).append(seq)
    cells = []
    for block, refs in enumerate(frame.ref_counts):
        seqs = owners.get(block, [])
        classes = ["block"] + ([] if seqs else ["free"])
        if frame.copy and block == frame.copy[0]:
            classes.append("cow-src")
        if frame.copy and block == frame.copy[1]:
            classes.append("cow-dst")
        if len(seqs) == 1:
            fill = f"background: {_colour(seqs[0])}"
        elif seqs:  # shared: a stripe per holder
            width = 100 / len(seqs)
            stops = ", ".join(f"{_colour(s)} {i * width:.0f}% {(i + 1) * width:.0f}%"
                              for i, s in enumerate(seqs))
            fill = f"background: linear-gradient(90deg, {stops})"
        else:
            fill = ""
        label = f"<b>{block}</b><br>" + (tr(f"refs {refs}") if refs else tr("free"))
        cells.append(f'<div class="{" ".join(classes)}" style="{fill}" data-block="{block}" '
                     f'data-refs="{refs}">{label}</div>')
    tables = "".join(
        f'<div><span style="background: {_colour(seq)}">&nbsp;{tr(f"seq {seq}")}&nbsp;</span> '
        + tr(f"{frame.lengths[seq]} tokens, table {table}") + "</div>"
        for seq, table in frame.tables.items()) or f"<div>{tr('no sequences')}</div>"
    # events are kept in English (a notebook counts them) and shown in the chosen language
    earlier = "\n".join(escape(tr(f.event)) for f in frames[max(0, step - 5):step])
    event_class = "event failed" if frame.failed else "event"
    event = escape(tr(frame.event))
    at = tr(f"step {step} / {len(frames) - 1}: <b>{event}</b>")
    used = tr(f"used blocks: {frame.used_blocks} of {len(frame.ref_counts)}; red outline: "
              "copy-on-write source (dashed) and destination")
    return (
        f'{_STYLE}<div class="kv-block-animation" data-step="{step}" data-steps="{len(frames)}" '
        f'data-used-blocks="{frame.used_blocks}" data-cow="{int(frame.copy is not None)}">'
        f'<div class="{event_class}">{at}</div>'
        f'<div>{used}</div><div class="pool">{"".join(cells)}</div>'
        f'<p>{tr("block tables:")}</p>{tables}'
        f'<p>{tr("earlier:")}</p><div class="log">{earlier}</div></div>')


def allocation_animation(frames: list[Frame], interval_ms: int = 900) -> widgets.VBox:
    """Play / Step / slider controls over a recorded trace."""
    return frame_player(lambda step: frame_html(frames, step), len(frames),
                        "kv-block-animation", interval_ms)


def animate(manager_class: type, course_class: type, num_blocks: int, block_size: int,
            script: list[Operation]) -> widgets.VBox:
    """Record ``script`` on the learner's class and animate it, bugs included. While the
    learner's class still raises NotImplementedError, the course's own version is animated
    instead (with a printed note); where that is not in this edition either, the cell stops
    with one line saying what to finish (``NotReady``)."""
    try:
        frames = record(manager_class(num_blocks, block_size), num_blocks, script)
        print(tr("Animating your BlockManager."))
    except NotImplementedError:
        try:
            frames = record(course_class(num_blocks, block_size), num_blocks, script)
        except NotImplementedError:
            raise NotReady(tr("Finish your BlockManager (its TODOs above) to see this.")) \
                from None
        print(tr("Note: your BlockManager is not finished yet (a method raises "
                 "NotImplementedError), so this animates the course's own version."))
    return allocation_animation(frames)
