"""One submission's way through grading, as one object, each thing about it read once:

    found (``layouts.collect``)  who and which chapter its place names, and when it came
    read                         its notebook (once), its content hash, the chapter its content is
    graded (``autograde``)      or refused: a result with the reason
    reported                     report, JSON, CSV row, feedback page, gradebook row

A submission the grader refuses (damaged, two files for one learner and chapter, a path that
names no learner, content of another chapter than its name says) keeps its place in every
report, with its reason.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass
from pathlib import Path

import nbformat

from autograder.hints import in_language
from autograder.host.autograde import Job
from autograder.host.chapters import Chapter, NotGradable, load_submission, recognise
from autograder.host.freshness import Inputs
from autograder.host.report import NotebookResult
from course.language import ENGLISH, LANGUAGES, tr_later


@dataclass
class Submission:
    origin: str  # what reports call it: its path, or ``archive.zip:entry``
    learner: str
    chapter: str  # as its place names it (or its content, where the name says nothing)
    timestamp: dt.datetime | None
    path: Path | None = None
    digest: str = ""
    notebook: nbformat.NotebookNode | None = None
    target: Chapter | None = None  # the chapter it is graded as
    result: NotebookResult | None = None
    executed: dict | None = None  # the graded notebook, for its feedback page
    reused: bool = False  # not run again since it was last graded: its earlier result stands
    regraded: bool = False  # the same file, run again: what grades it changed, or asked to
    rerecorded: bool = False  # reused, and recorded again: its due date, penalty or time changed
    ignored: bool = False  # a file nbgrader skips too (not the chapter's notebook): not graded
    grader_failed: bool = False  # refused for the grader's own failure: nothing recorded
    # refused, yet recorded by nbgrader as its autograde records a notebook it fails on: a
    # submission with its time, waiting for manual grading (``ClassCourse.record_refused``)
    flagged: bool = False
    inputs: Inputs | None = None  # what decides its grade (``freshness``), once known
    reason: str = ""  # why it was (or was not) graded again, in words (``freshness.decide``)

    @property
    def when(self) -> str:
        """When it was handed in (UTC, ISO 8601), where known."""
        return self.timestamp.isoformat(sep=" ") if self.timestamp else ""

    @property
    def status(self) -> str:
        """What this run did with it, as the CSV and JSON say."""
        if self.result is None or not self.result.graded:
            return "ignored" if self.ignored else "not graded"
        if self.rerecorded:
            return "rerecorded"
        return "unchanged" if self.reused else "regraded" if self.regraded else "graded"

    def to_json(self) -> dict:
        return {**self.result.to_json(), "status": self.status, "reason": self.reason}

    def refuse(self, message: str) -> None:
        language = self.language
        self.result = NotebookResult(self.origin, self.chapter, "", [], self.learner,
                                     self.when, in_language(message, language), language)

    @property
    def language(self) -> str:
        """The language its notebook is in (its metadata says; English when it names none
        this chapter exists in)."""
        named = (self.notebook or {}).get("metadata", {}).get("course", {}).get("language")
        known = self.target.languages() if self.target else LANGUAGES
        return named if named in known else ENGLISH

    def job(self) -> Job:
        """What grading it needs: the chapter's source in the notebook's language."""
        source = self.target.source_in(self.language).read_text(encoding="utf-8")
        return Job(self.target.name, source, self.learner, self.origin, self.notebook,
                   self.language)


def read(submissions: list[Submission], known: dict[str, Chapter]) -> None:
    """Read each file and decide what it is graded as; refuse what cannot be graded."""
    for submission in submissions:
        if submission.result is not None:
            continue
        try:
            submission.notebook = load_submission(submission.path)
        except NotGradable as exc:
            submission.refuse(str(exc))
            continue
        submission.digest = hashlib.sha256(submission.path.read_bytes()).hexdigest()
        actual = recognise(submission.notebook, known)
        named = known.get(submission.chapter)
        if actual is None and named is None:
            submission.refuse(tr_later(
                f"not a notebook of this course's chapters ({', '.join(known)})"))
        elif actual is not None and named is not None and actual != named:
            submission.refuse(tr_later(
                f"this is the notebook of {actual.name} (its cells say so), handed in as "
                f"{named.name}; it was not graded as either: hand in {named.name}'s notebook "
                "under that name"))
        else:
            submission.target = named or actual
            submission.chapter = submission.target.name
