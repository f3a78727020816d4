"""Finding a class's submissions and who handed each one in.

A learner's id is read from where the file sits, character for character, never guessed by a
pattern: a chapter's slug (``01_kv_cache_sizing``) is matched as a known suffix of a name, and
whatever stands before it is the learner's. These layouts, found at any depth of the folder
or zip (so a zip that wraps everything in one top-level folder reads the same):

    <anything>/<learner>/<NN_slug>/<any>.ipynb    nbgrader's submitted/ (timestamp.txt beside it)
    <name>_[LATE_]<userid>_<upload id>_<file>     Canvas's download: the learner is <userid>
    <Full Name>_<id>_assignsubmission_file_/<file>  Moodle's download: the learner is <id>
    <anything>/<learner>_<NN_slug>.ipynb          a platform's flat download ("-" works too)
    <anything>/<learner>/<NN_slug>.ipynb          one folder per learner

Canvas and Moodle name a learner by the platform's stable id, whatever the upload (Canvas's
names are read so when every loose file of the download has their form): a late
upload (``LATE_``) or a renamed second one (``01_kv_cache_sizing-1.ipynb``) is the same
learner's chapter. A roster (``roster``: the platform's id -> the class's learner id) maps
those ids, or a flat name's learner part, to the ids the class grades under; with a roster,
a file whose id is not on it is a problem, never a new learner.

A folder that is an nbgrader course directory (it holds ``submitted/`` beside ``source/`` or
``nbgrader_config.py``) is read from its ``submitted/`` only, never from ``source/``,
``release/``, ``autograded/`` or ``feedback/``.

Two files for the same learner and chapter, files whose path names no learner or no chapter,
and a hand-in folder with no notebook in it are problems: each gets a line naming its file,
and none is graded silently. In a hand-in folder (``<learner>/<NN_slug>/``) the chapter's own
notebook, ``NN_slug.ipynb``, is the one graded, as nbgrader grades it; any other notebook
there (an ``Untitled.ipynb`` that ``nbgrader submit`` copied along) is listed as ignored.
"""

from __future__ import annotations

import csv
import datetime as dt
import difflib
import re
import zipfile
from collections.abc import Iterable
from pathlib import Path

from autograder.host.submission import Submission

SEPARATORS = ("_", "-")
CANVAS = re.compile(r"^[a-z]+_(?:LATE_)?(?P<learner>\d+)_\d+_(?P<file>.+\.ipynb)$")
MOODLE = re.compile(r"^.+_(?P<learner>\d+)_assign(?:submission|feedback)_\w+_?$")


def _refused(origin: str, message: str, learner: str = "", chapter: str = "",
             timestamp: dt.datetime | None = None, ignored: bool = False) -> Submission:
    """A file that is not graded, with why (``ignored``: not a problem, a file nbgrader would
    skip too)."""
    submission = Submission(origin, learner, chapter, timestamp, ignored=ignored)
    submission.refuse(message)
    return submission


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


def collect(folder: Path, slugs: Iterable[str], origin_of=None, time_of=None,
            roster: dict[str, str] | None = None) -> list[Submission]:
    """Every submission under ``folder``, in a stable order: those to grade, then those
    refused here (each with its reason, ``Submission.refuse``).

    ``origin_of(path)`` names a file in reports (default: its path); ``time_of(path)`` is
    when it was handed in, where no ``timestamp.txt`` says (default: its modification time);
    ``roster`` maps the ids the files name to the class's learner ids.
    """
    slugs = list(slugs)
    origin_of = origin_of or str
    time_of = time_of or _modified
    course = course_directory(folder)
    root = course / "submitted" if course is not None else folder
    found: list[Submission] = []
    problems: list[Submission] = []
    if course is not None:
        problems += _empty_hand_ins(root, slugs)
    notebooks = {path: path.relative_to(root).parts for path in sorted(root.rglob("*.ipynb"))}
    notebooks = {path: parts for path, parts in notebooks.items()
                 if not any(part.startswith(".") for part in parts)}  # not checkpoints
    loose = [parts[-1] for parts in notebooks.values() if not _in_a_folder_layout(parts, slugs)]
    canvas = bool(loose) and all(CANVAS.match(name) for name in loose)
    for path, parts in notebooks.items():
        located = _locate(parts, slugs, canvas)
        if isinstance(located, str):
            problems.append(_refused(origin_of(path), located))
            continue
        learner, chapter = located
        if roster is not None:
            if learner not in roster:
                problems.append(_refused(origin_of(path), f"{learner!r} is not on the class's "
                                         "roster: not graded (add them to the roster, or hand "
                                         "the file back)", chapter=chapter))
                continue
            learner = roster[learner]
        stamp = _nbgrader_timestamp(path.parent) if _in_a_hand_in(parts, slugs) else None
        found.append(Submission(origin_of(path), learner, chapter, stamp or time_of(path),
                                path))
    return _without_duplicates(found, problems)


def _in_a_hand_in(parts: tuple[str, ...], slugs: list[str]) -> bool:
    """Whether a file sits in nbgrader's hand-in folder, ``<learner>/<NN_slug>/``."""
    return len(parts) >= 3 and parts[-2] in slugs


def _in_a_folder_layout(parts: tuple[str, ...], slugs: list[str]) -> bool:
    """Whether a file sits in nbgrader's hand-in folder or a Moodle submission folder."""
    return _in_a_hand_in(parts, slugs) or any(map(MOODLE.match, parts[:-1]))


def _locate(parts: tuple[str, ...], slugs: list[str], canvas_names: bool = False
            ) -> tuple[str, str] | str:
    """(learner, chapter) from a path relative to the class folder, or why not. Names are
    read as Canvas's (``canvas_names``) only when every loose file of the download has
    Canvas's form: a class's own ``<learner>_<NN_slug>`` names are never reread."""
    if _in_a_hand_in(parts, slugs):
        return parts[-3], parts[-2]
    canvas = CANVAS.match(parts[-1]) if canvas_names else None
    platform = canvas or next(filter(None, map(MOODLE.match, parts[:-1])), None)
    if platform:
        file_name = canvas["file"] if canvas else parts[-1]
        named = split_name(file_name, slugs)
        chapter = named[1] if named else _near_match(file_name, slugs, contained_only=True)
        if chapter:
            return platform["learner"], chapter
    named = split_name(parts[-1], slugs)
    if named is not None:
        learner, chapter = named
        if learner:
            return named
        if len(parts) >= 2:
            return parts[-2], chapter
        return (f"{parts[-1]} names its chapter but no learner: put it in a folder named after "
                "the learner, or name it <learner>_<NN_slug>.ipynb")
    near = _near_match(parts[-1], slugs)
    if near:
        return (f"{'/'.join(parts)} names no chapter exactly: did you mean {near}? (expected "
                f"<learner>_{near}.ipynb, <learner>/{near}.ipynb or "
                f"<learner>/{near}/{near}.ipynb)")
    return (f"{'/'.join(parts)} names no chapter: expected <learner>/<NN_slug>.ipynb, "
            f"<learner>_<NN_slug>.ipynb or <learner>/<NN_slug>/<NN_slug>.ipynb, with NN_slug "
            f"one of {', '.join(slugs)}")


def _near_match(file_name: str, slugs: list[str], contained_only: bool = False) -> str | None:
    """The chapter a misnamed file most likely is: one whose slug the name contains (say
    ``erin_01_kv_cache_sizing-1.ipynb``, a platform's second upload), else the closest."""
    stem = file_name.removesuffix(".ipynb")
    inside = [slug for slug in slugs if slug in stem]
    if inside or contained_only:
        return max(inside, key=len, default=None)
    close = difflib.get_close_matches(stem[-max(map(len, slugs)):], slugs, n=1, cutoff=0.75)
    return close[0] if close else None


def _empty_hand_ins(root: Path, slugs: list[str]) -> list[Submission]:
    """A problem for each ``<learner>/<NN_slug>/`` folder of nbgrader's ``submitted/`` that
    holds no notebook (nbgrader's autograde would stop on it)."""
    empty = []
    for folder in sorted(root.glob("*/*/")):
        if folder.name in slugs and not folder.parent.name.startswith(".") and \
                not any(folder.rglob("*.ipynb")):
            held = ", ".join(sorted(p.name for p in folder.iterdir())) or "nothing"
            empty.append(_refused(
                str(folder), f"this hand-in holds no notebook ({held}): hand in "
                f"{folder.name}.ipynb", folder.parent.name, folder.name,
                _nbgrader_timestamp(folder) or _modified(folder)))
    return empty


def _without_duplicates(found: list[Submission], problems: list[Submission]
                        ) -> list[Submission]:
    groups: dict[tuple[str, str], list[Submission]] = {}
    for submission in found:
        groups.setdefault((submission.learner, submission.chapter), []).append(submission)
    kept = []
    for (learner, chapter), group in groups.items():
        if len(group) == 1:
            kept.append(group[0])
            continue
        own = [s for s in group if s.path.name == f"{chapter}.ipynb" and
               s.path.parent.name == chapter]
        if len(own) == 1:  # a hand-in folder: nbgrader grades the chapter's own notebook
            kept.append(own[0])
            for other in group:
                if other is not own[0]:
                    problems.append(_refused(
                        other.origin, f"ignored, as nbgrader ignores it: {chapter}.ipynb "
                        f"beside it is the notebook graded", learner, chapter,
                        other.timestamp, ignored=True))
            continue
        names = " and ".join(s.origin for s in group)
        for submission in group:
            problems.append(_refused(
                submission.origin, f"{len(group)} files are {learner}'s {chapter} ({names}); "
                "none of them was graded: keep one and grade again", learner, chapter,
                submission.timestamp))
    return kept + problems


def read_roster(path: Path) -> dict[str, str]:
    """A roster CSV: the id files name -> the class's learner id. Columns ``platform_id``
    and ``student_id``, or a Canvas gradebook export's ``ID`` (its user id, in download names)
    and ``SIS Login ID``. Raises ValueError saying which columns it needs."""
    with open(path, newline="", encoding="utf-8-sig") as handle:
        rows = list(csv.DictReader(handle))
    columns = set(rows[0]) if rows else set()
    for key, learner in (("platform_id", "student_id"), ("ID", "SIS Login ID")):
        if {key, learner} <= columns:
            return {row[key].strip(): row[learner].strip() for row in rows
                    if row[key].strip() and row[learner].strip()}
    raise ValueError(f"{path}: a roster needs the columns platform_id and student_id (or a "
                     f"Canvas export's ID and SIS Login ID); it has {', '.join(sorted(columns))}")


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
