"""The learner edition: what a graded class's learners receive, built from the same source.

    python -m autograder edition DEST [--reveal 1-3] [--repository URL]

writes, in DEST, a folder ready to publish as the class's repository (``git add .``), and its
wheel in DEST/dist:

    course/, kernels/          the library, each answer of a chapter not revealed replaced by
                               a stub that says it is not part of this edition; edition.json
                               says which chapters the edition holds (``course doctor``)
    autograder/checks/         the visible checks of those chapters, with their recordings
                               (checks/recorded/): what they asked of the hidden checks,
                               answered when the edition was built (``autograder.private``)
    autograder/*.py            the kernel side: what a test cell imports (the guard, the
                               tripwires, the hints); nothing of the host or the build, no
                               hidden checks, no models or oracles
    exercises/                 the learner notebooks of every chapter whose notebook runs here
    pyproject.toml, README.md  for ``pip install`` and for the learners; .gitignore

There are no instructor notebooks in it. An instructor reveals chapters as deadlines pass
(``--reveal 1-3``: those answers stay whole), publishing again into the same folder (the class's
repository: what is not the edition's own, ``.git`` say, is kept). A chapter whose notebook
runs an answer of a chapter not revealed (its needs, ``autograder.builder.needs``) is left out,
and named. Each publish is a version of its own, ``<course version>.post<UTC time>``, later than
any before it; the notebooks' setup cells carry it and upgrade an older edition they find.
What the edition still ships of an unrevealed answer (``autograder.builder.copies``: code
written twice in the library) is measured on what was built, and named.

The open course's repository holds every answer, so an edition never names it: the
notebooks' setup cells install from the class's repository (``--repository URL``), or, with
none, only from the wheel the instructor hands out beside them.
"""

from __future__ import annotations

import ast
import importlib
import json
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import nbformat
import tomllib

from autograder import kernel_side
from autograder.answers import BEGIN, END, LIBRARY, functions, module_file, span
from autograder.builder.copies import Copy, owners, unrevealed
from autograder.builder.needs import needs
from autograder.builder.render import load, subjects
from autograder.builder.repository import PYPROJECT, url, write_setup_cell
from autograder.builder.translation import TRANSLATED
from autograder.host.chapters import EXERCISES, REPO, Chapter, chapters
from autograder.private import record
from autograder.table import PARTS

CHECKS = REPO / "autograder" / "checks"
_EDITION_PACKAGE = ('"""The course\'s checks, as this edition holds them: what a notebook\'s test '
                    'cells call,\nand what keeps a notebook\'s own code from switching them '
                    'off."""\n')


@dataclass
class Edition:
    root: Path
    revealed: list[int]
    repository: str  # the class's, or "" (the notebooks install only the wheel beside them)
    included: list[Chapter] = field(default_factory=list)
    refused: dict[str, list[int]] = field(default_factory=dict)  # chapter -> needs not revealed
    wheel: Path | None = None
    version: str = ""
    leaks: list[Copy] = field(default_factory=list)  # unrevealed answers it still ships


@dataclass(frozen=True)
class ClassEdition:
    """What a class's learners have installed: an edition's revealed chapters and version."""

    revealed: tuple[int, ...]
    version: str

    @classmethod
    def read(cls, folder: Path) -> ClassEdition:
        record = folder / "course" / "edition.json"
        if not record.is_file():
            raise ValueError(f"{folder} is not an edition (no course/edition.json): build one "
                             "with `python -m autograder edition`")
        data = json.loads(record.read_text())
        return cls(tuple(data["revealed"]), data.get("version", ""))


def stubbed(text: str, hide: dict[str, int]) -> str:
    """``text`` of a module with every answer region of the qualnames in ``hide`` (mapped to
    their chapter) replaced by a stub at the region's indentation."""
    lines = text.splitlines()
    regions = []
    for qualname, node in functions(ast.parse(text)):
        if qualname in hide:
            regions += _regions(lines, *span(lines, node), qualname, hide[qualname])
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


def _copy(path: Path, destination: Path, text: str | None = None) -> None:
    """Put the repository's file ``path`` at the same place under ``destination``; with
    ``text``, that text in its stead."""
    target = destination / path.relative_to(REPO)
    target.parent.mkdir(parents=True, exist_ok=True)
    if text is None:
        shutil.copyfile(path, target)
    else:
        target.write_text(text, encoding="utf-8")


def _copy_library(destination: Path, revealed: set[int]) -> None:
    hidden: dict[str, dict[str, int]] = {}
    for (module, qualname), chapter in owners().items():
        if chapter not in revealed:
            hidden.setdefault(module, {})[qualname] = chapter
    for package in LIBRARY:
        for path in sorted(module_file(package).parent.rglob("*")):
            relative = path.relative_to(REPO)
            if "__pycache__" in relative.parts or path.is_dir():
                continue
            module = ".".join(relative.with_suffix("").parts)
            if path.suffix == ".py" and module in hidden:
                _copy(path, destination, stubbed(path.read_text(encoding="utf-8"), hidden[module]))
            else:
                _copy(path, destination)


def recordings(destination: Path, included: list[Chapter] | None = None) -> list[Path]:
    """Run the visible checks of the ``included`` chapters (else every chapter's) on the
    course's own answers, writing down what they ask of the hidden checks; save the recordings
    under ``destination``."""

    def run() -> None:
        for chapter in included or chapters().values():
            checks = importlib.import_module(PARTS[chapter.name].checks)
            for grade_id, target in subjects(nbformat.read(chapter.source, 4)).items():
                getattr(checks, f"check_{grade_id}")(load(target))

    return record(run).save(destination)


def checks_modules(included: list[Chapter]) -> list[str]:
    """The checks modules the test cells of the ``included`` chapters import, with every checks
    module those import in turn (chapter 9's checks build on chapter 7's)."""
    wanted = ["autograder.checks"] + [PARTS[c.name].checks for c in included]
    found: list[str] = []
    while wanted:
        name = wanted.pop()
        if name in found:
            continue
        found.append(name)
        tree = ast.parse(module_file(name).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            wanted += [n for n in names if n.count(".") == 2 and n.startswith(
                "autograder.checks.") and (CHECKS / f"{n.rpartition('.')[2]}.py").exists()]
    return sorted(found)


def _copy_checks(destination: Path, included: list[Chapter]) -> None:
    # what of the grader runs in a learner's kernel: the kernel side (the host's and the
    # build's packages and the hidden checks stay out), its package's docstring its own (the
    # house's map names folders an edition does not hold)
    for path in kernel_side():
        _copy(path, destination, _EDITION_PACKAGE if path.name == "__init__.py" else None)
    for module in checks_modules(included):
        _copy(module_file(module), destination)
    # a chapter's hints are read with the catalogues of the chapters up to it (autograder.hints)
    last = max((int(c.number) for c in included), default=0)
    shipped = {"grader.po", *(f"ch{n:02d}.po" for n in range(1, last + 1))}
    for path in sorted((REPO / "autograder" / "locale").rglob("*.po")):
        if path.name in shipped:
            _copy(path, destination)
    recordings(destination / "autograder" / "checks" / "recorded", included)


def _exercises(destination: Path, included: list[Chapter], repository: str,
               version: str) -> None:
    for language in ("", *TRANSLATED):  # English at the top, each translation in its folder
        for chapter in included:
            notebook = Path(language, f"{chapter.name}.ipynb")
            write_setup_cell(EXERCISES / notebook, destination / "exercises" / notebook,
                             repository, language or None, version)


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
{urls}
[tool.setuptools.packages.find]
include = ["course*", "kernels*", "autograder*"]

[tool.setuptools.package-data]
kernels = ["results/*.json"]
course = ["edition.json", "locale/*/LC_MESSAGES/*.po"]
autograder = ["checks/recorded/*.pkl", "locale/*/LC_MESSAGES/*.po"]
"""


_GITIGNORE = """\
# what `pip wheel .` and `pip install .` leave behind; the wheel to hand out is dist/*.whl
build/
dist/
*.egg-info/
__pycache__/
.ipynb_checkpoints/
"""


def chapter_list(numbers: list[int]) -> str:
    """``[1]`` -> "chapter 1"; ``[1, 2, 4]`` -> "chapters 1, 2 and 4"."""
    if len(numbers) == 1:
        return f"chapter {numbers[0]}"
    return f"chapters {', '.join(map(str, numbers[:-1]))} and {numbers[-1]}"


def _readme(edition: Edition, wheel_name: str) -> str:
    held = [int(c.number) for c in edition.included]
    if edition.revealed:
        answers = (f"The course's answers to {chapter_list(edition.revealed)} are included; "
                   "every other TODO is yours to write.")
    else:
        answers = "No answer is included: every TODO is yours to write."
    install = ("`pip install .` in this folder (where there is no GPU, install a CPU build of "
               "torch first)")
    if edition.repository:
        setup = (f"{install}, or open a notebook on Colab: its first cell installs this "
                 f"edition from {edition.repository}.")
    else:
        setup = (f"{install}, or put the wheel `dist/{wheel_name}` in the folder of a notebook "
                 "(on Colab, upload both): its first cell installs the course from it.")
    paragraphs = [
        f"This edition holds {chapter_list(held) if held else 'no chapter'}. Each is a notebook "
        "in `exercises/` (in Chinese in `exercises/zh_CN/`): read it, fill in each TODO, run "
        "the test cell under it. The test cells are the visible tests; the hidden tests run "
        f"when your notebook is graded. {answers}",
        f"Set up: {setup} Then `python -m course doctor` checks the environment."]
    return "# Paged KV cache: the course, learner edition\n\n" + "".join(
        textwrap.fill(paragraph, 92) + "\n\n" for paragraph in paragraphs).rstrip() + "\n"


def _bare(address: str) -> str:
    return address.strip().rstrip("/").removesuffix(".git").lower()


def class_repository(repository: str | None) -> str:
    """``repository`` as a class's notebooks name it: ``""`` for none; the open course's own
    repository, which holds every answer, is refused."""
    if repository and _bare(repository) == _bare(url()):
        raise ValueError(f"{repository} is the open course's repository, which holds every "
                         "answer: name the class's own repository, or none")
    return repository or ""


# What an edition writes in its folder; everything else there (``.git``, say) is the class's.
OWN = ("course", "kernels", "autograder", "exercises", "dist", "pyproject.toml", "README.md",
       ".gitignore")


def _prepare(destination: Path) -> int:
    """Make ``destination`` ready for an edition: a new or empty folder, or an edition's, whose
    own files go; return the publish number of the edition there (0 for none)."""
    if not destination.exists() or not any(destination.iterdir()):
        return 0
    try:
        previous = ClassEdition.read(destination).version
    except ValueError:
        raise FileExistsError(f"{destination} holds files and no edition (course/edition.json): "
                              "choose a new folder, or the folder of the class's edition"
                              ) from None
    for name in OWN:
        path = destination / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    return int(previous.partition(".post")[2] or 0)


def publish_number(previous: int) -> int:
    """The number of a new publish: the UTC time as YYYYMMDDhhmmss, past ``previous``."""
    return max(int(datetime.now(timezone.utc).strftime("%Y%m%d%H%M%S")), previous + 1)


def build(destination: Path, revealed: set[int], repository: str | None = None,
          wheel: bool = True) -> Edition:
    """Build the learner edition in ``destination`` (a new or empty folder, or an earlier
    edition's, which it updates); its notebooks install from ``repository`` (the class's), or
    with none only from the wheel beside them."""
    destination = destination.resolve()
    repository = class_repository(repository)
    previous = _prepare(destination)
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    version = f"{project['version']}.post{publish_number(previous)}"
    edition = Edition(destination, sorted(revealed), repository, version=version)
    for chapter in chapters().values():
        missing = [n for n in needs(int(chapter.number)) if n not in revealed]
        if missing:
            edition.refused[chapter.name] = missing
        else:
            edition.included.append(chapter)
    _copy_library(destination, revealed)
    (destination / "course" / "edition.json").write_text(json.dumps(
        {"chapters": [c.name for c in edition.included], "revealed": edition.revealed,
         "version": version}, indent=1) + "\n")
    _copy_checks(destination, edition.included)
    _exercises(destination, edition.included, edition.repository, version)
    dependencies = "[\n" + "".join(f"    {json.dumps(d)},\n" for d in project["dependencies"]) + "]"
    urls = f'\n[project.urls]\nRepository = "{edition.repository}"\n' if edition.repository else ""
    (destination / "pyproject.toml").write_text(_PYPROJECT.format(
        version=version, dependencies=dependencies, urls=urls))
    (destination / ".gitignore").write_text(_GITIGNORE)
    (destination / "README.md").write_text(_readme(
        edition, f"paged_kv_course-{version}-py3-none-any.whl"))
    if wheel:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "--wheel-dir", str(destination / "dist"),
                        str(destination)], check=True, capture_output=True)
        for byproduct in [destination / "build", *destination.glob("*.egg-info")]:
            shutil.rmtree(byproduct, ignore_errors=True)
        edition.wheel = next((destination / "dist").glob("paged_kv_course-*.whl"))
    edition.leaks = unrevealed(destination, revealed)
    return edition
