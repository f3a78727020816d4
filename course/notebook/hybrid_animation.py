"""One request's block tables in a hybrid model, step by step: a table per group of layers, the
full-attention group's growing with the request, each sliding-window group's putting the null
block in place of the blocks its window has left behind; and the pool's free blocks. The frames
come from the KV cache it is given (chapter 9's coordinator: ``allocate_slots``, its managers'
tables, ``num_free``, ``free``), so a cache whose sliding group never frees a skipped block
shows no null block.

Core ipywidgets and HTML/CSS only. Stable hooks for browser tests: the view's root element has
the class ``kv-window-animation`` and ``data-step``, ``data-steps``, ``data-tokens`` (tokens
held once the step is done), ``data-free`` (blocks free in the pool), ``data-null-blocks``
(null slots in every group's table) and ``data-held`` (slots holding a block); each slot's box
has the class ``slot`` (and ``null`` for the null block), ``data-group``, ``data-logical``
(its index in the table) and ``data-block`` (its physical block, 0 for the null block).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

import ipywidgets as widgets

from course.language import tr
from course.notebook.player import frame_player
from course.v1.chunked_scheduler import ChunkedRequest
from course.v1.kv_coordinator import NULL_BLOCK, KVCacheCoordinator

_STYLE = """<style>
.kv-window-animation {font-family: monospace; font-size: 13px}
.kv-window-animation .group {display: flex; align-items: center; gap: 2px; margin: 6px 0}
.kv-window-animation .label {width: 170px}
.kv-window-animation .slot {width: 36px; height: 28px; border: 1px solid #999;
  border-radius: 3px; text-align: center; line-height: 28px; background: #8ecae6}
.kv-window-animation .slot.null {background: #f1f1f1; color: #aaa; border-style: dashed}
.kv-window-animation .event {margin: 6px 0; padding: 4px; background: #f7f7f7}
</style>"""


@dataclass(frozen=True)
class WindowFrame:
    """One step of a request: its tables once the step is done, and the pool's free blocks."""

    step: int
    num_computed: int  # tokens computed before the step
    num_new: int  # tokens the step computes (0: the request is finished and freed)
    tables: tuple[tuple[int, ...], ...]  # one block table per group, copied
    free: int  # blocks free in the pool after the step
    freed: int  # slots of the sliding-window groups that became null in the step
    allocated: bool  # what allocate_slots returned (False: the pool was too small)


def window_frames(kv: KVCacheCoordinator, prompt_len: int, output_len: int,
                  request_id: int = 0) -> list[WindowFrame]:
    """The frames of a request on ``kv``: its prompt in step 0, then one token a step for
    ``output_len`` steps, then a frame once ``kv.free(request)`` gave it all back. A step the
    pool is too small for is the last frame (``allocated`` False); the request then keeps in
    ``kv`` what it holds. Its tokens are distinct: it finds no prefix hit."""
    if prompt_len < 1 or output_len < 0:
        raise ValueError(f"a request has a prompt of at least one token and no negative "
                         f"output, got prompt_len={prompt_len}, output_len={output_len}")
    request = ChunkedRequest(request_id, list(range(prompt_len + output_len)), 0)
    empty = tuple(() for _ in kv.windows)
    frames: list[WindowFrame] = []
    previous = empty
    for num_new in [prompt_len] + [1] * output_len:
        allocated = kv.allocate_slots(request, num_new)
        # copies: the managers change their lists in place; a new request refused has none
        tables = tuple(tuple(m.tables[request_id]) if request_id in m.tables else ()
                       for m in kv.managers)
        frames.append(WindowFrame(len(frames), request.num_computed_tokens, num_new, tables,
                                  kv.num_free(), _freed(previous, tables, kv.windows),
                                  allocated))
        if not allocated:
            return frames
        previous = tables
        request.num_computed_tokens += num_new
    kv.free(request)
    frames.append(WindowFrame(len(frames), request.num_computed_tokens, 0, empty, kv.num_free(),
                              0, True))
    return frames


def _freed(before: tuple, after: tuple, windows: Sequence[int | None]) -> int:
    """Slots of the sliding-window groups that hold a block in ``before`` and null in
    ``after``."""
    return sum(old != NULL_BLOCK and new == NULL_BLOCK
               for old_table, new_table, window in zip(before, after, windows, strict=True)
               if window is not None
               # the table grows: only the slots it had before can have turned null
               for old, new in zip(old_table, new_table, strict=False))


def frame_html(frames: Sequence[WindowFrame], step: int, windows: Sequence[int | None],
               block_size: int) -> str:
    """The tables of ``frames[step]``: a row per group, a box per slot with its physical block
    (``null`` for the null block)."""
    frame = frames[step]
    rows = []
    for group, (table, window) in enumerate(zip(frame.tables, windows, strict=True)):
        label = tr("full attention") if window is None else tr(f"sliding window of {window}")
        boxes = "".join(
            f'<div class="slot{" null" if block == NULL_BLOCK else ""}" data-group="{group}" '
            f'data-logical="{logical}" data-block="{block}">'
            f'{tr("null") if block == NULL_BLOCK else block}</div>'
            for logical, block in enumerate(table))
        rows.append(f'<div class="group"><span class="label">{escape(label)}</span>{boxes}'
                    "</div>")
    nulls = sum(block == NULL_BLOCK for table in frame.tables for block in table)
    held = sum(len(table) for table in frame.tables) - nulls
    tokens = frame.num_computed + frame.num_new
    at = tr(f"step {step} / {len(frames) - 1}: {tokens} tokens, {frame.num_computed} of them "
            f"computed before the step; {frame.free} blocks free in the pool; {frame.freed} "
            f"freed this step")
    if not frame.allocated:
        at += "; " + tr("the pool is too small: no block taken")
    elif frame.num_new == 0:
        at += "; " + tr("the request is finished: every block is back in the pool")
    return (
        f'{_STYLE}<div class="kv-window-animation" data-step="{step}" '
        f'data-steps="{len(frames)}" data-tokens="{tokens}" data-free="{frame.free}" '
        f'data-null-blocks="{nulls}" data-held="{held}">'
        f'<div class="event">{escape(at)}</div>{"".join(rows)}<div>'
        + escape(tr(f"blocks of {block_size} tokens; grey: the null block, a slot whose "
                    "block the window no longer sees went back to the pool"))
        + "</div></div>")


def window_animation(frames: Sequence[WindowFrame], windows: Sequence[int | None],
                     block_size: int, interval_ms: int = 700) -> widgets.VBox:
    """Play / Step / slider controls over a request's frames (``window_frames``); a page that
    cannot play it shows the last frame whose tables hold null blocks (the window's work)."""
    cover = max((step for step, frame in enumerate(frames)
                 if any(NULL_BLOCK in table for table in frame.tables)), default=0)
    return frame_player(lambda step: frame_html(frames, step, windows, block_size),
                        len(frames), "kv-window-animation", interval_ms, cover=cover)
