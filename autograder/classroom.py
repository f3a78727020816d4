"""Grading a whole class into its gradebook: every submission found gets exactly one row.

    found (``layouts.collect``) -> read and recognised (``submission.read``) -> graded
    (``autograde``, by a pool of threads or a Dask cluster), or reused when its content is
    unchanged since it was graded -> gradebook -> CSV, JSON, feedback pages

A submission is keyed by (learner, chapter). A file that cannot be graded (damaged, two files
for one learner and chapter, a path that names no learner, a notebook whose content is
another chapter than its name says) is not graded, keeps whatever grade the gradebook held,
and gets a row, a JSON entry, a feedback page where the learner is known, and an error line.
Only this process writes the gradebook, the state file and the feedback pages.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autograder.autograde import Grader, Outcome, generate
from autograder.chapters import Chapter, NotGradable
from autograder.layouts import Found, Problem
from autograder.report import NotebookResult
from autograder.restore import Unmatched
from autograder.submission import Submission, read

if TYPE_CHECKING:  # a class's modules: `grade` (one learner's notebooks) loads neither
    from autograder.gradebook import ClassGradebook

# What grades the submissions: given the jobs, it yields (index, outcome or the exception that
# made it not gradable) as each ends. A pool of threads here, or a Dask cluster.
Runner = Callable[[Grader, list], Iterator[tuple[int, "Outcome | Exception"]]]


def threads(jobs: int) -> Runner:
    """Grade ``jobs`` submissions at a time in this process's threads."""

    def run(grader: Grader, work: list) -> Iterator[tuple[int, Outcome | Exception]]:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futures = {pool.submit(grader.autograde, job): index
                       for index, job in enumerate(work)}
            for future in as_completed(futures):
                try:
                    yield futures[future], future.result()
                except (NotGradable, Unmatched) as exc:
                    yield futures[future], exc

    return run


def grade(submissions: list[Submission], grader: Grader, runner: Runner,
          on_result: Callable[[Submission], None] = lambda submission: None) -> None:
    """Grade every submission that has a target and no result yet; call ``on_result`` (in
    this thread) as each one ends."""
    todo = [s for s in submissions if s.result is None and s.target is not None]
    jobs = [s.job() for s in todo]
    for job in {(j.chapter, j.language): j for j in jobs}.values():  # built once, not per job
        grader.template(job.chapter, job.source)
    for index, outcome in runner(grader, jobs):
        submission = todo[index]
        if isinstance(outcome, Exception):
            submission.refuse(str(outcome))
        else:
            submission.result, submission.executed = outcome.result, outcome.executed
            submission.result.timestamp = submission.when
        on_result(submission)


@dataclass
class ClassRun:
    """Where a class is graded from and into."""

    book: ClassGradebook
    grader: Grader
    known: dict[str, Chapter]
    state: Path
    csv: Path
    feedback: Path
    runner: Runner
    json: Path | None = None


def grade_class(run: ClassRun, found: list[Found], problems: list[Problem],
                progress: bool = True) -> list[Submission]:
    """Grade a class (see the module's docstring); return every submission, in a stable
    order."""
    from autograder.feedback import write_feedback

    entries = [Submission(f.origin, f.learner, f.chapter, f.timestamp, f.path) for f in found]
    for problem in problems:
        entry = Submission(problem.origin, problem.learner, problem.chapter, problem.timestamp)
        entry.refuse(problem.message)
        entries.append(entry)
    read(entries, run.known)
    state = _load_state(run.state)
    for entry in entries:
        before = state.get(_key(entry))
        if entry.result is None and before and before["sha256"] == entry.digest:
            entry.result = NotebookResult.from_json(before["result"])
            entry.result.notebook, entry.result.timestamp = entry.origin, entry.when
            entry.reused = True
    for chapter in {e.target.name: e.target for e in entries if e.target}.values():
        if not run.book.is_registered(chapter.name):
            with tempfile.TemporaryDirectory(prefix="kv-course-register-") as scratch:
                generate(Path(scratch), chapter.name,
                         chapter.source.read_text(encoding="utf-8"), run.book.db_url,
                         run.grader.limits, run.grader.course_id)
    for entry in entries:  # a resubmission's new time is recorded even when not regraded
        if entry.reused:
            _record(run.book, entry)
    todo = sum(e.result is None and e.target is not None for e in entries)
    done = [0]

    def on_result(entry: Submission) -> None:
        if entry.result.graded:
            _record(run.book, entry)
            state[_key(entry)] = {"sha256": entry.digest, "result": entry.result.to_json()}
            _save_state(run.state, state)
            if entry.executed is not None:
                write_feedback(entry.executed, entry.result,
                               feedback_page(run.feedback, entry.learner, entry.chapter))
        done[0] += 1
        if progress:
            _progress(done[0], todo, entry)

    grade(entries, run.grader, run.runner, on_result)
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


def _record(book: ClassGradebook, entry: Submission) -> None:
    book.record(entry.learner, entry.chapter, {t.id: t.points for t in entry.result.tests},
                entry.timestamp)


def _key(entry: Submission) -> str:
    return json.dumps([entry.learner, entry.chapter])


def _load_state(path: Path) -> dict:
    if not path.exists():
        return {}
    state = json.loads(path.read_text(encoding="utf-8"))
    # keep only entries keyed by (learner, chapter); older keys are graded again
    return {k: v for k, v in state.items() if k.startswith("[")}


def _save_state(path: Path, state: dict) -> None:
    path.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def _iso(stamp: dt.datetime | None) -> str:  # the gradebook's times
    return stamp.isoformat(sep=" ") if stamp else ""


def write_csv(destination: Path, book: ClassGradebook, entries: list[Submission]) -> None:
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
                out.writerow([entry.learner, entry.chapter, entry.when, "", "",
                              "not graded", entry.origin, entry.result.error])


def _refusal_page(entry: Submission, destination: Path) -> None:
    import html

    destination.parent.mkdir(parents=True, exist_ok=True)
    destination.write_text(
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(entry.chapter)}"
        f"</title></head><body><h2>{html.escape(entry.chapter)}: not graded</h2>"
        f"<p>{html.escape(entry.origin)}</p><p>{html.escape(entry.result.error)}</p>"
        "</body></html>\n", encoding="utf-8")


def _progress(done: int, total: int, entry: Submission) -> None:
    width = 30
    total = max(total, 1)
    bar = "#" * (width * done // total) + "." * (width - width * done // total)
    result = entry.result
    outcome = f"{result.score:g}/{result.max_score:g}" if result.graded else "not graded"
    print(f"[{bar}] {done}/{total} {entry.learner} {entry.origin}: {outcome}",
          file=sys.stderr, flush=True)
