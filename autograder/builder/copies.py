"""Where an answer's code stands outside its own answer region: each answer written once.

An answer's *lines* are the lines of its region (between ``### BEGIN SOLUTION`` and
``### END SOLUTION``) with comments dropped and whitespace runs made one space, those of 20
characters or more: shorter ones (``return out``, ``m = m_new``) are any code's. An answer with
fewer than 4 such lines is too short to tell apart from code that merely does the same thing,
and is not measured. An answer is *copied* into a text when at least half of its lines, and at
least 4, appear among the text's own lines outside every answer region.

Two uses: the library, its kernels, its checks and the notebooks' given cells hold no copy of
any answer (code that needs an earlier chapter's answer calls it); and an edition ships no copy
of an answer it has not revealed, anywhere (``unrevealed``): its library, kernels, checks,
recordings, notebooks and wheel.
"""

from __future__ import annotations

import io
import json
import re
import tokenize
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from autograder.answers import (
    BEGIN,
    END,
    chapter_answers,
    definition,
    library_modules,
    module_file,
)
from autograder.host.chapters import REPO
from autograder.table import PARTS

MIN_LENGTH = 20  # characters of a normalised line that counts
MIN_LINES = 4  # lines an answer needs to be measured, and a copy to be one


@dataclass(frozen=True)
class Copy:
    answer: str  # "module.qualname"
    chapter: int  # whose TODO the answer is
    place: str  # the file (or "wheel:file", "notebook:cell") holding the copy
    found: int  # of the answer's lines, how many the place holds
    lines: int  # the answer's lines

    def __str__(self) -> str:
        return (f"chapter {self.chapter}'s {self.answer} in {self.place} "
                f"({self.found} of its {self.lines} lines)")


def _without_comments(code: str) -> str:
    """``code`` with its comments blanked (strings kept); as it is where it does not tokenize."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return re.sub(r"(?m)\s#.*$|^#.*$", "", code)
    lines = code.splitlines(keepends=True)
    for token in reversed(tokens):
        if token.type == tokenize.COMMENT:
            row, column = token.start
            line = lines[row - 1]
            lines[row - 1] = line[:column] + line[token.end[1]:]
    return "".join(lines)


def normalised(code: str) -> list[str]:
    """The lines of ``code`` that count: comments dropped, whitespace runs one space, 20
    characters or more."""
    lines = (" ".join(line.split()) for line in _without_comments(code).splitlines())
    return [line for line in lines if len(line) >= MIN_LENGTH]


def split_regions(code: str) -> tuple[list[str], str]:
    """(the text of each answer region, the text outside them) of ``code``."""
    inside, outside, region = [], [], None
    for line in code.splitlines():
        marker = line.strip()
        if marker == BEGIN:
            region = []
        elif marker == END and region is not None:
            inside.append("\n".join(region))
            region = None
        elif region is not None:
            region.append(line)
        else:
            outside.append(line)
    return inside, "\n".join(outside)


@cache
def owners() -> dict[tuple[str, str], int]:
    """(module, qualname) of each answer in the library -> the chapter whose TODO it is."""
    return {answer: int(slug[:2]) for slug in PARTS for answer in chapter_answers(slug)}


@cache
def answer_lines() -> dict[tuple[str, str], tuple[str, ...]]:
    """(module, qualname) -> the answer's lines, for every answer with enough to measure."""
    found = {}
    for module, qualname in owners():
        regions, _ = split_regions(definition(module, qualname))
        lines = tuple(dict.fromkeys(line for region in regions for line in normalised(region)))
        if len(lines) >= MIN_LINES:
            found[module, qualname] = lines
    return found


def copies_in(place: str, text: str, skip: Iterable[tuple[str, str]] = (),
              regions: bool = False) -> list[Copy]:
    """The answers (but those in ``skip``) copied into ``text``: outside its answer regions, or
    anywhere in it with ``regions`` (what an edition ships, its revealed answers included)."""
    held = set(normalised(text if regions else split_regions(text)[1]))
    skipped = set(skip)
    found = []
    for (module, qualname), lines in answer_lines().items():
        if (module, qualname) in skipped:
            continue
        count = sum(line in held for line in lines)
        if count >= MIN_LINES and 2 * count >= len(lines):
            found.append(Copy(f"{module}.{qualname}", owners()[module, qualname], place, count,
                              len(lines)))
    return found


def notebook_code(path: Path) -> str:
    """The code cells of the notebook at ``path``, one text."""
    cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    return "\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                     for c in cells if c.get("cell_type") == "code")


def library_texts() -> Iterator[tuple[str, str]]:
    """(place, text) of everything that must hold no copy: the library and its kernels, the
    checks (visible and hidden) and every notebook's cells, the given ones of the solutions."""
    for module in library_modules():
        path = module_file(module)
        yield str(path.relative_to(REPO)), path.read_text(encoding="utf-8")
    for folder in ("autograder/checks", "autograder/hidden"):
        for path in sorted((REPO / folder).glob("*.py")):
            yield str(path.relative_to(REPO)), path.read_text(encoding="utf-8")
    for folder in ("solutions", "exercises"):
        for path in sorted((REPO / folder).rglob("*.ipynb")):
            yield str(path.relative_to(REPO)), notebook_code(path)


def copies_in_library() -> list[Copy]:
    """Every answer copied anywhere in the course outside its own region."""
    return [copy for place, text in library_texts() for copy in copies_in(place, text)]


def edition_texts(root: Path) -> Iterator[tuple[str, str]]:
    """(place, text) of every file an edition at ``root`` ships, its wheels' files too."""
    for path in sorted(root.rglob("*")):
        if not path.is_file() or ".git" in path.relative_to(root).parts:
            continue
        place = str(path.relative_to(root))
        if path.suffix == ".ipynb":
            yield place, notebook_code(path)
        elif path.suffix == ".whl":
            with zipfile.ZipFile(path) as wheel:
                for name in wheel.namelist():
                    yield f"{place}:{name}", wheel.read(name).decode("utf-8", "replace")
        else:
            yield place, path.read_bytes().decode("utf-8", "replace")


def _answers_of(chapters: set[int]) -> set[tuple[str, str]]:
    return {answer for answer, chapter in owners().items() if chapter in chapters}


def unrevealed(root: Path, revealed: Iterable[int]) -> list[Copy]:
    """The answers of chapters not in ``revealed`` that the edition at ``root`` ships."""
    skip = _answers_of(set(revealed))
    return [copy for place, text in edition_texts(root)
            for copy in copies_in(place, text, skip, regions=True)]


def library_as_shipped(revealed: Iterable[int]) -> Iterator[tuple[str, str]]:
    """(place, text) of the library and kernels as an edition revealing ``revealed`` ships
    them: every other chapter's answers stubbed."""
    from autograder.builder.edition import stubbed

    shown = set(revealed)
    for module in library_modules():
        path = module_file(module)
        hide = {qualname: chapter for (owner, qualname), chapter in owners().items()
                if owner == module and chapter not in shown}
        yield str(path.relative_to(REPO)), stubbed(path.read_text(encoding="utf-8"), hide)


def revealed_too(revealed: Iterable[int]) -> list[Copy]:
    """The answers of chapters not in ``revealed`` that the revealed answers show: what an
    edition revealing ``revealed`` would ship of them, found without building it."""
    shown = set(revealed)
    return [copy for place, text in library_as_shipped(shown)
            for copy in copies_in(place, text, _answers_of(shown), regions=True)]


def copies_in_answers() -> list[Copy]:
    """Every answer that another chapter's answer region writes again (in that region's file):
    revealing the later chapter shows the earlier one's answer, and the other way round."""
    found = []
    for (module, qualname), chapter in owners().items():
        regions, _ = split_regions(definition(module, qualname))
        place = str(module_file(module).relative_to(REPO))
        found += copies_in(place, "\n".join(regions), _answers_of({chapter}), regions=True)
    return found
