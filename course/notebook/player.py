"""Play / Step / slider controls over a list of recorded frames (core ipywidgets only)."""

from __future__ import annotations

from collections.abc import Callable

import ipywidgets as widgets

from course.language import tr


def frame_player(render: Callable[[int], str], steps: int, css_class: str,
                 interval_ms: int = 900, cover: int | None = None) -> widgets.VBox:
    """A Play button, step buttons and a slider driving an HTML view of ``render(step)``.

    The step buttons carry the classes ``kv-step-back`` / ``kv-step-forward`` and the view
    ``css_class``-view, for browser tests. ``cover``: the step a page that cannot play it
    shows (the web edition's still), kept in a hidden view of class ``kv-cover``; else step 0.
    """
    last = steps - 1
    play = widgets.Play(value=0, min=0, max=last, step=1, interval=interval_ms,
                        description=tr("play"))
    slider = widgets.IntSlider(value=0, min=0, max=last, description=tr("step"))
    widgets.jslink((play, "value"), (slider, "value"))
    back = widgets.Button(description="◀ " + tr("step"), layout=widgets.Layout(width="80px"))
    forward = widgets.Button(description=tr("step") + " ▶", layout=widgets.Layout(width="80px"))
    back.add_class("kv-step-back")
    forward.add_class("kv-step-forward")
    view = widgets.HTML(render(0))
    view.add_class(f"{css_class}-view")

    def show(change: dict) -> None:
        view.value = render(change["new"])

    slider.observe(show, names="value")
    back.on_click(lambda _: setattr(slider, "value", max(0, slider.value - 1)))
    forward.on_click(lambda _: setattr(slider, "value", min(last, slider.value + 1)))
    shown = [widgets.HBox([play, back, forward, slider]), view]
    if cover is not None:
        still = widgets.HTML(render(cover), layout=widgets.Layout(display="none"))
        still.add_class("kv-cover")
        shown.append(still)
    return widgets.VBox(shown)
