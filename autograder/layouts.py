"""Finding a class's submissions and who handed each one in.

A learner's id is read from where the file sits, character for character, never guessed by a
pattern: a chapter's slug (``01_kv_cache_sizing``) is matched as a known suffix of a name, and
whatever stands before it is the learner's. Three layouts, found at any depth of the folder
or zip (so a zip that wraps everything in one top-level folder reads the same):

    <anything>/<learner>/<NN_slug>/<any>.ipynb    nbgrader's submitted/ (timestamp.txt beside it)
    <anything>/<learner>_<NN_slug>.ipynb          a platform's flat download ("-" works too)
    <anything>/<learner>/<NN_slug>.ipynb          one folder per learner

A folder that is an nbgrader course directory (it holds ``submitted/`` beside ``source/`` or
``nbgrader_config.py``) is read from its ``submitted/`` only, never from ``source/``,
``release/``, ``autograded/`` or ``feedback/``.

Two files for the same learner and chapter, and files whose path names no learner or no
chapter, are problems: each gets a line naming its file, and none is graded silently.
"""

from __future__ import annotations

import datetime as dt
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SEPARATORS = ("_", "-")


@dataclass
class Found:
    """A file found for a learner and chapter (as its place names them), and when it came."""

    path: Path  # where it can be read now (inside a temporary folder for a zip)
    origin: str  # what to call it in reports: the path given, or ``archive.zip:entry``
    learner: str
    chapter: str  # the chapter its location names (the content may say otherwise)
    timestamp: dt.datetime | None = None  # UTC, naive, as nbgrader stores it


@dataclass
class Problem:
    """A file that cannot be graded, and why; ``learner`` and ``chapter`` where known."""

    origin: str
    message: str
    learner: str = ""
    chapter: str = ""
    timestamp: dt.datetime | None = None


def split_name(file_name: str, slugs: Iterable[str]) -> tuple[str, str] | None:
    """``(learner, slug)`` for ``<learner><sep><slug>.ipynb`` or ``("", slug)`` for
    ``<slug>.ipynb``; None when the name ends in no known chapter. Longer slugs are tried
    first, so one slug that ends another cannot steal its files."""
    if not file_name.endswith(".ipynb"):
        return None
    stem = file_name[: -len(".ipynb")]
    for slug in sorted(slugs, key=len, reverse=True):
        if stem == slug:
            return "", slug
        for separator in SEPARATORS:
            if stem.endswith(separator + slug) and len(stem) > len(slug) + 1:
                return stem[: -len(slug) - 1], slug
    return None


def course_directory(folder: Path) -> Path | None:
    """The nbgrader course directory that ``folder`` is, or whose ``submitted/`` it is."""
    folder = folder.resolve()
    for candidate in (folder, folder.parent):
        if (candidate / "submitted").is_dir() and (
                (candidate / "source").is_dir() or (candidate / "nbgrader_config.py").exists()):
            if candidate == folder or folder.name == "submitted":
                return candidate
    return None


def collect(folder: Path, slugs: Iterable[str], origin_of=None,
            time_of=None) -> tuple[list[Found], list[Problem]]:
    """Every submission under ``folder``, in a stable order, and the problems found.

    ``origin_of(path)`` names a file in reports (default: its path); ``time_of(path)`` is
    when it was handed in, where no ``timestamp.txt`` says (default: its modification time).
    """
    slugs = list(slugs)
    origin_of = origin_of or str
    time_of = time_of or _modified
    course = course_directory(folder)
    root = course / "submitted" if course is not None else folder
    found: list[Found] = []
    problems: list[Problem] = []
    for path in sorted(root.rglob("*.ipynb")):
        parts = path.relative_to(root).parts
        if any(part.startswith(".") for part in parts):
            continue  # .ipynb_checkpoints and the like
        located = _locate(parts, slugs)
        if isinstance(located, str):
            problems.append(Problem(origin_of(path), located))
            continue
        learner, chapter = located
        stamp = _nbgrader_timestamp(path.parent) if len(parts) >= 3 and \
            parts[-2] == chapter else None
        found.append(Found(path, origin_of(path), learner, chapter,
                                stamp or time_of(path)))
    return _without_duplicates(found, problems)


def _locate(parts: tuple[str, ...], slugs: list[str]) -> tuple[str, str] | str:
    """(learner, chapter) from a path relative to the class folder, or why not."""
    if len(parts) >= 3 and parts[-2] in slugs:
        return parts[-3], parts[-2]
    named = split_name(parts[-1], slugs)
    if named is not None and named[0]:
        return named
    if named is not None and len(parts) >= 2:
        return parts[-2], named[1]
    if named is not None:
        return (f"{parts[-1]} names its chapter but no learner: put it in a folder named after "
                "the learner, or name it <learner>_<NN_slug>.ipynb")
    return (f"{'/'.join(parts)} names no chapter: expected <learner>/<NN_slug>.ipynb, "
            f"<learner>_<NN_slug>.ipynb or <learner>/<NN_slug>/<NN_slug>.ipynb, with NN_slug "
            f"one of {', '.join(slugs)}")


def _without_duplicates(found: list[Found], problems: list[Problem]
                        ) -> tuple[list[Found], list[Problem]]:
    groups: dict[tuple[str, str], list[Found]] = {}
    for submission in found:
        groups.setdefault((submission.learner, submission.chapter), []).append(submission)
    kept = []
    for (learner, chapter), group in groups.items():
        if len(group) == 1:
            kept.append(group[0])
            continue
        names = " and ".join(s.origin for s in group)
        for submission in group:
            problems.append(Problem(
                submission.origin, f"{len(group)} files are {learner}'s {chapter} ({names}); "
                "none of them was graded: keep one and grade again", learner, chapter,
                submission.timestamp))
    return kept, problems


def _nbgrader_timestamp(folder: Path) -> dt.datetime | None:
    """nbgrader's ``timestamp.txt`` beside a submitted notebook, as naive UTC."""
    stamp = folder / "timestamp.txt"
    if not stamp.is_file():
        return None
    from nbgrader.utils import parse_utc

    try:
        return parse_utc(stamp.read_text().strip())
    except (ValueError, OverflowError):
        return None


def _modified(path: Path) -> dt.datetime:
    return dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc).replace(tzinfo=None)


def unpack(archive: Path, destination: Path) -> tuple[dict[Path, str], dict[Path, dt.datetime]]:
    """Extract a zip; return, for each extracted file, its entry's name and its time (the
    archive stores local times without a zone: they are taken as UTC)."""
    origins, times = {}, {}
    with zipfile.ZipFile(archive) as bundle:
        for info in bundle.infolist():
            if info.is_dir():
                continue
            extracted = Path(bundle.extract(info, destination)).resolve()
            origins[extracted] = f"{archive.name}:{info.filename}"
            times[extracted] = dt.datetime(*info.date_time)
    return origins, times
