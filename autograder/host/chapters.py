"""Which chapters exist, and which chapter a submitted notebook's content belongs to."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import nbformat

from course.language import ENGLISH, LANGUAGES

REPO = Path(__file__).resolve().parents[2]
SOLUTIONS = REPO / "solutions"
EXERCISES = REPO / "exercises"


class NotGradable(Exception):
    """A file that cannot be graded; the message is one line that says why."""


class GraderFailure(NotGradable):
    """The grader's own failure, not the learner's: its kernel could not start or died before
    any cell the learner wrote ran, or the grader raised. Such a hand-in is refused as any
    ``NotGradable`` is, and more: nothing of it is recorded (its earlier grade, graded
    notebook, feedback page and state stand), and the run exits ``GRADER_FAILED``. ``cell``:
    the grade id of the given cell the kernel died in ("" where it never started or the
    grader raised)."""

    def __init__(self, message: str, cell: str = "") -> None:
        super().__init__(message)
        self.cell = cell


GRADER_FAILED = 3  # the exit code of a run the grader's own failure kept from grading


@dataclass(frozen=True)
class Chapter:
    """One chapter: an nbgrader assignment with one notebook, both named ``NN_slug``."""

    name: str
    source: Path  # the instructor's notebook: solutions/, or a class's source/NN_slug/

    @property
    def number(self) -> str:
        return self.name[:2]

    def test_cells(self) -> list[tuple[str, float]]:
        """(grade id, points) of every graded test cell, in notebook order."""
        return test_cells_of(_cells(self.source))

    def grade_ids(self) -> frozenset[str]:
        return frozenset(filter(None, map(grade_id_of, _cells(self.source))))

    def source_in(self, language: str | None) -> Path:
        """The instructor's notebook in ``language`` (None or English: ``source``). A
        translation sits in a folder named after its language beside the English one in
        ``solutions/``; a class's chapter (``source/NN_slug/``, where nbgrader would release
        such a folder) has the package's translation while its source is the package's."""
        if language in (None, ENGLISH):
            return self.source
        beside = self.source.parent / language / self.source.name
        packaged = SOLUTIONS / language / self.source.name
        if beside.exists() or not packaged.exists():
            return beside
        return packaged if _same_text(self.source, SOLUTIONS / self.source.name) else beside

    def languages(self) -> list[str]:
        """The languages this chapter's notebook exists in (English first)."""
        return [ENGLISH, *(language for language in LANGUAGES[1:]
                           if self.source_in(language).exists())]


def _is_chapter_name(name: str) -> bool:
    number, _, slug = name.partition("_")
    return len(number) == 2 and number.isdigit() and bool(slug) and all(
        c.islower() or c.isdigit() or c == "_" for c in slug)


def chapters(solutions: Path = SOLUTIONS) -> dict[str, Chapter]:
    """Every chapter that has a notebook in ``solutions``, by name."""
    return {path.stem: Chapter(path.stem, path) for path in sorted(solutions.glob("*.ipynb"))
            if _is_chapter_name(path.stem)}


def class_chapters(course: Path) -> dict[str, Chapter]:
    """The chapters of an nbgrader course directory: ``source/NN_slug/NN_slug.ipynb``."""
    return {path.parent.name: Chapter(path.parent.name, path)
            for path in sorted((course / "source").glob("*/*.ipynb"))
            if _is_chapter_name(path.parent.name) and path.stem == path.parent.name}


# a class's copy names the class's repository (or none) in its setup cell, and is still the
# package's chapter (``autograder.builder.repository``)
_REPOSITORY = re.compile(r'REPOSITORY = \\"[^"\\]*\\"')


def _same_text(one: Path, other: Path) -> bool:
    """Whether two notebooks are the same chapter as written, whatever repository their setup
    cells install from."""
    def text(path: Path) -> str:
        return _REPOSITORY.sub("REPOSITORY", path.read_text(encoding="utf-8"))

    return other.exists() and text(one) == text(other)


@cache
def _cells(source: Path) -> list[nbformat.NotebookNode]:
    """The cells of an instructor's notebook, read once."""
    return nbformat.read(source, as_version=4).cells


def test_cells_of(cells: list[nbformat.NotebookNode]) -> list[tuple[str, float]]:
    """(grade id, points) of every graded test cell among ``cells``, in order."""
    graded = [cell.metadata["nbgrader"] for cell in cells
              if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade")]
    return [(meta["grade_id"], float(meta["points"])) for meta in graded]


def grade_id_of(cell: dict) -> str | None:
    """A cell's nbgrader grade id (a cell of a notebook as nbformat or JSON reads it), if any."""
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def load_submission(path: Path) -> nbformat.NotebookNode:
    """Read a learner's notebook, or raise ``NotGradable`` saying in one line what is wrong
    with it (not naming it: the reports do). In English: a file not read names no language."""
    if not path.exists():
        raise NotGradable("no such file")
    if not path.is_file():
        raise NotGradable("not a file")
    if path.suffix != ".ipynb":
        raise NotGradable("not a notebook (expected a .ipynb file)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise NotGradable(f"cannot be read ({exc})") from None
    if not text.strip():
        raise NotGradable("the file is empty")
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        raise NotGradable(
            f"corrupt notebook, not valid JSON (line {exc.lineno}, column {exc.colno}: "
            f"{exc.msg}); open it in Jupyter or restore it from a checkpoint"
        ) from None
    try:
        notebook = nbformat.reads(text, as_version=4)
    except Exception as exc:
        raise NotGradable(f"not a Jupyter notebook ({type(exc).__name__}: {exc})") from None
    if not isinstance(notebook.get("cells"), list):
        raise NotGradable("not a Jupyter notebook (it has no cells)")
    return notebook


def recognise(notebook: nbformat.NotebookNode, known: dict[str, Chapter]) -> Chapter | None:
    """The chapter whose cells the notebook holds: the one sharing the most grade ids that
    no other chapter has, else the one its metadata names; None when nothing tells."""
    held = set(map(grade_id_of, notebook.cells))
    counts = {}
    for name, chapter in known.items():
        others = set().union(*(c.grade_ids() for n, c in known.items() if n != name))
        counts[name] = len((chapter.grade_ids() - others) & held)
    best = max(counts.values(), default=0)
    leaders = [name for name, count in counts.items() if count == best]
    if best > 0 and len(leaders) == 1:
        return known[leaders[0]]
    claimed = notebook.get("metadata", {}).get("course", {}).get("chapter")
    return known.get(claimed)
