"""The chapter 4 picture: the prefix tree of cached blocks, growing as requests come and go.

Each node is a cached block; its parent is the block before it in the sequences that hold
it. A node shows its reference count, or, when no request holds it, its place in the LRU
eviction order. Core ipywidgets via ``course.notebook.player``; the view's root has the class
``kv-prefix-tree`` and ``data-step``, ``data-cached`` and ``data-evictable`` attributes.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

import ipywidgets as widgets

from course.experiments.prefix_sim import PrefixRequest
from course.language import tr, tr_later
from course.notebook.player import frame_player


@dataclass(frozen=True)
class TreeFrame:
    event: str
    parents: dict[int, int | None]  # cached block -> parent block (None: a first block)
    refs: dict[int, int]
    evictable: list[int]  # LRU first


def record_tree(manager: object, requests: list[PrefixRequest], script: list[tuple]
                ) -> list[TreeFrame]:
    """Play ``script`` (``("arrive", i)``: allocate request i's prompt and generate its output;
    ``("leave", i)``: free it) and record the cached-block tree after each step."""
    parents: dict[int, int | None] = {}
    live: set[int] = set()
    frames = []

    def snapshot(event: str) -> TreeFrame:
        for seq in live:
            table = manager.block_table(seq)
            for i, block in enumerate(table):
                if manager.is_cached(block):
                    parents[block] = table[i - 1] if i else None
        for block in [b for b in parents if not manager.is_cached(b)]:
            del parents[block]  # evicted
        return TreeFrame(event, dict(parents),
                         {b: manager.ref_count(b) for b in parents},
                         list(manager.evictable_blocks()))

    frames.append(snapshot(tr_later("an empty cache")))
    for kind, index in script:
        request = requests[index]
        if kind == "arrive":
            hits = manager.allocate(index, request.prompt)
            live.add(index)
            for token in request.output:
                manager.append_slot(index, token)
            frames.append(snapshot(tr_later(f"request {index} arrives: {len(request.prompt)} "
                                            f"prompt tokens, {hits} of them cache hits; "
                                            f"generates {len(request.output)}")))
        else:
            manager.free(index)
            live.discard(index)
            frames.append(snapshot(tr_later(f"request {index} leaves: its cached blocks become "
                                            "evictable, tail first")))
    return frames


def tree_html(frames: list[TreeFrame], step: int) -> str:
    frame = frames[step]
    children: dict[int | None, list[int]] = {}
    for block, parent in frame.parents.items():
        children.setdefault(parent if parent in frame.parents else None, []).append(block)
    rank = {b: i + 1 for i, b in enumerate(frame.evictable)}

    def node(block: int) -> str:
        refs = frame.refs[block]
        label = tr(f"block {block} · refs {refs}") if refs else \
            tr(f"block {block} · evictable #{rank.get(block, '?')}")
        style = "background:#dbe9f6" if refs > 1 else "background:#e9f5e1" if refs else \
            "background:#f1f1f1;color:#888"
        kids = "".join(node(c) for c in sorted(children.get(block, [])))
        return (f'<li><span style="{style};padding:1px 4px;border-radius:3px" '
                f'data-block="{block}" data-refs="{refs}">{label}</span>'
                + (f"<ul>{kids}</ul>" if kids else "") + "</li>")

    roots = "".join(node(b) for b in sorted(children.get(None, [])))
    event = escape(tr(frame.event))  # kept in English, shown in the chosen language
    at = tr(f"<b>step {step} / {len(frames) - 1}</b>: {event}")
    cached = tr(f"{len(frame.parents)} cached blocks, {len(frame.evictable)} evictable (LRU "
                f"order {frame.evictable}); blue: shared by several requests, green: held by "
                "one, grey: evictable")
    return (f'<div class="kv-prefix-tree" data-step="{step}" data-cached="{len(frame.parents)}" '
            f'data-evictable="{len(frame.evictable)}" style="font-family:monospace;font-size:13px">'
            f"<div>{at}</div><div>{cached}</div>"
            f"<ul>{roots or '<li>' + tr('(empty)') + '</li>'}</ul></div>")


def prefix_tree_player(frames: list[TreeFrame]) -> widgets.VBox:
    return frame_player(lambda step: tree_html(frames, step), len(frames), "kv-prefix-tree")
