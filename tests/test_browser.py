"""The notebooks in a real browser: JupyterLab 4 on loopback, driven by Playwright on Chromium.

Each test opens a notebook (a solution with its hidden tests cleared, as on release), runs all
its cells as a learner would, and asserts on the state the widgets publish in their DOM
(``data-*`` attributes, see course/notebook/block_animation.py) and on the charts plotly drew. No
request may leave the machine. On failure a screenshot is saved under ``build/browser/``;
``KV_SCREENSHOTS=DIR`` also writes the pictures the README shows (``make screenshots`` writes
them to docs/images/).

Outside CI these tests skip, with the reason, where Chromium or Playwright is missing; in CI
(``CI`` set) they fail instead, so they never pass by not running.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from browser_lab import (
    CHROMIUM_FLAGS,
    chromium,
    jupyter_lab,
    keep_on_loopback,
    require_browser,
    run_all,
)
from conftest import CHAPTERS, REPO
from notebook_variants import without_hidden_tests

from course.notebook import block_scenarios
from course.v0 import block_manager
from course.v0.frames import Frame

pytestmark = pytest.mark.browser

FAILURES = REPO / "build" / "browser"
PICTURES = Path(os.environ["KV_SCREENSHOTS"]) if os.environ.get("KV_SCREENSHOTS") else None
BY_NUMBER = {c.number: c for c in CHAPTERS}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    require_browser()
    root = tmp_path_factory.mktemp("lab")
    for folder in ("solutions", "exercises"):
        shutil.copytree(REPO / folder, root / folder)
    for solution in (root / "solutions").rglob("*.ipynb"):  # the pictures are tested here
        without_hidden_tests(solution, solution)
    with jupyter_lab(root) as server:
        yield server


@pytest.fixture(scope="module")
def browser(lab):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chrome = playwright.chromium.launch(executable_path=chromium(), args=CHROMIUM_FLAGS)
        yield chrome
        chrome.close()


@pytest.fixture
def page(browser, lab, request):
    """A fresh page that may only reach the loopback server; screenshot saved on failure."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    refused = keep_on_loopback(context)
    tab = context.new_page()
    yield tab
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        FAILURES.mkdir(parents=True, exist_ok=True)
        shot = FAILURES / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', request.node.name)}.png"
        tab.screenshot(path=str(shot), full_page=True)
        print(f"screenshot of the failure: {shot}")
    context.close()
    lab.shut_down_kernels()
    assert not refused, f"the notebook tried to reach the network (refused): {refused}"


def _picture(locator, name: str) -> None:
    """Write ``name``.png for the README when asked to (``KV_SCREENSHOTS``)."""
    if PICTURES is not None:
        PICTURES.mkdir(parents=True, exist_ok=True)
        locator.scroll_into_view_if_needed()
        locator.screenshot(path=str(PICTURES / f"{name}.png"))


def _errors(cells: list[dict]) -> dict[str, list[str]]:
    return {c["grade_id"] or f"code cell {i}": c["errors"]
            for i, c in enumerate(cells) if c["errors"]}


def _path(folder: str, number: str) -> str:
    return f"{folder}/{BY_NUMBER[number].name}.ipynb"


# ----------------------------------------------------------------------------------------------
# Chapter 3: the allocation animation, driven through every control


def _trace(num_blocks: int, script) -> list[Frame]:
    return block_scenarios.record(block_manager.BlockManager(num_blocks, 4), num_blocks, script)


def _shows(view, frames: list[Frame], step: int) -> None:
    """The view shows ``step`` of ``frames``: its hooks and its drawn blocks agree with the
    trace."""
    from playwright.sync_api import expect

    expect(view).to_have_attribute("data-step", str(step))
    frame = frames[step]
    assert view.get_attribute("data-used-blocks") == str(frame.used_blocks)
    assert view.locator(".block:not(.free)").count() == frame.used_blocks
    refs = [int(b.get_attribute("data-refs")) for b in view.locator(".block").all()]
    assert refs == list(frame.ref_counts)
    assert view.get_attribute("data-cow") == str(int(frame.copy is not None))


def test_the_allocation_animation_plays_steps_and_highlights_copy_on_write(page, lab):
    from playwright.sync_api import expect

    cells = run_all(page, lab, _path("solutions", "03"))
    assert _errors(cells) == {}
    traces = [_trace(12, block_scenarios.interleaved_growth()),
              _trace(16, block_scenarios.beam_search(width=3)),
              _trace(5, block_scenarios.running_out())]
    players = page.locator(".jp-OutputArea-output").filter(has=page.locator(".kv-block-animation"))
    expect(players).to_have_count(len(traces))
    for player, frames in zip(players.all(), traces, strict=True):
        assert player.locator(".kv-block-animation").get_attribute("data-steps") == str(
            len(frames))

    player, frames = players.nth(0), traces[0]
    view = player.locator(".kv-block-animation")
    _shows(view, frames, 0)
    forward, back = player.locator(".kv-step-forward"), player.locator(".kv-step-back")
    for step in range(1, len(frames)):  # Step walks the whole trace
        forward.click()
        _shows(view, frames, step)
    forward.click()  # past the end: stays on the last step
    _shows(view, frames, len(frames) - 1)
    back.click()
    _shows(view, frames, len(frames) - 2)

    handle = player.locator(".noUi-handle")  # the slider, by keyboard
    handle.focus()
    page.keyboard.press("Home")
    _shows(view, frames, 0)
    page.keyboard.press("ArrowRight")
    _shows(view, frames, 1)

    player.locator(".widget-play button:has(.fa-play)").click()  # Play advances on its own
    expect(view).to_have_attribute("data-step", re.compile(r"^([3-9]|\d\d+)$"), timeout=15_000)
    player.locator(".widget-play button:has(.fa-stop)").click()  # Stop: back to the start
    expect(view).to_have_attribute("data-step", "0", timeout=5_000)
    page.wait_for_timeout(1500)
    _shows(view, frames, 0)

    player, frames = players.nth(1), traces[1]  # beam search: forks, then copy-on-write
    view = player.locator(".kv-block-animation")
    copies = [i for i, f in enumerate(frames) if f.copy is not None]
    assert copies, "the beam-search scenario should copy a shared block"
    readout = player.locator(".widget-readout")  # the slider's number, typed into
    readout.click()
    page.keyboard.press("Control+A")
    page.keyboard.type(str(copies[0]))
    page.keyboard.press("Enter")
    _shows(view, frames, copies[0])
    source, destination = frames[copies[0]].copy[:2]
    expect(view.locator(".cow-src")).to_have_attribute("data-block", str(source))
    expect(view.locator(".cow-dst")).to_have_attribute("data-block", str(destination))
    _picture(player, "allocation-animation")
    player.locator(".kv-step-forward").click()
    if copies[0] + 1 not in copies:
        expect(view.locator(".cow-src")).to_have_count(0)


# ----------------------------------------------------------------------------------------------
# Every other solution: its charts drawn, its widgets live


def _plotly_drawn(page, cells: list[dict]) -> None:
    """Every figure the kernel sent is drawn (an SVG plot in the page)."""
    from playwright.sync_api import expect

    sent = sum(c["mimes"].count("application/vnd.plotly.v1+json") for c in cells)
    drawn = page.locator(".jp-OutputArea-output.js-plotly-plot")
    expect(drawn).to_have_count(sent, timeout=20_000)
    for figure in drawn.all():
        figure.scroll_into_view_if_needed()
        expect(figure.locator(".main-svg").first).to_be_visible()


def _address_explorer(page) -> None:
    from playwright.sync_api import expect

    view = page.locator(".kv-address-explorer")
    expect(view).to_have_count(1)
    output = page.locator(".jp-OutputArea-output").filter(has=view)
    handle = output.locator(".noUi-handle").first
    handle.focus()
    page.keyboard.press("Home")
    expect(view).to_have_attribute("data-position", "0")
    for _ in range(6):
        page.keyboard.press("ArrowRight")
    expect(view).to_have_attribute("data-position", "6")
    # table [5, 2, 9], blocks of 4: position 6 is logical block 1, offset 2, physical block 2
    assert [view.get_attribute(f"data-{a}") for a in ("logical-block", "offset",
                                                       "physical-block", "slot")] == [
        "1", "2", "2", "10"]


def _prefix_tree(page) -> None:
    from playwright.sync_api import expect

    view = page.locator(".kv-prefix-tree")
    expect(view).to_have_count(1)
    output = page.locator(".jp-OutputArea-output").filter(has=view)
    expect(view).to_have_attribute("data-step", "0")
    output.locator(".kv-step-forward").click()
    expect(view).to_have_attribute("data-step", "1")
    assert int(view.get_attribute("data-cached")) > 0  # the first request's blocks are cached


def _serving_animation(page, cells: list[dict]) -> None:
    from playwright.sync_api import expect

    view = page.locator(".kv-block-animation")
    expect(view).to_have_count(1)
    printed = next(t for c in cells for t in c["text"] if re.search(r"\d+ steps;", t))
    steps = int(re.search(r"(\d+) steps;", printed).group(1))
    assert view.get_attribute("data-steps") == str(steps)
    output = page.locator(".jp-OutputArea-output").filter(has=view)
    output.locator(".kv-step-forward").click()
    expect(view).to_have_attribute("data-step", "1")
    assert int(view.get_attribute("data-used-blocks")) > 0  # a request is being served


def _budget_animation(page) -> None:
    from playwright.sync_api import expect

    view = page.locator(".kv-budget-animation")
    expect(view).to_have_count(1)
    output = page.locator(".jp-OutputArea-output").filter(has=view)
    expect(view).to_have_attribute("data-step", "0")
    assert int(view.get_attribute("data-tokens")) > 0  # the first step computes a prompt
    output.locator(".kv-step-forward").click()
    expect(view).to_have_attribute("data-step", "1")
    assert int(view.get_attribute("data-tokens")) <= int(view.get_attribute("data-budget"))


def _window_animation(page) -> None:
    """Chapter 10: a step forward slides the window past the prompt's first block, which the
    sliding group's table shows as a null slot, while the full group's holds every block."""
    from playwright.sync_api import expect

    view = page.locator(".kv-window-animation-view .kv-window-animation")
    expect(view).to_have_count(1)
    # the frame it keeps for a page that cannot play it is there, hidden
    expect(page.locator(".kv-cover .kv-window-animation")).to_be_hidden()
    output = page.locator(".jp-OutputArea-output").filter(has=view)
    expect(view).to_have_attribute("data-step", "0")
    assert view.get_attribute("data-null-blocks") == "0"  # the prompt's step frees nothing
    output.locator(".kv-step-forward").click()
    expect(view).to_have_attribute("data-step", "1")
    assert int(view.get_attribute("data-null-blocks")) > 0
    expect(view.locator('.slot.null[data-group="1"]').first).to_be_visible()
    assert view.locator('.slot.null[data-group="0"]').count() == 0


WIDGETS = {"02": _address_explorer, "04": _prefix_tree, "09": _budget_animation,
           "10": _window_animation}
# README pictures: file name -> words in the figure's title
PICTURES_OF = {"02": {"memory-breakdown": "Where the KV pool goes"},
               "05": {"throughput-vs-rate": "Throughput vs request rate",
                      "serving-timeline": "One run at 4 requests/s"}}


@pytest.mark.parametrize("number", [n for n in BY_NUMBER if n != "03"],
                         ids=lambda n: BY_NUMBER[n].name)
def test_a_solution_runs_in_the_browser_and_draws_its_charts_and_widgets(number, page, lab):
    cells = run_all(page, lab, _path("solutions", number))
    assert _errors(cells) == {}
    _plotly_drawn(page, cells)
    if number in WIDGETS:
        WIDGETS[number](page)
    if number == "08":
        _serving_animation(page, cells)
    for name, title in PICTURES_OF.get(number, {}).items():
        _picture(page.locator(".js-plotly-plot").filter(has_text=title), name)
    assert not page.get_by_text("Error displaying widget").count()


def test_notebook_7_draws_the_charts_too(page, lab):
    """Notebook 7 renders plotly's figures through the same extension as JupyterLab."""
    cells = run_all(page, lab, _path("solutions", "01"), ui="notebook")
    assert _errors(cells) == {}
    _plotly_drawn(page, cells)


# ----------------------------------------------------------------------------------------------
# Exercises not yet filled in: errors in the test cells only, pictures from the course's own
# version (the two animations here; tests/test_notebooks.py runs every exercise outside the
# browser)


@pytest.mark.parametrize("number", ["03", "08"], ids=lambda n: BY_NUMBER[n].name)
def test_an_unfilled_exercise_fails_only_its_tests_and_its_widgets_fall_back(number, page, lab):
    from playwright.sync_api import expect

    cells = run_all(page, lab, _path("exercises", number))
    errors = _errors(cells)
    assert errors and all(name.startswith("test_") for name in errors), errors
    notes = [t for c in cells for t in c["text"] if "the course's own version" in t]
    assert notes, "a widget over an unfinished TODO should say the course's version stands in"
    outputs = page.locator(".jp-OutputArea-output")  # not a markdown cell's hidden source
    expect(outputs.get_by_text("the course's own version").first).to_be_visible()
    assert page.locator(".kv-block-animation").count() >= 1  # the course's version, animated
    assert not page.get_by_text("Error displaying widget").count()


# ----------------------------------------------------------------------------------------------
# The Chinese edition: rendered in Chinese, with Chinese hints

# Two different characters drawn in the page's own font: where the font has no Chinese glyphs,
# both are drawn as the same empty box.
_CJK_DRAWN = """(font) => {
  const draw = (text) => {
    const canvas = document.createElement('canvas');
    canvas.width = 64; canvas.height = 64;
    const context = canvas.getContext('2d');
    context.font = font;
    context.fillText(text, 4, 48);
    return Array.from(context.getImageData(0, 0, 64, 64).data).join(',');
  };
  return draw('块') !== draw('表') && draw('块') !== draw(' ');
}"""


def test_a_chinese_notebook_renders_chinese_and_its_failing_tests_hint_in_chinese(page, lab):
    from playwright.sync_api import expect

    cells = run_all(page, lab, f"exercises/zh_CN/{BY_NUMBER['03'].name}.ipynb")
    errors = _errors(cells)
    assert errors and all(name.startswith("test_") for name in errors), errors
    hints = [text for name, texts in errors.items() for text in texts]
    assert any("还没有实现" in text for text in hints), hints
    heading = page.locator(".jp-MarkdownOutput h1").first
    expect(heading).to_contain_text("第 3 章")
    font = heading.evaluate("e => getComputedStyle(e).font")
    assert page.evaluate(_CJK_DRAWN, font), f"no font draws Chinese ({font}): install a CJK font"
    FAILURES.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(FAILURES / "chinese-notebook.png"))
    page.locator(".jp-CodeCell", has_text="还没有实现").first.scroll_into_view_if_needed()
    _picture(page.locator(".jp-NotebookPanel").first, "chinese-notebook")
