"""The class's gradebook: nbgrader's own database, written only by the grading process.

Scores go in as nbgrader's autograde would put them (a submission per learner and chapter,
its timestamp, each test cell's score), so ``nbgrader export``, formgrader and late
penalties work on it as on any nbgrader class. A chapter is registered once, from the
source notebook the class grades with; a chapter already registered is never registered
again (that would overwrite the class's own cells and checksums).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from nbformat.warnings import DuplicateCellId, MissingIDFieldWarning
from nbgrader.api import Gradebook, MissingEntry
from sqlalchemy.exc import SAWarning

from autograder.configuration import COURSE_ID

# nbgrader's gradebook API trips SQLAlchemy's session warnings on reads and writes alike; they
# say nothing to an instructor, and on stderr they would bury the error lines that matter.
# Likewise nbformat's notices that it gave a learner's copied or id-less cells new ids. Set
# once for the process (``catch_warnings`` is not thread-safe, and grading uses threads).
for _quiet in (SAWarning, DuplicateCellId, MissingIDFieldWarning):
    warnings.filterwarnings("ignore", category=_quiet)

# nbgrader creates and upgrades a gradebook by running `alembic`, found on PATH: this
# environment's bin comes first (the grader may run from an environment not activated).
_BIN = str(Path(sys.executable).parent)
if _BIN not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = os.pathsep.join([_BIN, os.environ.get("PATH", "")])


class GradebookTampered(RuntimeError):
    """The class's gradebook changed between two of the grader's own writes."""


@dataclass
class Row:
    """One learner's grade for one chapter, as the gradebook holds it."""

    learner: str
    chapter: str
    score: float
    max_score: float
    timestamp: dt.datetime | None


class ClassGradebook:
    """An nbgrader gradebook at ``db_url`` (any SQLAlchemy URL)."""

    def __init__(self, db_url: str, course_id: str = COURSE_ID) -> None:
        self.db_url = db_url
        self.course_id = course_id
        self._fingerprint: str | None = None

    def is_registered(self, chapter: str) -> bool:
        with Gradebook(self.db_url, self.course_id) as book:
            try:
                assignment = book.find_assignment(chapter)
            except MissingEntry:
                return False
            return any(n.name == chapter for n in assignment.notebooks)

    def record(self, learner: str, chapter: str, points: dict[str, float],
               timestamp: dt.datetime | None) -> None:
        """Make ``points`` (test grade id -> points) ``learner``'s scores for ``chapter``,
        handed in at ``timestamp``, replacing an earlier submission's. Raises
        ``GradebookTampered`` if the file changed since the grader's last write."""
        self._check_untouched()
        with Gradebook(self.db_url, self.course_id) as book:
            book.update_or_create_student(learner)
            try:
                submission = book.find_submission(chapter, learner)
            except MissingEntry:
                submission = book.add_submission(chapter, learner)
            submission.timestamp = timestamp
            for notebook in submission.notebooks:
                for grade in notebook.grades:
                    if grade.name in points:
                        grade.auto_score = points[grade.name]
            book.db.commit()
        self._fingerprint = self._current_fingerprint()

    def add_learner(self, learner: str) -> None:
        self._check_untouched()
        with Gradebook(self.db_url, self.course_id) as book:
            book.update_or_create_student(learner)
        self._fingerprint = self._current_fingerprint()

    def rows(self) -> list[Row]:
        """Every submission in the gradebook, by learner then chapter."""
        self._check_untouched()
        found = []
        with Gradebook(self.db_url, self.course_id) as book:
            for assignment in book.assignments:
                for submission in assignment.submissions:
                    found.append(Row(submission.student_id, assignment.name,
                                     float(submission.score), float(assignment.max_score),
                                     submission.timestamp))
        return sorted(found, key=lambda r: (r.learner, r.chapter))

    def _current_fingerprint(self) -> str | None:
        path = sqlite_path(self.db_url)
        if path is None:
            return None  # a database server: its own access control protects it
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None

    def _check_untouched(self) -> None:
        if self._fingerprint is not None and self._current_fingerprint() != self._fingerprint:
            raise GradebookTampered(f"{self.db_url} changed while grading, and not by the "
                                    "grader: stop, and grade this class in a container")


def sqlite_path(db_url: str) -> Path | None:
    prefix = "sqlite:///"
    return Path(db_url[len(prefix):]) if db_url.startswith(prefix) else None
