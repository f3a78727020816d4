"""The web edition: every chapter, in English and Chinese, as a static site (``make book``).

Each chapter's learner notebook (``exercises/``, ``exercises/zh_CN/``) is run top to bottom, its
TODOs unwritten, so the course's own versions draw every picture and table: what a reader sees
is what a learner sees before writing anything, and no answer is printed that the learner
edition would not print. The pages are built with Sphinx and MyST-NB (the executable-book
project's notebook reader, kept by the same people as Jupyter Book) in the Book theme::

    exercises/NN_slug.ipynb ──run──> outputs ──publishable──> NN_slug.ipynb ──Sphinx──> NN_slug.html
        test cells: their "not written yet" failures dropped (the site grades nothing)
        plotly charts: drawn by the plotly.js the site ships (interactive, offline)
        widgets: a still (the frame an animation keeps for it, else its first view), and a
                 note that they play in the notebook
    README.md, docs/*.md ──links to the pages──> index.html, docs/*.html
    README.zh-CN.md       ──────────────────────> zh_CN/index.html

Runs are cached by what they depend on (the notebook, the library, the checks), so a second
build runs only what changed. The last line printed is the path of the English ``index.html``.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import nbformat

from autograder.builder.repository import BRANCH, colab_link, url
from autograder.host.chapters import EXERCISES, REPO, Chapter, chapters

CACHE = REPO / ".book-cache"
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"
DOCS = ("instructors", "benchmarks")  # the instructor's pages
RUNS = "with widget state"  # how a notebook is run: a change here runs every one again
# the site's icon: a block table's three blocks, one of them a shared (darker) one
FAVICON = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">'
           '<rect x="1" y="5" width="4" height="6" fill="#4c78a8"/>'
           '<rect x="6" y="5" width="4" height="6" fill="#2a4d73"/>'
           '<rect x="11" y="5" width="4" height="6" fill="#4c78a8"/></svg>\n')


@dataclass(frozen=True)
class Language:
    """One edition of the site: where its notebooks and index come from, and its words."""

    code: str  # "en", "zh_CN"
    folder: str  # the site's folder for it ("" or "zh_CN")
    readme: str
    other: str  # the other edition's name, in its own language
    colab: str  # "Open in Colab", in this language
    animation: str  # the note under a widget's still


ENGLISH = Language("en", "", "README.md", "简体中文", "Open in Colab",
                   "Its first view: run the notebook (JupyterLab or Colab) to play it.")
CHINESE = Language("zh_CN", "zh_CN", "README.zh-CN.md", "English", "在 Colab 中打开",
                   "这是它的第一个画面：在 JupyterLab 或 Colab 中运行 notebook 即可播放。")
LANGUAGES = (ENGLISH, CHINESE)


class BookError(Exception):
    """The site cannot be built as it stands; the message says where."""


# --- running the notebooks ------------------------------------------------------------------


def exercise(chapter: Chapter, language: Language) -> Path:
    return EXERCISES / language.folder / f"{chapter.name}.ipynb"


def _fingerprint(notebook: Path) -> str:
    """What a run depends on: the notebook and the library it imports (the checks its test
    cells call do not count: the page drops what they print)."""
    digest = hashlib.sha256(RUNS.encode() + notebook.read_bytes())
    for folder in ("course", "kernels"):
        for path in sorted((REPO / folder).rglob("*")):
            if path.suffix in (".py", ".po", ".json") and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(REPO)).encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def run(notebook: Path, timeout: int = 900) -> nbformat.NotebookNode:
    """``notebook`` run top to bottom in a fresh kernel (a test cell's failure is expected:
    its TODO is not written), from the cache where nothing it depends on changed."""
    key = f"{notebook.parent.name}-{notebook.stem}"
    cached = CACHE / f"{key}-{_fingerprint(notebook)}.ipynb"
    if cached.exists():
        return nbformat.read(cached, as_version=4)
    from nbclient import NotebookClient

    print(f"running {notebook.relative_to(REPO)}", flush=True)
    executed = nbformat.read(notebook, as_version=4)
    NotebookClient(executed, timeout=timeout, kernel_name="python3", allow_errors=True,
                   store_widget_state=True,
                   resources={"metadata": {"path": str(notebook.parent)}}).execute()
    CACHE.mkdir(exist_ok=True)
    for stale in CACHE.glob(f"{key}-*.ipynb"):
        stale.unlink()
    nbformat.write(executed, cached)
    return executed


# --- what a page shows ----------------------------------------------------------------------


def publishable(notebook: nbformat.NotebookNode, chapter: Chapter, language: Language
                ) -> nbformat.NotebookNode:
    """The run notebook as a page shows it: the set-up cell's code folded away, test cells
    without their failures, each run of printed text one block, charts drawn by the site's
    plotly.js, widgets as their first view (still) with a note, a line of links first (the
    other language, Colab). Any other error output stops the build."""
    page = nbformat.from_dict(json.loads(json.dumps(notebook)))
    states = page.metadata.pop("widgets", {}).get(
        "application/vnd.jupyter.widget-state+json", {}).get("state", {})
    for index, cell in enumerate(page.cells):
        if cell.cell_type != "code":
            continue
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "setup":
            # a reader of the site installs nothing: the set-up's code folds away, what it
            # printed (the mode the pages were run in) stays
            cell.metadata["tags"] = [*cell.metadata.get("tags", []), "hide-input"]
        if cell.metadata.get("nbgrader", {}).get("grade"):
            cell.outputs = []  # "not written yet": the site grades nothing
            continue
        cell.outputs = _joined_streams(cell.outputs)
        errors = [o for o in cell.outputs if o.output_type == "error"]
        if errors:
            raise BookError(f"{chapter.name} ({language.code}), cell {index}: "
                            f"{errors[0].ename}: {errors[0].evalue}")
        for output in cell.outputs:
            data = output.get("data", {})
            if PLOTLY in data:
                output["data"] = {"text/html": _chart(data[PLOTLY])}
            elif WIDGET in data:  # it plays with a kernel: its first view, still
                still = _still(data[WIDGET]["model_id"], states)
                output["data"] = {"text/html": f'<div class="course-still">{still}</div>'
                                               f"<p><em>{language.animation}</em></p>"}
    page.cells.insert(0, nbformat.v4.new_markdown_cell(_links(chapter, language)))
    return page


def _joined_streams(outputs: list) -> list:
    """A cell's outputs with each run of printed text on one stream joined into one output: a
    table printed row by row (a chart's data in between, if any, still splits it) is one block
    on the page, not a box per row."""
    joined: list = []
    for output in outputs:
        previous = joined[-1] if joined else None
        if (output.output_type == "stream" and previous is not None
                and previous.output_type == "stream" and previous.name == output.name):
            previous.text += output.text
        else:
            joined.append(output)
    return joined


def _still(model_id: str, states: dict) -> str:
    """A widget's still: the frame it keeps for a page that cannot play it (an HTML view of
    class ``kv-cover``, ``course.notebook.player``), else its first view, as the HTML its views held
    when the notebook ran (the course's animations draw each frame as an HTML widget's value;
    sliders and buttons show nothing)."""
    covers = list(_views(model_id, states, cover=True))
    return covers[0] if covers else "".join(_views(model_id, states, cover=False))


def _views(model_id: str, states: dict, cover: bool):
    """The HTML values under a widget, of its hidden covers or of its shown views."""
    model = states.get(model_id, {})
    state = model.get("state", {})
    if model.get("model_name") == "HTMLModel":
        if ("kv-cover" in state.get("_dom_classes", [])) == cover:
            yield state.get("value", "")
        return
    for child in state.get("children", []):
        yield from _views(child.removeprefix("IPY_MODEL_"), states, cover)


def _chart(figure: dict) -> str:
    """A plotly figure as a div and the call that draws it (plotly.js ships with the site)."""
    name = f"chart-{uuid.uuid5(uuid.NAMESPACE_OID, json.dumps(figure, sort_keys=True)).hex}"
    height = figure.get("layout", {}).get("height", 450)
    data, layout = (json.dumps(figure.get(key, default)).replace("</", "<\\/")
                    for key, default in (("data", []), ("layout", {})))  # no early </script>
    return (f'<div id="{name}" class="course-chart" style="height:{height}px"></div>\n'
            f'<script>Plotly.newPlot("{name}", {data}, {layout}, {{"responsive": true}});'
            "</script>")


def _links(chapter: Chapter, language: Language) -> str:
    """The line above a chapter: the same page in the other language, the notebook on Colab."""
    other = CHINESE if language is ENGLISH else ENGLISH
    there = _relative(language.folder, other.folder, f"{chapter.name}.html")
    colab = colab_link(url(), exercise(chapter, language).relative_to(REPO).as_posix())
    return f'<a href="{there}">{language.other}</a> · <a href="{colab}">{language.colab}</a>'


def _relative(here: str, folder: str, name: str) -> str:
    """The link from a page in site folder ``here`` to ``name`` in site folder ``folder``."""
    return posixpath.relpath(posixpath.join(folder or ".", name), here or ".")


# --- the pages around the chapters ----------------------------------------------------------


def pointed(text: str, source: str, here: str, language: Language, names: list[str]) -> str:
    """Markdown from ``source`` (a path in the repository) made a page in site folder ``here``
    (``""``, ``"docs"``, ``"zh_CN"``) of ``language``'s edition: a chapter's notebook links to
    its page, a README to its edition's index, a doc to its page (the English edition's), an
    image to the copy beside the pages; anything else in the repository links to GitHub."""
    base = Path(source).parent

    def in_repository(target: str) -> str:
        return os.path.normpath(base / target).replace(os.sep, "/")

    def target_of(target: str) -> str | None:
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            return None
        path, _, anchor = target.partition("#")
        anchor = f"#{anchor}" if anchor else ""
        repo_path, stem = in_repository(path), Path(path).stem
        if repo_path.startswith("exercises/") and stem in names:
            return _relative(here, language.folder, f"{stem}.html")
        for edition in LANGUAGES:
            if repo_path == edition.readme:
                return _relative(here, edition.folder, "index.html") + anchor
        if repo_path in (f"docs/{doc}.md" for doc in DOCS):
            return _relative(here, "docs", f"{stem}.html") + anchor
        return f"{url()}/blob/{BRANCH}/{repo_path}{anchor}"

    def link(match: re.Match) -> str:
        found = target_of(match.group(2))
        if found is None:
            return match.group(0)
        if found.startswith("http"):
            return f"[{match.group(1)}]({found})"
        return f'<a href="{found}">{match.group(1)}</a>'

    def image(match: re.Match) -> str:
        repo_path = in_repository(match.group(2))
        return f"![{match.group(1)}](/{repo_path})" if repo_path.startswith("docs/images/") \
            else match.group(0)

    text = re.sub(r"!\[([^\]]*)\]\(([^)\s]+)\)", image, text)
    return re.sub(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)", link, text)


def _conf(language: Language, title: str) -> str:
    """Sphinx's configuration of one edition: notebooks read, never run, by MyST-NB; the Book
    theme in the edition's language, light, one search field (the header's), with plotly.js
    on every page; Chinese pages indexed word by word (jieba)."""
    return "\n".join([
        f"project = {title!r}",
        f"language = {language.code!r}",
        'extensions = ["myst_nb"]',
        'nb_execution_mode = "off"',
        'myst_heading_anchors = 3',
        'html_theme = "sphinx_book_theme"',
        f"html_title = {title!r}",
        'html_static_path = ["_static"]',
        'html_js_files = ["plotly.min.js"]',
        'html_favicon = "_static/favicon.svg"',
        f"html_theme_options = {{'repository_url': {url()!r}, 'use_repository_button': True}}",
        'html_context = {"default_mode": "light"}',
        'html_sidebars = {"**": ["navbar-logo.html", "sbt-sidebar-nav.html"]}',
        'exclude_patterns = ["_build"]',
        'suppress_warnings = ["myst.header", "myst.xref_missing", "misc.highlighting_failure"]',
        "",
        "",
        "def setup(app):",
        "    # Sphinx's Chinese search stems the pages' Latin words with its English stemmer but",
        "    # names a ChineseStemmer in the pages' JavaScript, which no file defines",
        "    from sphinx.search.zh import SearchChinese",
        "",
        '    SearchChinese.language_name = "English"',
        "",
    ])


def _source_tree(root: Path, language: Language, pages: dict[str, nbformat.NotebookNode]
                 ) -> None:
    """The Sphinx project of one edition in ``root``: its chapters, its README as the index,
    the images, and (in English) the instructor's pages."""
    (root / "_static").mkdir(parents=True)
    import plotly

    shutil.copy(Path(plotly.__file__).parent / "package_data" / "plotly.min.js",
                root / "_static")
    # a page's icon: without one, a browser asks the server for /favicon.ico, and logs a 404
    (root / "_static" / "favicon.svg").write_text(FAVICON, encoding="utf-8")
    shutil.copytree(REPO / "docs" / "images", root / "docs" / "images")
    title = "Paged KV cache" if language is ENGLISH else "分页 KV 缓存"
    (root / "conf.py").write_text(_conf(language, title), encoding="utf-8")
    for name, notebook in pages.items():
        nbformat.write(notebook, root / f"{name}.ipynb")
    toctree = list(pages)
    if language is ENGLISH:
        for doc in DOCS:
            source = f"docs/{doc}.md"
            text = (REPO / source).read_text(encoding="utf-8")
            switch = f'<a href="{_relative("docs", CHINESE.folder, "index.html")}">' \
                f"{ENGLISH.other}</a>\n\n"  # the manual is in English: the other edition's index
            (root / source).write_text(switch + pointed(text, source, "docs", language,
                                                        list(pages)), encoding="utf-8")
            toctree.append(f"docs/{doc}")
    index = pointed((REPO / language.readme).read_text(encoding="utf-8"), language.readme,
                    language.folder, language, list(pages))
    contents = "\n".join(["```{toctree}", ":hidden:", ":maxdepth: 1", "", *toctree, "```"])
    (root / "index.md").write_text(f"{index}\n\n{contents}\n", encoding="utf-8")


def build(destination: Path, selected: list[Chapter] | None = None) -> Path:
    """The site, in ``destination`` (replaced): English at its root, Chinese in ``zh_CN/``.
    Every notebook runs first, as many at once as there are cores. Returns the English
    ``index.html``."""
    from concurrent.futures import ThreadPoolExecutor

    selected = selected or list(chapters().values())
    jobs = [(chapter, language) for language in LANGUAGES for chapter in selected]
    os.environ["PLOTLY_RENDERER"] = "plotly_mimetype"  # the figure's JSON, drawn by the site
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        ran = list(pool.map(lambda job: run(exercise(*job)), jobs))
    sources = destination.parent / f".{destination.name}-sources"
    shutil.rmtree(sources, ignore_errors=True)
    shutil.rmtree(destination, ignore_errors=True)
    for language in LANGUAGES:
        pages = {chapter.name: publishable(notebook, chapter, language)
                 for (chapter, edition), notebook in zip(jobs, ran, strict=True)
                 if edition is language}
        root = sources / (language.folder or "en")
        _source_tree(root, language, pages)
        out = destination / language.folder  # English at the root
        done = subprocess.run([sys.executable, "-m", "sphinx", "-q", "-b", "html", str(root),
                               str(out)], capture_output=True, text=True)
        if done.returncode:
            raise BookError(f"Sphinx failed on the {language.code} edition:\n{done.stderr}")
    shutil.rmtree(sources, ignore_errors=True)
    return destination / "index.html"
