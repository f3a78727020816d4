"""The web edition (``make book``) in a real browser: a site of two chapters, built as the whole
one is, served on loopback and opened in Chromium. A chapter page draws its charts, the Chinese
edition reads in Chinese, the language switch and the Colab link lead where they say, and no
page shows an error. No request may leave the machine: the site works offline."""

from __future__ import annotations

import functools
import http.server
import re
import threading

import nbformat
import pytest
from browser_lab import CHROMIUM_FLAGS, chromium, keep_on_loopback, require_browser
from conftest import CHAPTERS

from autograder.builder import book

SHOWN = [c for c in CHAPTERS if c.number in ("01", "11")]  # charts in both, and quick to run
FIRST = CHAPTERS[0]


def _cell(source: str, outputs: list, grade_id: str | None = None):
    cell = nbformat.v4.new_code_cell(source)
    cell.outputs = [nbformat.from_dict(o) for o in outputs]
    if grade_id:
        cell.metadata["nbgrader"] = {"grade": True, "grade_id": grade_id, "points": 1}
    return cell


def _error(name: str) -> dict:
    return {"output_type": "error", "ename": name, "evalue": "x", "traceback": []}


def test_a_page_drops_its_tests_failures_draws_charts_and_notes_widgets():
    figure = {"data": [{"type": "scatter", "x": [1, 2], "y": [3, 4], "name": "</script>"}],
              "layout": {"title": {"text": "t"}, "height": 300}}
    widget = {"model_id": "m", "version_major": 2, "version_minor": 0}  # a slider over a frame
    setup = _cell("import course", [{"output_type": "stream", "name": "stdout",
                                     "text": "interpreter mode"}])
    setup.metadata["nbgrader"] = {"grade": False, "grade_id": "setup", "locked": True}
    notebook = nbformat.v4.new_notebook(cells=[
        setup,
        _cell("check()", [_error("CheckFailed")], grade_id="test_x"),
        _cell("chart()", [{"output_type": "display_data", "metadata": {},
                           "data": {book.PLOTLY: figure}}]),
        _cell("animate()", [{"output_type": "display_data", "metadata": {},
                             "data": {book.WIDGET: widget, "text/plain": "Box()"}}])])
    notebook.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {
        "m": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_s", "IPY_MODEL_h"]}},
        "s": {"model_name": "IntSliderModel", "state": {"value": 0}},
        "h": {"model_name": "HTMLModel", "state": {"value": "<b>frame 0</b>"}}}}}
    page = book.publishable(notebook, FIRST, book.CHINESE)
    links, folded, test, chart, animation = page.cells
    assert folded.metadata["tags"] == ["hide-input"] and folded.outputs  # its code folds away
    assert "English" in links.source and "在 Colab 中打开" in links.source
    assert FIRST.name in links.source and "exercises/zh_CN/" in links.source
    assert test.outputs == []
    html = chart.outputs[0]["data"]["text/html"]
    assert 'class="course-chart" style="height:300px"' in html and "Plotly.newPlot(" in html
    assert "<\\/script>" in html and html.count("</script>") == 1  # the name cannot end it
    assert animation.outputs[0]["data"] == {"text/html": '<div class="course-still"><b>frame 0'
                                            f"</b></div><p><em>{book.CHINESE.animation}</em></p>"}
    assert "widgets" not in page.metadata  # the state was for the still alone
    assert notebook.cells[1].outputs  # the run notebook itself is left as it was
    assert "tags" not in notebook.cells[0].metadata


def test_an_animations_still_is_the_frame_it_keeps_for_a_page():
    widget = {"model_id": "m", "version_major": 2, "version_minor": 0}
    notebook = nbformat.v4.new_notebook(cells=[_cell("animate()", [
        {"output_type": "display_data", "metadata": {},
         "data": {book.WIDGET: widget, "text/plain": "Box()"}}])])
    notebook.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {
        "m": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_h", "IPY_MODEL_c"]}},
        "h": {"model_name": "HTMLModel", "state": {"value": "<b>frame 0</b>"}},
        "c": {"model_name": "HTMLModel", "state": {"value": "<b>frame 9</b>",
                                                     "_dom_classes": ["kv-cover"]}}}}}
    page = book.publishable(notebook, FIRST, book.ENGLISH)
    assert page.cells[1].outputs[0]["data"]["text/html"].startswith(
        '<div class="course-still"><b>frame 9</b></div>')


def test_chapter_10s_animation_keeps_a_frame_with_null_blocks_for_a_page():
    from course.notebook.hybrid_animation import frame_html, window_animation, window_frames
    from course.v1.hybrid_coordinator import HybridKVCacheCoordinator
    from course.v1.kv_coordinator import NULL_BLOCK

    frames = window_frames(HybridKVCacheCoordinator(12, 4, (None, 6)), prompt_len=9,
                           output_len=14)
    animation = window_animation(frames, (None, 6), 4)
    cover = [child for child in animation.children if "kv-cover" in child._dom_classes]
    assert len(cover) == 1 and cover[0].layout.display == "none"  # hidden where it plays
    kept = len(frames) - 2  # the last step before the request finishes and is freed
    assert cover[0].value == frame_html(frames, kept, (None, 6), 4)
    assert NULL_BLOCK in frames[kept].tables[1] and NULL_BLOCK not in frames[0].tables[1]


def test_a_table_printed_row_by_row_is_one_block():
    rows = [{"output_type": "stream", "name": "stdout", "text": f"row {i}\n"} for i in range(7)]
    notebook = nbformat.v4.new_notebook(cells=[_cell("table()", [
        *rows[:3], {"output_type": "stream", "name": "stderr", "text": "warned\n"}, *rows[3:]])])
    outputs = book.publishable(notebook, FIRST, book.ENGLISH).cells[1].outputs
    assert [(o.name, o.text) for o in outputs] == [
        ("stdout", "row 0\nrow 1\nrow 2\n"), ("stderr", "warned\n"),
        ("stdout", "row 3\nrow 4\nrow 5\nrow 6\n")]
    assert len(notebook.cells[0].outputs) == 8  # the run notebook itself is left as it was


def test_an_error_outside_the_test_cells_stops_the_build():
    notebook = nbformat.v4.new_notebook(cells=[_cell("demo()", [_error("NameError")])])
    with pytest.raises(book.BookError, match="cell 0: NameError"):
        book.publishable(notebook, FIRST, book.ENGLISH)


def test_links_point_into_the_site():
    text = ("[one](exercises/01_kv_cache_sizing.ipynb) [two](exercises/02_x.ipynb) "
            "[zh](README.zh-CN.md) [manual](docs/instructors.md#untrusted-notebooks) "
            "[code](course/experiments/kv_sizing.py) [web](https://example.org) "
            "[here](#the-chapters) "
            "![picture](docs/images/a.png)")
    english = book.pointed(text, "README.md", "", book.ENGLISH, ["01_kv_cache_sizing"])
    assert '<a href="01_kv_cache_sizing.html">one</a>' in english
    assert "/blob/main/exercises/02_x.ipynb)" in english  # no page for it: GitHub
    assert '<a href="zh_CN/index.html">zh</a>' in english
    assert '<a href="docs/instructors.html#untrusted-notebooks">manual</a>' in english
    assert "[code](https://github.com/" in english
    assert "/blob/main/course/experiments/kv_sizing.py)" in english
    assert "[web](https://example.org)" in english and "[here](#the-chapters)" in english
    assert "![picture](/docs/images/a.png)" in english
    chinese = book.pointed("[one](exercises/zh_CN/01_kv_cache_sizing.ipynb) [en](README.md) "
                           "[manual](docs/instructors.md)", "README.zh-CN.md", "zh_CN",
                           book.CHINESE, ["01_kv_cache_sizing"])
    assert '<a href="01_kv_cache_sizing.html">one</a>' in chinese
    assert '<a href="../index.html">en</a>' in chinese
    assert '<a href="../docs/instructors.html">manual</a>' in chinese
    from_docs = book.pointed("[readme](../README.md) [shot](images/a.png)", "docs/x.md",
                             "docs", book.ENGLISH, [])
    assert '<a href="../index.html">readme</a>' in from_docs


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # one line per file served: not the test's output
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    require_browser()
    root = tmp_path_factory.mktemp("site") / "book"
    index = book.build(root, SHOWN)
    assert index == root / "index.html" and index.exists()
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()


@pytest.fixture(scope="module")
def browser(site):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chrome = playwright.chromium.launch(executable_path=chromium(), args=CHROMIUM_FLAGS)
        yield chrome
        chrome.close()


@pytest.fixture
def page(browser):
    """A fresh page that may only reach the loopback server, and may log no error to the
    console (a script of the site that fails, the theme or the search)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    refused = keep_on_loopback(context)
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda message: errors.append(f"{page.url}: {message.text}")
            if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(f"{page.url}: {error}"))
    yield page
    context.close()
    assert not refused, f"the site tried to reach the network (refused): {refused}"
    assert not errors, f"the console logged errors: {errors}"


def _no_error_shown(page) -> None:
    """No output shows an error: none of MyST-NB's error outputs, and no traceback's text."""
    assert page.locator(".cell_output .traceback, .cell_output .stderr").count() == 0
    for output in page.locator(".cell_output").all():
        text = output.inner_text()
        assert "Traceback" not in text and "Error:" not in text, text


@pytest.mark.browser
@pytest.mark.parametrize("chapter", SHOWN, ids=lambda c: c.name)
def test_a_chapter_page_draws_its_charts_and_shows_no_error(chapter, site, page):
    from playwright.sync_api import expect

    url, root = site
    page.goto(f"{url}/{chapter.name}.html")
    charts = page.locator(".course-chart")
    expect(charts.first).to_be_attached()
    for chart in charts.all():
        chart.scroll_into_view_if_needed()
        expect(chart.locator(".main-svg").first).to_be_visible()
    assert page.locator(".course-chart").count() == \
        (root / f"{chapter.name}.html").read_text(encoding="utf-8").count('class="course-chart"')
    _no_error_shown(page)
    # the set-up cell's code is folded away (a reader of the site installs nothing)
    assert page.get_by_text("REPOSITORY =").count() >= 1
    expect(page.get_by_text("REPOSITORY =").first).to_be_hidden()
    searches = page.locator("input[type=search], button.search-button-field, "
                            "button.search-button").all()
    assert len([box for box in searches if box.is_visible()]) == 1, "one search field a page"


@pytest.mark.browser
@pytest.mark.parametrize("chapter", SHOWN, ids=lambda c: c.name)
def test_the_chinese_page_reads_in_chinese_and_switches_back(chapter, site, page):
    url, _ = site
    page.goto(f"{url}/zh_CN/{chapter.name}.html")
    heading = page.locator("main h1").first.inner_text()
    assert re.search(r"[\u4e00-\u9fff]", heading), heading
    _no_error_shown(page)
    colab = page.get_by_role("link", name="在 Colab 中打开")
    assert colab.get_attribute("href").endswith(f"exercises/zh_CN/{chapter.name}.ipynb")
    page.get_by_role("link", name="English", exact=True).first.click()
    page.wait_for_url(f"{url}/{chapter.name}.html")
    assert not re.search(r"[\u4e00-\u9fff]", page.locator("main h1").first.inner_text())


@pytest.mark.browser
@pytest.mark.parametrize(("folder", "term"), [("", "paged"), ("zh_CN/", "显存")],
                         ids=["English", "Chinese"])
def test_the_search_finds_a_chapter_by_a_word_of_its_language(site, page, folder, term):
    from playwright.sync_api import expect

    url, _ = site
    page.goto(f"{url}/{folder}search.html?q={term}")
    found = page.locator("#search-results a[href*='01_kv_cache_sizing']")
    expect(found.first).to_be_attached(timeout=30_000)


@pytest.mark.browser
def test_the_index_pages_lead_to_the_chapters_and_the_instructors_manual(site, page):
    url, root = site
    page.goto(f"{url}/index.html")
    page.get_by_role("link", name=re.compile("KV beyond one GPU")).first.click()
    page.wait_for_url(f"{url}/11_kv_beyond_one_gpu.html")
    page.goto(f"{url}/zh_CN/index.html")
    assert re.search(r"[\u4e00-\u9fff]", page.locator("main h1").first.inner_text())
    assert (root / "docs" / "instructors.html").exists()
    for html in root.rglob("*.html"):
        text = html.read_text(encoding="utf-8")
        assert 'class="output traceback' not in text and "output_error" not in text, html
