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

Canvas and Moodle name a learner by the platform's stable id, whatever the upload: a late
upload (``LATE_``) or a renamed second one (``01_kv_cache_sizing-1.ipynb``) is the same
learner's chapter. Each loose file is read by its own name, whatever lies beside it: a Canvas
name has Canvas's whole form (a lowercase name, then the two numeric ids); a class's own
``<learner>_<NN_slug>`` name whose learner has another form is never read as Canvas's, and an
id read whole that still looks like Canvas's, or that differs from another only by Unicode
normalisation (a file named on macOS), gets a warning (``doubtful_ids``).

A roster (``roster``: the platform's id -> the class's learner id) maps those ids, or a flat
name's learner part, to the ids the class grades under; with a roster, a file whose id is not
on it is a problem, never a new learner.

A folder that is an nbgrader course directory (it holds ``submitted/`` beside ``source/`` or
``nbgrader_config.py``) is read from its ``submitted/`` only, never from ``source/``,
``release/``, ``autograded/`` or ``feedback/`` (given one of those, ``course_directory``
refuses it). A folder inside its ``submitted/`` is read as what it is there: ``<learner>/``
that learner's hand-ins, ``<learner>/<NN_slug>/`` that one hand-in; never a new learner. No
learner is named like a chapter: such a file is a problem.

Two files for the same learner and chapter, files whose path names no learner or no chapter,
and a hand-in folder with no notebook in it are problems: each gets a line naming its file,
and none is graded silently. In a hand-in folder (``<learner>/<NN_slug>/``) the chapter's own
notebook, ``NN_slug.ipynb``, is the one graded, as nbgrader grades it; any other notebook
there (an ``Untitled.ipynb`` that ``nbgrader submit`` copied along) is listed as ignored, and
so is every file that is not a notebook (``answers.txt``, a ``.pdf``; nbgrader's own
``timestamp.txt`` and ``submission_secret.txt`` aside).
"""

from __future__ import annotations

import csv
import datetime as dt
import difflib
import re
import unicodedata
import zipfile
from collections.abc import Iterable
from pathlib import Path

from autograder.host.submission import Submission

SEPARATORS = ("_", "-")
CANVAS = re.compile(r"^[a-z]+_(?:LATE_)?(?P<learner>\d+)_\d+_(?P<file>.+\.ipynb)$")
MOODLE = re.compile(r"^.+_(?P<learner>\d+)_assign(?:submission|feedback)_\w+_?$")
# a learner id that is a Canvas name read whole: a file renamed, or not Canvas's after all
CANVAS_READ_WHOLE = re.compile(r"^[A-Za-z]+_(?:LATE_)?(?P<learner>\d+)_\d+$")
NBGRADER_FOLDERS = ("source", "release", "autograded", "feedback")  # never hand-ins
NBGRADER_FILES = ("timestamp.txt", "submission_secret.txt")  # what `nbgrader submit` adds


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


class NotHandIns(ValueError):
    """A folder inside a course directory that holds no hand-ins; the message says which
    folder to give instead."""


def course_directory(folder: Path) -> Path | None:
    """The nbgrader course directory that ``folder`` is, or whose ``submitted/`` holds it
    (``submitted/`` itself, a learner's folder, one hand-in); None where it is in none (a
    folder of downloads kept in a course directory is in none). Raises ``NotHandIns`` for
    nbgrader's other folders (``source/``, ...) and a folder deeper than a hand-in."""
    place = hand_ins_in(folder)
    return place[0] if place else None


def hand_ins_in(folder: Path) -> tuple[Path, tuple[str, ...]] | None:
    """``(course directory, where folder is in its submitted/)``: ``()`` for all of it,
    ``(learner,)`` or ``(learner, chapter)``; None where ``folder`` is in no course's. Raises
    ``NotHandIns`` as ``course_directory`` does."""
    folder = folder.resolve()
    for course in (folder, *folder.parents):
        if not _is_course(course):
            continue
        inside = folder.relative_to(course).parts
        if inside[:1] in ((), ("submitted",)) and len(inside) <= 3:
            return course, inside[1:]
        if inside[0] == "submitted":
            raise NotHandIns(f"{folder} is inside a hand-in of the course directory {course}: "
                             "give the hand-in's folder, submitted/<learner>/<NN_slug>")
        if inside[0] in NBGRADER_FOLDERS:
            raise NotHandIns(f"{folder} is in the course directory's {inside[0]}/, which "
                             f"holds no hand-ins: give the course directory ({course}), its "
                             "submitted/, a learner's folder or one hand-in's in it")
        return None
    return None


def _is_course(folder: Path) -> bool:
    """An nbgrader course directory: its configuration, or ``submitted/`` beside ``source/``
    (one with nothing handed in yet is one too: grading it finds nothing, and never makes the
    working folder a second course)."""
    return (folder / "nbgrader_config.py").exists() or (
        (folder / "submitted").is_dir() and (folder / "source").is_dir())


def collect(folder: Path, slugs: Iterable[str], origin_of=None, time_of=None,
            roster: dict[str, str] | None = None) -> list[Submission]:
    """Every submission under ``folder``, in a stable order: those to grade, then those
    refused here (each with its reason, ``Submission.refuse``), those ignored among them.

    ``origin_of(path)`` names a file in reports (default: its path); ``time_of(path)`` is
    when it was handed in, where no ``timestamp.txt`` says (default: its modification time);
    ``roster`` maps the ids the files name to the class's learner ids. A folder in a course
    directory's ``submitted/`` is read as its place there says (``hand_ins_in``; it raises
    ``NotHandIns``).
    """
    slugs = list(slugs)
    origin_of = origin_of or str
    time_of = time_of or _modified
    place = hand_ins_in(folder)
    root = place[0] / "submitted" if place else folder
    within = root.joinpath(*place[1]) if place else folder
    found: list[Submission] = []
    problems = _empty_hand_ins(root, within, slugs) if place else []
    files = [path for path in sorted(within.rglob("*")) if path.is_file() and
             not any(part.startswith(".") for part in path.relative_to(root).parts)]
    for path in files:  # not checkpoints (.ipynb_checkpoints/), nor a system's hidden files
        parts = path.relative_to(root).parts
        if path.suffix != ".ipynb":
            problems += _not_a_notebook(path, parts, slugs, origin_of, problems)
            continue
        located = _locate(parts, slugs)
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
        if learner in slugs:
            problems.append(_refused(origin_of(path), f"{learner!r}, read as the learner, is a "
                                     "chapter's name: not graded (a hand-in lies in "
                                     "submitted/<learner>/<NN_slug>/; grade the course "
                                     "directory or a learner's folder)", chapter=chapter))
            continue
        stamp = _nbgrader_timestamp(path.parent) if _in_a_hand_in(parts, slugs) else None
        found.append(Submission(origin_of(path), learner, chapter, stamp or time_of(path),
                                path))
    return _without_duplicates(found, problems)


def _not_a_notebook(path: Path, parts: tuple[str, ...], slugs: list[str], origin_of,
                    problems: list[Submission]) -> list[Submission]:
    """An ignored row for a file that is not a notebook: none for nbgrader's own files, nor
    for one in a hand-in folder already reported as holding no notebook."""
    origin = origin_of(path)
    if path.name in NBGRADER_FILES or any(str(path.parent) == p.origin for p in problems):
        return []
    learner, chapter = (parts[-3], parts[-2]) if _in_a_hand_in(parts, slugs) else ("", "")
    return [_refused(origin, f"not a notebook: nbgrader grades only "
                     f"{chapter or 'NN_slug'}.ipynb", learner, chapter, ignored=True)]


def _in_a_hand_in(parts: tuple[str, ...], slugs: list[str]) -> bool:
    """Whether a file sits in nbgrader's hand-in folder, ``<learner>/<NN_slug>/``."""
    return len(parts) >= 3 and parts[-2] in slugs


def _in_a_folder_layout(parts: tuple[str, ...], slugs: list[str]) -> bool:
    """Whether a file sits in nbgrader's hand-in folder or a Moodle submission folder."""
    return _in_a_hand_in(parts, slugs) or any(map(MOODLE.match, parts[:-1]))


def _locate(parts: tuple[str, ...], slugs: list[str]) -> tuple[str, str] | str:
    """(learner, chapter) from a path relative to the class folder, or why not. A file name
    is Canvas's when it has Canvas's whole form, whatever lies beside it."""
    if _in_a_hand_in(parts, slugs):
        return parts[-3], parts[-2]
    canvas = CANVAS.match(parts[-1])
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


def _empty_hand_ins(root: Path, within: Path, slugs: list[str]) -> list[Submission]:
    """A problem for each ``<learner>/<NN_slug>/`` folder of nbgrader's ``submitted/``
    (``root``) in ``within`` that holds no notebook (nbgrader's autograde would stop on it)."""
    empty = []
    for folder in sorted(root.glob("*/*/")):
        if folder.name in slugs and not folder.parent.name.startswith(".") and \
                folder.is_relative_to(within) and \
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


def doubtful_ids(learners: Iterable[str], known: Iterable[str] = ()) -> list[str]:
    """A warning line for each of ``learners`` (ids read from this run's files) that may not
    be a learner's own id: one shaped like a Canvas name read whole (``name_userid_uploadid``),
    and one that differs from another of them or of ``known`` (the class's learners) only by
    Unicode normalisation (NFC, as most systems write names, or NFD, as macOS does)."""
    learners = sorted(set(learners))
    lines = [f"{learner!r} is read as a learner id but looks like a Canvas download's name "
             f"(its learner would be {canvas['learner']!r}): check that it is not a second id "
             "for one learner" for learner in learners if (canvas := CANVAS_READ_WHOLE.match(
                 learner))]
    forms: dict[str, set[str]] = {}
    for learner in {*learners, *known}:
        forms.setdefault(unicodedata.normalize("NFC", learner), set()).add(learner)
    for same in forms.values():
        if len(same) > 1 and same & set(learners):
            named = " and ".join(f"{learner!r} ({_form(learner)})" for learner in sorted(same))
            lines.append(f"{named} differ only by Unicode normalisation: one person, graded "
                         "as two learners; rename one folder or file to the other's form")
    return lines


def _form(text: str) -> str:
    return next((form for form in ("NFC", "NFD") if unicodedata.normalize(form, text) == text),
                "mixed normalisation")


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
