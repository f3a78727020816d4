"""Colab and VS Code readiness: one repository URL behind every setup cell and Colab link, and
nothing that needs a front-end extension (core ipywidgets and plotly's own renderers only)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import nbformat
import pytest
from conftest import CHAPTERS, REPO

from autograder.builder import repository
from autograder.host.chapters import EXERCISES, Chapter

NOTEBOOKS = [c.source for c in CHAPTERS] + [EXERCISES / c.source.name for c in CHAPTERS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_setup_cell_installs_from_the_one_repository_url(path):
    assert repository.setup_cell_of(path) == repository.setup_cell(repository.url()), (
        f"{path.name}: its setup cell is not the current one: run `python -m autograder "
        "repository URL` (or edit autograder/builder/repository.py), then `make exercises`")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_learner_first_sees_one_short_line_of_the_setup_cell(path):
    """Colab shows the form's title alone; JupyterLab and VS Code fold the code away."""
    notebook = nbformat.read(path, as_version=4)
    first = next(c for c in notebook.cells if c.cell_type == "code")
    assert first.source.splitlines()[0].startswith("#@title ")
    assert first.metadata["cellView"] == "form"
    assert first.metadata["jupyter"]["source_hidden"] is True


@pytest.mark.parametrize(("readme", "folder"), [("README.md", "exercises"),
                                               ("README.zh-CN.md", "exercises/zh_CN")])
def test_each_readme_opens_every_chapter_in_colab_from_that_url(readme, folder):
    links = re.findall(r"\[Colab\]\(([^)]+)\)", (REPO / readme).read_text(encoding="utf-8"))
    assert links == [repository.colab_link(repository.url(), f"{folder}/{c.source.name}")
                     for c in CHAPTERS]
    notebooks = re.findall(r"\]\((exercises/[^)]+\.ipynb)\)", (REPO / readme).read_text(
        encoding="utf-8"))
    assert notebooks == [f"{folder}/{c.source.name}" for c in CHAPTERS]
    assert all((REPO / notebook).exists() for notebook in notebooks)


@pytest.mark.parametrize(("url", "expected"), [
    ("https://github.com/you/course", "https://colab.research.google.com/github/you/course/"
                                      "blob/main/exercises/01_x.ipynb"),
    ("https://github.com/you/course.git/", "https://colab.research.google.com/github/you/"
                                           "course/blob/main/exercises/01_x.ipynb"),
], ids=["plain", "dot-git-and-slash"])
def test_a_colab_link_opens_the_notebook_from_github(url, expected):
    assert repository.colab_link(url, "exercises/01_x.ipynb") == expected


def test_a_url_colab_cannot_open_is_refused_and_nothing_changes(tmp_path):
    before = [(REPO / "pyproject.toml").read_text(), (REPO / "README.md").read_text()]
    done = subprocess.run([sys.executable, "-m", "autograder", "repository",
                           "https://gitlab.com/you/course"], capture_output=True, text=True)
    assert done.returncode == 1
    assert "not on github.com" in done.stderr
    assert before == [(REPO / "pyproject.toml").read_text(), (REPO / "README.md").read_text()]


def test_setting_the_url_rewrites_pyproject_setup_cells_and_links(tmp_path, monkeypatch):
    for name in ("pyproject.toml", "README.md", "README.zh-CN.md"):
        shutil.copyfile(REPO / name, tmp_path / name)
    copies = []
    for chapter in CHAPTERS:
        shutil.copyfile(chapter.source, tmp_path / chapter.source.name)
        copies.append(Chapter(chapter.name, tmp_path / chapter.source.name))
    monkeypatch.setattr(repository, "PYPROJECT", tmp_path / "pyproject.toml")
    monkeypatch.setattr(repository, "READMES", (tmp_path / "README.md",
                                                tmp_path / "README.zh-CN.md"))

    repository.set_url("https://github.com/someone/fork", copies)

    assert repository.url() == "https://github.com/someone/fork"
    for copy in copies:
        assert 'REPOSITORY = "https://github.com/someone/fork"' in repository.setup_cell_of(
            copy.source)
    for readme in ("README.md", "README.zh-CN.md"):
        links = re.findall(r"\[Colab\]\(([^)]+)\)",
                           (tmp_path / readme).read_text(encoding="utf-8"))
        assert len(links) == len(CHAPTERS)
        assert all(link.startswith("https://colab.research.google.com/github/someone/fork/"
                                   "blob/") for link in links)


def test_widgets_and_charts_need_no_front_end_extension():
    """Colab and VS Code render core ipywidgets and plotly's figures, not custom widgets: the
    course defines no widget with its own front end and never uses FigureWidget."""
    sources = {p: p.read_text() for p in (REPO / "course").rglob("*.py")}
    sources |= {p: p.read_text() for p in NOTEBOOKS}
    custom = {str(p.relative_to(REPO)) for p, text in sources.items()
              if re.search(r"\b(anywidget|_esm|_view_module|DOMWidget|FigureWidget)\b", text)}
    assert not custom, f"these need a front-end extension: {sorted(custom)}"


def _course_wheel(folder, needs: str):
    """A wheel named as the course's is, whose only content is a requirement on ``needs``."""
    import zipfile

    name = "paged_kv_course-0.0.1"
    wheel = folder / f"{name}-py3-none-any.whl"
    files = {f"{name}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: paged-kv-course\n"
                                          f"Version: 0.0.1\nRequires-Dist: {needs}\n",
             f"{name}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\n"
                                       "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{name}.dist-info/RECORD"] = "".join(f"{path},,\n" for path in files) + \
        f"{name}.dist-info/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


def test_the_setup_cell_installs_through_the_pypi_mirror_the_learner_names(tmp_path):
    """Where PyPI is reached through a mirror (``PIP_INDEX_URL``, as the Chinese README and the
    cell's comment say), the cell's install asks that mirror, and only it, for what the course
    needs."""
    import http.server
    import threading

    asked: list[str] = []

    class Mirror(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the standard library's name)
            asked.append(self.path)
            self.send_error(404)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Mirror)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    folder = tmp_path / "notebooks"
    folder.mkdir()
    _course_wheel(folder, "kv-course-mirror-probe")
    cell = repository.setup_cell_of(CHAPTERS[0].source_in("zh_CN"))
    mirror = f"http://127.0.0.1:{server.server_port}/simple/"
    try:
        done = subprocess.run([str(venv / "bin" / "python"), "-c", cell], cwd=folder,
                              env={"PATH": "/usr/bin:/bin", "PIP_INDEX_URL": mirror,
                                   "PIP_NO_CACHE_DIR": "1", "PIP_CONFIG_FILE": "/dev/null"},
                              capture_output=True, text=True, timeout=300)
    finally:
        server.shutdown()
    assert "paged_kv_course-0.0.1" in done.stdout, done.stdout  # "installing from ..."
    assert "/simple/kv-course-mirror-probe/" in asked, (asked, done.stderr[-2000:])
