"""The class's gradebook, nbgrader's own database: what the grader reads of it, and the check
that nothing else wrote it during a batch.

nbgrader writes every grade (``autograder.host.recording``); the grader reads whether a chapter is
registered, and adds a learner whose hand-in could not be graded. Between two of this run's
writes the file must not change: a change means another program wrote it (an instructor's
own nbgrader command run during the batch, or, graded with ``--sandbox off``, a notebook), and
the batch stops rather than record over it.
"""

from __future__ import annotations

import hashlib
import os
import sys
import warnings
from pathlib import Path

from nbformat.warnings import DuplicateCellId, MissingIDFieldWarning
from nbgrader.api import Gradebook, MissingEntry
from sqlalchemy.exc import SAWarning

from autograder.host.configuration import COURSE_ID


def prepare_for_nbgrader() -> None:
    """Ready this process to run nbgrader's API; safe to call again.

    nbgrader's gradebook API trips SQLAlchemy's session warnings on reads and writes alike;
    they say nothing to an instructor, and on stderr they would bury the error lines that
    matter. Likewise nbformat's notices that it gave a learner's copied or id-less cells new
    ids. They are silenced for the whole process (``catch_warnings`` is not thread-safe, and
    grading uses threads). nbgrader creates and upgrades a gradebook by running ``alembic``,
    found on PATH: this environment's bin goes first (the grader may run from an environment
    not activated)."""
    for quiet in (SAWarning, DuplicateCellId, MissingIDFieldWarning):
        warnings.filterwarnings("ignore", category=quiet)  # a repeated filter is not added twice
    here = str(Path(sys.executable).parent)
    if here not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([here, os.environ.get("PATH", "")])


class GradebookTampered(RuntimeError):
    """The class's gradebook changed between two of this run's own writes."""


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

    def deadlines(self) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
        """Each chapter's due date, and each (learner, chapter) hand-in's extension, as text
        ("" where none): what nbgrader's late penalty counts from, besides the hand-in
        time."""
        with Gradebook(self.db_url, self.course_id) as book:
            due = {a.name: str(a.duedate or "") for a in book.assignments}
            extension = {(s.student_id, a.name): str(s.extension or "")
                         for a in book.assignments for s in a.submissions}
        return due, extension

    def add_learner(self, learner: str) -> None:
        self.check_untouched()
        with Gradebook(self.db_url, self.course_id) as book:
            book.update_or_create_student(learner)
        self.remember()

    def remember(self) -> None:
        """Take the file as it is now as this run's own last write."""
        self._fingerprint = self._current_fingerprint()

    def _current_fingerprint(self) -> str | None:
        path = sqlite_path(self.db_url)
        if path is None:
            return None  # a database server: its own access control protects it
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None

    def check_untouched(self) -> None:
        """Raises ``GradebookTampered`` if the file changed since this run last wrote it."""
        if self._fingerprint is not None and self._current_fingerprint() != self._fingerprint:
            raise GradebookTampered(
                f"{self.db_url} changed during this batch, and not by it: another nbgrader "
                "command (do not run one on this class while it is graded) or, graded with "
                "--sandbox off, a notebook; nothing more was recorded. Grade again: what was "
                "recorded stands, and unchanged hand-ins are not graded twice")


def sqlite_path(db_url: str) -> Path | None:
    prefix = "sqlite:///"
    return Path(db_url[len(prefix):]) if db_url.startswith(prefix) else None
