"""An ipywidgets explorer of address translation: position -> (block, offset) -> slot.

Core ipywidgets only (an IntSlider and an HTML view), so it works in JupyterLab, Notebook 7,
VS Code and Colab. The HTML carries stable hooks for tests: the root element has the class
``kv-address-explorer`` and ``data-position``, ``data-logical-block``, ``data-offset``,
``data-physical-block`` and ``data-slot`` attributes.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape

import ipywidgets as widgets

from course.language import tr

_STYLE = """<style>
.kv-address-explorer {font-family: monospace; font-size: 13px; line-height: 1.5}
.kv-address-explorer table {border-collapse: collapse; margin: 4px 0}
.kv-address-explorer td {border: 1px solid #bbb; min-width: 26px; text-align: center;
  padding: 1px 3px}
.kv-address-explorer .mine {background: #dbe9f6}
.kv-address-explorer .here {background: #f4a259; font-weight: bold}
.kv-address-explorer .label {border: none; text-align: right; color: #666}
</style>"""


def explorer_html(position: int, block_table: list[int], block_size: int, num_pool_blocks: int,
                  locate: Callable, slot_id: Callable) -> str:
    """The explorer's view of ``position``: its sequence, its table entry, its pool slot."""
    physical, offset = locate(position, block_table, block_size)
    slot = slot_id(position, block_table, block_size)
    logical = position // block_size
    positions = "".join(
        f'<td class="{"here" if p == position else "mine"}">{p}</td>'
        + ('<td class="label">|</td>' if (p + 1) % block_size == 0 else "")
        for p in range(len(block_table) * block_size))
    table = "".join(
        f'<tr><td class="label">{tr(f"logical {i}")}</td>'
        f'<td class="{"here" if i == logical else "mine"}">{b}</td></tr>'
        for i, b in enumerate(block_table))
    rows = []
    for block in range(num_pool_blocks):
        cells = []
        for o in range(block_size):
            here = block * block_size + o == slot
            shade = "here" if here else "mine" if block in block_table else ""
            cells.append(f'<td class="{shade}">{block * block_size + o}</td>')
        rows.append(f'<tr><td class="label">{tr(f"block {block}")}</td>{"".join(cells)}</tr>')
    route = tr(f"logical block {position} // {block_size} = {logical}, offset {position} % "
               f"{block_size} = {offset} &rarr; block table[{logical}] = physical block "
               f"{physical} &rarr; slot {physical} &times; {block_size} + {offset} =")
    sequence, table_title = tr("the sequence (logical positions):"), tr("block table:")
    pool = tr("the pool (slot ids; this sequence's blocks shaded):")
    return (
        f'{_STYLE}<div class="kv-address-explorer" data-position="{position}" '
        f'data-logical-block="{logical}" data-offset="{offset}" '
        f'data-physical-block="{physical}" data-slot="{slot}">'
        f"<b>{tr(f'position {position}')}</b> &rarr; {route} <b>{slot}</b>"
        f"<p>{sequence}</p><table><tr>{positions}</tr></table>"
        f"<p>{table_title}</p><table>{table}</table>"
        f"<p>{pool}</p><table>{''.join(rows)}</table></div>")


def address_explorer(block_table: list[int], block_size: int, num_pool_blocks: int,
                     locate: Callable, slot_id: Callable) -> widgets.VBox:
    """A slider over the sequence's positions and the view of the chosen one."""
    if max(block_table) >= num_pool_blocks:
        raise ValueError(f"the table names block {max(block_table)}, but the pool has only "
                         f"{num_pool_blocks} blocks")
    slider = widgets.IntSlider(value=0, min=0, max=len(block_table) * block_size - 1,
                               description=tr("position"), continuous_update=True)
    view = widgets.HTML()

    def show(change: dict | None = None) -> None:
        try:
            view.value = explorer_html(slider.value, block_table, block_size, num_pool_blocks,
                                       locate, slot_id)
        except Exception as exc:  # the learner's function failed: say so, keep the slider alive
            view.value = ('<div class="kv-address-explorer" data-error="1">'
                          + tr(f"position {slider.value}: {escape(type(exc).__name__)}: "
                               f"{escape(str(exc))}") + "</div>")

    slider.observe(show, names="value")
    show()
    return widgets.VBox([slider, view])
