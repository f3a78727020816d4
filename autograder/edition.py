"""The learner edition: what a graded class's learners receive, built from the same source.

    python -m autograder edition DEST [--reveal 1-3] [--repository URL]

writes, in DEST, a folder ready to publish as the class's repository, and its wheel in
DEST/dist:

    course/, kernels/          the library, each answer of a chapter not revealed replaced by
                               a stub that says it is not part of this edition
    autograder/checks/         the visible checks, with their recordings (checks/recorded/):
                               what they asked of the hidden checks, answered when the edition
                               was built (``autograder.private``)
    autograder/guard.py ...    what a test cell imports; nothing of the grader, no hidden
                               checks, no models or oracles
    exercises/                 the learner notebooks of every chapter whose notebook runs here,
                               their setup cells installing from the class's repository
    pyproject.toml, README.md  for ``pip install`` and for the learners

There are no instructor notebooks in it. An instructor reveals chapters as deadlines pass
(``--reveal 1-3``: those answers stay whole). A chapter whose notebook runs an answer of a
chapter not revealed (``needs`` in ``autograder.table``) is left out, and named.
"""

from __future__ import annotations

import ast
import importlib
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from autograder.chapters import EXERCISES, REPO, Chapter, chapters
from autograder.private import record
from autograder.render import (
    BEGIN,
    END,
    LIBRARY,
    chapter_answers,
    load,
    module_file,
    span,
    subjects,
)
from autograder.repository import set_setup_cell, url
from autograder.table import PARTS
from autograder.translation import TRANSLATED

# What of the grader a test cell needs; everything else of autograder/ stays out.
SHIPPED = ["autograder/__init__.py", "autograder/guard.py", "autograder/private.py",
           "autograder/borrowing.py", "autograder/table.py", "autograder/hints.py"]


@dataclass
class Edition:
    root: Path
    revealed: list[int]
    included: list[Chapter] = field(default_factory=list)
    refused: dict[str, list[int]] = field(default_factory=dict)  # chapter -> needs not revealed
    wheel: Path | None = None


def owners() -> dict[tuple[str, str], int]:
    """(module, qualname) of each answer in the library -> the chapter whose TODO it is."""
    return {answer: int(slug[:2]) for slug in PARTS for answer in chapter_answers(slug)}


def stubbed(module: str, text: str, hide: dict[str, int]) -> str:
    """``text`` of ``module`` with every answer region of the qualnames in ``hide`` (mapped to
    their chapter) replaced by a stub at the region's indentation."""
    lines = text.splitlines()
    tree = ast.parse(text)
    regions = []
    for node in tree.body:
        members = node.body if isinstance(node, ast.ClassDef) else [node]
        prefix = f"{node.name}." if isinstance(node, ast.ClassDef) else ""
        for member in members:
            qualname = prefix + getattr(member, "name", "")
            if isinstance(member, ast.FunctionDef) and qualname in hide:
                start, end = span(lines, member)
                regions += _regions(lines, start, end, qualname, hide[qualname])
    for first, last, stub in sorted(regions, reverse=True):
        lines[first:last + 1] = [stub]
    return "\n".join(lines) + "\n"


def _regions(lines: list[str], start: int, end: int, qualname: str, chapter: int
             ) -> list[tuple[int, int, str]]:
    found, begin = [], None
    for index in range(start, end):
        marker = lines[index].strip()
        if marker == BEGIN:
            begin = index
        elif marker == END and begin is not None:
            indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
            found.append((begin, index, f'{indent}raise NotImplementedError("The course\'s '
                                        f'{qualname} is not part of this edition: it is your '
                                        f'TODO in chapter {chapter}.")'))
            begin = None
    return found


def _copy_library(destination: Path, revealed: set[int]) -> None:
    hidden: dict[str, dict[str, int]] = {}
    for (module, qualname), chapter in owners().items():
        if chapter not in revealed:
            hidden.setdefault(module, {})[qualname] = chapter
    for package in LIBRARY:
        source = module_file(package).parent
        for path in sorted(source.rglob("*")):
            relative = path.relative_to(source.parent)
            if "__pycache__" in relative.parts or path.is_dir():
                continue
            target = destination / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            module = ".".join(relative.with_suffix("").parts)
            if path.suffix == ".py" and module in hidden:
                target.write_text(stubbed(module, path.read_text(encoding="utf-8"),
                                          hidden[module]), encoding="utf-8")
            else:
                shutil.copyfile(path, target)


def recordings(destination: Path) -> list[Path]:
    """Run every chapter's visible checks on the course's own answers, writing down what they
    ask of the hidden checks; save the recordings under ``destination``."""

    def run() -> None:
        for chapter in chapters().values():
            checks = importlib.import_module(PARTS[chapter.name].checks)
            for grade_id, target in subjects(nbformat.read(chapter.source, 4)).items():
                getattr(checks, f"check_{grade_id}")(load(target))

    return record(run).save(destination)


def _copy_checks(destination: Path) -> None:
    for name in SHIPPED:
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / name, target)
    checks = REPO / "autograder" / "checks"
    (destination / "autograder" / "checks").mkdir(parents=True)
    for path in sorted(checks.glob("*.py")):
        shutil.copyfile(path, destination / "autograder" / "checks" / path.name)
    shutil.copytree(REPO / "autograder" / "locale", destination / "autograder" / "locale")
    recordings(destination / "autograder" / "checks" / "recorded")


def _exercises(destination: Path, included: list[Chapter], repository: str) -> None:
    for language in ("", *TRANSLATED):  # English at the top, each translation in its folder
        folder = destination / "exercises" / language
        folder.mkdir(parents=True, exist_ok=True)
        for chapter in included:
            notebook = nbformat.read(EXERCISES / language / f"{chapter.name}.ipynb",
                                     as_version=4)
            set_setup_cell(notebook, repository, language or None)
            nbformat.write(notebook, folder / f"{chapter.name}.ipynb")


_PYPROJECT = """\
[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "paged-kv-course"
version = "{version}"
description = "A graded course on KV-cache memory management: the learner edition."
readme = "README.md"
requires-python = ">=3.10"
dependencies = {dependencies}

[project.urls]
Repository = "{repository}"

[tool.setuptools.packages.find]
include = ["course*", "kernels*", "autograder*"]

[tool.setuptools.package-data]
kernels = ["results/*.json"]
course = ["locale/*/LC_MESSAGES/*.po"]
autograder = ["checks/recorded/*.pkl", "locale/*/LC_MESSAGES/*.po"]
"""

_README = """\
# Paged KV cache: the course, learner edition

Chapters in this edition: {chapters}. Each is a notebook in `exercises/`: read, fill in each
TODO, run the test cell under it. The test cells here are the visible tests; the hidden tests
run when your notebook is graded. Answers to chapters {revealed} are included; the others are
yours to write.

Set up: `pip install .` (with a CPU build of torch first where there is no GPU), or open a
notebook on Colab: its first cell installs this edition from {repository}. Then `python -m
course doctor` checks the environment.
"""


def build(destination: Path, revealed: set[int], repository: str | None = None,
          wheel: bool = True) -> Edition:
    """Build the learner edition in ``destination`` (which must not exist yet)."""
    import tomllib

    repository = repository or url()
    destination = destination.resolve()
    if destination.exists():
        raise FileExistsError(f"{destination} exists: choose a new folder")
    edition = Edition(destination, sorted(revealed))
    for chapter in chapters().values():
        missing = [n for n in PARTS[chapter.name].needs if n not in revealed]
        if missing:
            edition.refused[chapter.name] = missing
        else:
            edition.included.append(chapter)
    _copy_library(destination, revealed)
    _copy_checks(destination)
    _exercises(destination, edition.included, repository)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    dependencies = "[\n" + "".join(f"    {json.dumps(d)},\n" for d in project["dependencies"]) + "]"
    (destination / "pyproject.toml").write_text(_PYPROJECT.format(
        version=project["version"], dependencies=dependencies,
        repository=repository))
    names = ", ".join(str(int(c.number)) for c in edition.included) or "none"
    (destination / "README.md").write_text(_README.format(
        chapters=names, revealed=", ".join(map(str, sorted(revealed))) or "none",
        repository=repository))
    if wheel:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "--wheel-dir", str(destination / "dist"),
                        str(destination)], check=True, capture_output=True)
        shutil.rmtree(destination / "build", ignore_errors=True)
        edition.wheel = next((destination / "dist").glob("paged_kv_course-*.whl"))
    return edition
