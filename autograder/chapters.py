"""Which chapters exist, and which chapter a submitted notebook belongs to."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = REPO / "solutions"
EXERCISES = REPO / "exercises"
_NAME = re.compile(r"^(\d\d)_[a-z0-9_]+$")


class NotGradable(Exception):
    """A file that cannot be graded; the message is one line that says why."""


@dataclass(frozen=True)
class Chapter:
    """One chapter: an nbgrader assignment with one notebook, both named ``NN_slug``."""

    name: str
    source: Path  # the instructor's notebook in solutions/

    @property
    def number(self) -> str:
        return self.name[:2]


def chapters(solutions: Path = SOLUTIONS) -> dict[str, Chapter]:
    """Every chapter that has a notebook in ``solutions``, by name."""
    found = {}
    for path in sorted(solutions.glob("*.ipynb")):
        if _NAME.match(path.stem):
            found[path.stem] = Chapter(path.stem, path)
    return found


def load_submission(path: Path) -> nbformat.NotebookNode:
    """Read a learner's notebook, or raise ``NotGradable`` saying in one line what is wrong."""
    if not path.exists():
        raise NotGradable(f"{path}: no such file")
    if not path.is_file():
        raise NotGradable(f"{path}: not a file")
    if path.suffix != ".ipynb":
        raise NotGradable(f"{path}: not a notebook (expected a .ipynb file)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise NotGradable(f"{path}: cannot be read ({exc})") from None
    if not text.strip():
        raise NotGradable(f"{path}: the file is empty")
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        raise NotGradable(
            f"{path}: corrupt notebook, not valid JSON (line {exc.lineno}, column {exc.colno}: "
            f"{exc.msg}); open it in Jupyter or restore it from a checkpoint"
        ) from None
    try:
        notebook = nbformat.reads(text, as_version=4)
    except Exception as exc:
        raise NotGradable(f"{path}: not a Jupyter notebook ({type(exc).__name__}: {exc})") from None
    if not isinstance(notebook.get("cells"), list):
        raise NotGradable(f"{path}: not a Jupyter notebook (it has no cells)")
    return notebook


def recognise(path: Path, notebook: nbformat.NotebookNode, known: dict[str, Chapter]) -> Chapter:
    """The chapter a notebook belongs to: from its metadata, else from its file name."""
    claimed = notebook.metadata.get("course", {}).get("chapter")
    if claimed in known:
        return known[claimed]
    if path.stem in known:
        return known[path.stem]
    prefix = path.stem[:3]
    by_number = [c for c in known.values() if prefix == c.number + "_"]
    if len(by_number) == 1:
        return by_number[0]
    names = ", ".join(known) or "none"
    raise NotGradable(
        f"{path}: unknown chapter; name the file after its chapter (one of: {names})"
    )
