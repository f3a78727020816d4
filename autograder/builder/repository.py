"""Where the course is published: one URL, from which Colab installs it and opens its chapters.

The URL is ``[project.urls] Repository`` in pyproject.toml. Every notebook's first cell carries
it (a Colab session starts with nothing installed, so the cell cannot read it from the
package), and the README's "Open in Colab" links are built from it. ``python -m autograder
repository URL`` sets it and rewrites both; tests/test_colab.py checks they agree.

What a class's learners get (``edition``, ``course-dir``) names the class's own repository, or
none: the open repository holds every answer. With none (``REPOSITORY = ""``), the cell
installs the course only from what the instructor ships beside the notebook (the edition's
wheel) and otherwise stops, saying so.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

import nbformat
import tomllib

from autograder.host.chapters import REPO, Chapter

PYPROJECT = REPO / "pyproject.toml"
READMES = (REPO / "README.md", REPO / "README.zh-CN.md")  # each language's front door
BRANCH = "main"

# The cell's first line is all a learner sees of it: Colab shows a form's title in place of
# its code (``cellView: form``), JupyterLab and VS Code fold the code away
# (``jupyter.source_hidden``); a click shows the plumbing.
SETUP_METADATA = {"cellView": "form", "jupyter": {"source_hidden": True}}

_SETUP_CELL = '''\
#@title Set up the course (run this cell first)
# Where the course package is missing (a fresh Colab session), or is a class edition older
# than the one this notebook was released with, this cell installs it: from
# $KV_COURSE_SOURCE if set, else a course wheel next to this notebook, else the checkout this
# notebook sits in, else the repository named below (if one is). Then it picks GPU mode or
# Triton's CPU interpreter and says which. Behind a PyPI mirror, name it before running this
# cell (pip reads it), e.g.
# %env PIP_INDEX_URL=https://mirrors.aliyun.com/pypi/simple/
import glob
import importlib.util
import json
import os
import subprocess
import sys

REPOSITORY = "{url}"
EDITION = "{edition}"

found = importlib.util.find_spec("course")
record = os.path.join(os.path.dirname(found.origin), "edition.json") if found else ""
installed = ""  # the version of the class edition found, if the course found is one
if os.path.exists(record):
    with open(record) as file:
        installed = json.load(file).get("version", "")
stale = ".post" in EDITION and ".post" in installed and (
    int(installed.partition(".post")[2]) < int(EDITION.partition(".post")[2]))
if stale and "course" in sys.modules:
    print(f"This notebook needs the course's edition {{EDITION}}; this kernel has {{installed}} "
          "loaded: restart the kernel, then run this cell again.")
    raise SystemExit(1)
if stale or found is None:
    wheels = sorted(glob.glob("paged_kv_course-*.whl"))
    source = os.environ.get("KV_COURSE_SOURCE") or (wheels[-1] if wheels else None)
    if source is None and os.path.exists("../pyproject.toml"):
        source = ".."
    if source is None and REPOSITORY:
        source = f"git+{{REPOSITORY}}"
    if source is None:
        print("The course is not installed: put the wheel you were given next to this notebook.")
        raise SystemExit(1)
    print(f"Installing the course from {{source}} ...")
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--upgrade", source])
    importlib.invalidate_caches()

import course  # noqa: E402  (only importable after the install above)

runtime = course.setup()'''


def url() -> str:
    """The repository URL recorded in pyproject.toml."""
    return tomllib.loads(PYPROJECT.read_text())["project"]["urls"]["Repository"]


def setup_cell(repository: str, edition: str = "") -> str:
    """The source of every notebook's first code cell; ``""`` for no repository, and for no
    edition (the open course's notebooks, which any installed course runs)."""
    return _SETUP_CELL.format(url=repository, edition=edition)


def _first_code_cell(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    return next(c for c in notebook.cells if c.cell_type == "code")


def write_setup_cell(source: Path, target: Path, repository: str,
                     language: str | None = None, edition: str = "") -> None:
    """Write the notebook at ``source`` to ``target`` (making its folder), its first code cell
    the setup cell, installing from ``repository`` and upgrading a class edition older than
    ``edition``, its plumbing folded away; in a translated notebook (``language``) only those
    two lines change."""
    notebook = nbformat.read(source, as_version=4)
    first = _first_code_cell(notebook)
    if language is None:
        first.source = setup_cell(repository, edition)
    else:
        for name, value in (("REPOSITORY", repository), ("EDITION", edition)):
            first.source, found = re.subn(rf'(?m)^{name} = ".*"$', f'{name} = "{value}"',
                                          first.source)
            if found != 1:
                raise ValueError(f"{source}: its setup cell has no `{name} = ...` line")
    first.metadata.update(SETUP_METADATA)
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, target)


def colab_link(repository: str, notebook: str) -> str:
    """The Colab address that opens ``notebook`` (a path in the repository) from GitHub."""
    parts = urlparse(repository)
    if parts.netloc != "github.com":
        raise ValueError(f"Colab opens notebooks from GitHub; {repository} is not on github.com")
    owner_and_name = parts.path.strip("/").removesuffix(".git")
    return f"https://colab.research.google.com/github/{owner_and_name}/blob/{BRANCH}/{notebook}"


def readme_with_links(readme: str, repository: str) -> str:
    """``readme`` with each chapter row's Colab link pointing at ``repository``."""
    def relink(match: re.Match) -> str:
        return f"[Colab]({colab_link(repository, match.group(2))})"

    return re.sub(r"\[Colab\]\((https://colab\.research\.google\.com/github/[^)]*?/blob/[^/]+/)"
                  r"(exercises/[^)]+\.ipynb)\)", relink, readme)


def set_url(repository: str, chapters: list[Chapter]) -> None:
    """Record ``repository`` in pyproject.toml, every solution's setup cell and the READMEs."""
    colab_link(repository, "check")  # refuse a URL Colab cannot open, before changing anything
    text = PYPROJECT.read_text()
    text, found = re.subn(r'(?m)^Repository = ".*"$', f'Repository = "{repository}"', text)
    if found != 1:
        raise ValueError("pyproject.toml has no `Repository = ...` line under [project.urls]")
    PYPROJECT.write_text(text)
    for chapter in chapters:
        write_setup_cell(chapter.source, chapter.source, repository)
    for readme in READMES:
        readme.write_text(readme_with_links(readme.read_text(encoding="utf-8"), repository),
                          encoding="utf-8")


def setup_cell_of(path: Path) -> str:
    """The first code cell's source of the notebook at ``path``."""
    return _first_code_cell(nbformat.read(path, as_version=4)).source
