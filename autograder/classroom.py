"""Grading a whole class into its gradebook: every submission found gets exactly one row.

    found (``submissions.collect``) -> read and recognised -> graded, or reused when its
    content is unchanged since it was graded -> gradebook -> CSV, JSON, feedback pages

A submission is keyed by (learner, chapter). A file that cannot be graded (damaged, two files
for one learner and chapter, a path that names no learner, a notebook whose content is
another chapter than its name says) is not graded, keeps whatever grade the gradebook held,
and gets a row, a JSON entry, a feedback page where the learner is known, and an error line.
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import json
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import nbformat

from autograder.chapters import Chapter, NotGradable, load_submission, recognise
from autograder.gradebook import ClassGradebook
from autograder.pipeline import Grader, generate
from autograder.report import NotebookResult
from autograder.restore import Unmatched
from autograder.submissions import Problem, Submission


@dataclass
class Graded:
    """One file's way through grading."""

    origin: str
    learner: str
    chapter: str  # as its location names it (or its content, where the name says nothing)
    timestamp: dt.datetime | None
    path: Path | None = None
    digest: str = ""
    notebook: nbformat.NotebookNode | None = None
    target: Chapter | None = None  # what it is graded as
    result: NotebookResult | None = None
    reused: bool = False  # unchanged since it was last graded

    def refuse(self, message: str) -> None:
        self.result = NotebookResult(self.origin, self.chapter, "", [], self.learner,
                                     _iso(self.timestamp), message)


def read(entries: list[Graded], known: dict[str, Chapter]) -> None:
    """Read each file and decide what it is graded as; refuse what cannot be graded."""
    for entry in entries:
        if entry.result is not None:
            continue
        try:
            entry.notebook = load_submission(entry.path, entry.origin)
        except NotGradable as exc:
            entry.refuse(str(exc).removeprefix(f"{entry.origin}: "))
            continue
        entry.digest = hashlib.sha256(entry.path.read_bytes()).hexdigest()
        actual = recognise(entry.notebook, known)
        named = known.get(entry.chapter)
        if actual is None and named is None:
            entry.refuse(f"not a notebook of this course's chapters ({', '.join(known)})")
        elif actual is not None and named is not None and actual != named:
            entry.refuse(f"this is the notebook of {actual.name} (its cells say so), handed in "
                         f"as {named.name}; it was not graded as either: hand in "
                         f"{named.name}'s notebook under that name")
        else:
            entry.target = named or actual
            entry.chapter = entry.target.name


def grade(entries: list[Graded], grader: Grader, jobs: int,
          on_result: Callable[[Graded], None] = lambda entry: None,
          feedback: Path | None = None) -> None:
    """Grade every entry that has a target and no result yet, ``jobs`` at a time; call
    ``on_result`` (in this thread) as each one ends."""
    todo = [e for e in entries if e.result is None and e.target is not None]
    for chapter in {e.target.name: e.target for e in todo}.values():
        grader.prepare(chapter)  # once per chapter, before the threads start

    def one(entry: Graded) -> NotebookResult:
        page = feedback_page(feedback, entry.learner, entry.chapter) if feedback else None
        result = grader.autograde(entry.target, entry.learner, entry.notebook, entry.origin,
                                  page)
        result.timestamp = _iso(entry.timestamp)
        return result

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(one, entry): entry for entry in todo}
        for future in as_completed(futures):
            entry = futures[future]
            try:
                entry.result = future.result()
            except (NotGradable, Unmatched) as exc:
                entry.refuse(str(exc))
            on_result(entry)


@dataclass
class ClassRun:
    """Where a class is graded from and into."""

    book: ClassGradebook
    grader: Grader
    known: dict[str, Chapter]
    state: Path
    csv: Path
    feedback: Path
    json: Path | None = None
    jobs: int = 1


def grade_class(run: ClassRun, submissions: list[Submission], problems: list[Problem],
                progress: bool = True) -> list[Graded]:
    """Grade a class (see the module's docstring); return every entry, in a stable order."""
    entries = [Graded(s.origin, s.learner, s.chapter, s.timestamp, s.path)
               for s in submissions]
    for problem in problems:
        entry = Graded(problem.origin, problem.learner, problem.chapter, problem.timestamp)
        entry.refuse(problem.message)
        entries.append(entry)
    read(entries, run.known)
    state = _load_state(run.state)
    for entry in entries:
        before = state.get(_key(entry))
        if entry.result is None and before and before["sha256"] == entry.digest:
            entry.result = NotebookResult.from_json(before["result"])
            entry.result.notebook, entry.result.timestamp = entry.origin, _iso(entry.timestamp)
            entry.reused = True
    for chapter in {e.target.name: e.target for e in entries if e.target}.values():
        if not run.book.is_registered(chapter.name):
            generate(run.grader.scratch / "register" / chapter.name, chapter, run.book.db_url,
                     run.grader.limits, run.grader.course_id)
    for entry in entries:  # a resubmission's new time is recorded even when not regraded
        if entry.reused:
            _record(run.book, entry)
    todo = sum(e.result is None and e.target is not None for e in entries)
    done = [0]

    def on_result(entry: Graded) -> None:
        if entry.result.graded:
            _record(run.book, entry)
            state[_key(entry)] = {"sha256": entry.digest, "result": entry.result.to_json()}
            _save_state(run.state, state)
        done[0] += 1
        if progress:
            _progress(done[0], todo, entry)

    grade(entries, run.grader, run.jobs, on_result, run.feedback.resolve())
    for entry in entries:
        if not entry.result.graded:
            if entry.learner:
                run.book.add_learner(entry.learner)
                if entry.chapter:
                    _refusal_page(entry, feedback_page(run.feedback, entry.learner,
                                                       entry.chapter))
    write_csv(run.csv, run.book, entries)
    if run.json:
        run.json.write_text(json.dumps([e.result.to_json() for e in entries], indent=2) + "\n",
                            encoding="utf-8")
    return entries


def feedback_page(folder: Path, learner: str, chapter: str) -> Path:
    """Where a learner's page goes: nbgrader's own layout, so ``nbgrader release_feedback``
    hands it out through the exchange."""
    return folder / learner / chapter / f"{chapter}.html"


def _record(book: ClassGradebook, entry: Graded) -> None:
    book.record(entry.learner, entry.chapter, {t.id: t.points for t in entry.result.tests},
                entry.timestamp)


def _key(entry: Graded) -> str:
    return json.dumps([entry.learner, entry.chapter])


def _load_state(path: Path) -> dict:
    if not path.exists():
        return {}
    state = json.loads(path.read_text(encoding="utf-8"))
    # keep only entries keyed by (learner, chapter); older keys are graded again
    return {k: v for k, v in state.items() if k.startswith("[")}


def _save_state(path: Path, state: dict) -> None:
    path.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def _iso(stamp: dt.datetime | None) -> str:
    return stamp.isoformat(sep=" ") if stamp else ""


def write_csv(destination: Path, book: ClassGradebook, entries: list[Graded]) -> None:
    """Every grade in the gradebook, then every file of this run that was not graded.

    Columns: student_id, assignment, timestamp, score, max_score (as ``nbgrader export``
    names them), then status, file and message."""
    this_run = {(e.learner, e.chapter): e for e in entries if e.result.graded}
    with open(destination, "w", newline="", encoding="utf-8") as handle:
        out = csv.writer(handle)
        out.writerow(["student_id", "assignment", "timestamp", "score", "max_score",
                      "status", "file", "message"])
        for row in book.rows():
            entry = this_run.get((row.learner, row.chapter))
            status = "graded earlier" if entry is None else \
                "unchanged" if entry.reused else "graded"
            out.writerow([row.learner, row.chapter, _iso(row.timestamp), f"{row.score:g}",
                          f"{row.max_score:g}", status, entry.origin if entry else "", ""])
        for entry in entries:
            if not entry.result.graded:
                out.writerow([entry.learner, entry.chapter, _iso(entry.timestamp), "", "",
                              "not graded", entry.origin, entry.result.error])


def _refusal_page(entry: Graded, destination: Path) -> None:
    import html

    destination.parent.mkdir(parents=True, exist_ok=True)
    destination.write_text(
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(entry.chapter)}"
        f"</title></head><body><h2>{html.escape(entry.chapter)}: not graded</h2>"
        f"<p>{html.escape(entry.origin)}</p><p>{html.escape(entry.result.error)}</p>"
        "</body></html>\n", encoding="utf-8")


def _progress(done: int, total: int, entry: Graded) -> None:
    width = 30
    total = max(total, 1)
    bar = "#" * (width * done // total) + "." * (width - width * done // total)
    result = entry.result
    outcome = f"{result.score:g}/{result.max_score:g}" if result.graded else "not graded"
    print(f"[{bar}] {done}/{total} {entry.learner} {entry.origin}: {outcome}",
          file=sys.stderr, flush=True)
