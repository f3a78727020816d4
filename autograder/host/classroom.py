"""Grading a whole class into its nbgrader course directory: every hand-in found gets exactly
one row, and the course directory ends as nbgrader's own ``autograde`` would leave it.

    found (``layouts.collect``) -> read and recognised (``submission.read``) -> staged in
    ``submitted/`` (``recording.ClassCourse.stage``) -> graded (``autograde``, by a pool of
    threads or a Dask cluster), recorded again, or reused, as ``freshness.decide`` says from
    what decides its grade -> recorded by nbgrader (``recording``: gradebook, late penalty,
    ``autograded/``, feedback page) -> CSV (``nbgrader export``'s rows), JSON

A hand-in is keyed by (learner, chapter). One that cannot be graded (damaged, two files for
one learner and chapter, a path that names no learner, a notebook whose content is another
chapter than its name says) is not graded, keeps whatever grade the gradebook held, and gets
a row, a JSON entry, an error line, and a page where the learner has none yet (with the
``timestamp.txt`` and ``submission_secret.txt`` ``release_feedback`` reads). Where its file
names a learner and a chapter the gradebook holds, nbgrader records it as its own autograde
records a notebook it fails on: a submission, waiting for manual grading. A notebook
beside the chapter's own in a hand-in folder is ignored, as nbgrader ignores it, with a row
that says so, and so is every file that is not a notebook. Only this process writes the
course directory and the state file.
"""

from __future__ import annotations

import collections
import contextlib
import csv
import json
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from autograder.host.autograde import Grader, Outcome, grader_failed
from autograder.host.chapters import Chapter, GraderFailure, NotGradable
from autograder.host.freshness import (
    KEEP,
    RECORD,
    REGRADE,
    Inputs,
    checks_of,
    decide,
    digest,
    versions,
)
from autograder.host.report import NotebookResult
from autograder.host.restore import Unmatched
from autograder.host.sandbox import end_all
from autograder.host.submission import Submission, read

if TYPE_CHECKING:  # a class's modules: `grade` (one learner's notebooks) loads none
    from autograder.host.recording import ClassCourse

# What grades the submissions: given the jobs, it yields (index, outcome or the exception that
# made it not gradable) as each ends. A pool of threads here, or a Dask cluster.
Runner = Callable[[Grader, list], Iterator[tuple[int, "Outcome | Exception"]]]


def threads(jobs: int) -> Runner:
    """Grade ``jobs`` submissions at a time in this process's threads."""

    def run(grader: Grader, work: list) -> Iterator[tuple[int, Outcome | Exception]]:
        pool = ThreadPoolExecutor(max_workers=max(1, jobs))
        try:
            futures = {pool.submit(grader.autograde, job): index
                       for index, job in enumerate(work)}
            for future in as_completed(futures):
                try:
                    yield futures[future], future.result()
                except (NotGradable, Unmatched) as exc:
                    yield futures[future], exc
                except Exception as exc:  # the grader's own failure: this submission alone
                    yield futures[future], grader_failed(exc)
        except BaseException:  # stopped early (Ctrl-C): nothing more starts, what runs ends
            end_all()
            raise
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    return run


@contextlib.contextmanager
def _stopped_between_results() -> Iterator[threading.Event]:
    """Ctrl-C while a class is graded: the notebooks running end at once (``end_all``), and
    the run stops between two results, never while one is being recorded (a gradebook left
    half written, or a lock held, would keep the run from ending). A second Ctrl-C interrupts
    wherever it lands. Outside the main thread (a hub's service), Ctrl-C is not this run's;
    where SIGINT is ignored (``nohup ... &``), it stays ignored."""
    stopping = threading.Event()
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield stopping  # not this run's Ctrl-C, or ignored (a grader started in the background)
        return

    def stop(*_: object) -> None:
        stopping.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        end_all()

    previous = signal.signal(signal.SIGINT, stop)
    try:
        yield stopping
    finally:
        signal.signal(signal.SIGINT, previous)


def grade(submissions: list[Submission], grader: Grader, runner: Runner,
          on_result: Callable[[Submission], None] = lambda submission: None) -> None:
    """Grade every submission that has a target and no result yet; call ``on_result`` (in
    this thread) as each one ends. Ctrl-C stops it between two results (``KeyboardInterrupt``):
    what was recorded stays, the notebooks still running end, and what they were grading is
    left ungraded."""
    todo = [s for s in submissions if s.result is None and s.target is not None]
    jobs = [s.job() for s in todo]
    notebooks = collections.Counter(job.chapter for job in jobs)
    for job in {(j.chapter, j.language): j for j in jobs}.values():  # built once, not per job
        grader.template(job.chapter, job.source)
        if notebooks[job.chapter] > 1:  # a class: its cases recorded once, here, before any
            grader.record_cases(job.chapter, job.source)  # job goes (Dask workers read them)
    with _stopped_between_results() as stopping:
        for index, outcome in runner(grader, jobs):
            if stopping.is_set():  # a notebook ended by Ctrl-C is not graded
                raise KeyboardInterrupt
            _record(todo[index], outcome, on_result)
        if stopping.is_set():
            raise KeyboardInterrupt


def _record(submission: Submission, outcome: Outcome | Exception,
            on_result: Callable[[Submission], None]) -> None:
    """A submission's outcome kept on it, then ``on_result``."""
    if isinstance(outcome, Exception):
        submission.refuse(str(outcome))
        submission.grader_failed = isinstance(outcome, GraderFailure)
    else:
        submission.result, submission.executed = outcome.result, outcome.executed
        submission.result.timestamp = submission.when
    on_result(submission)


@dataclass
class ClassRun:
    """Where a class is graded from and into: its course directory (``course``), the files
    the run writes, and whether every hand-in is graded again (``regrade``: ``--regrade``, or
    the hand-ins ``--student`` and ``--assignment`` chose, the only ones given)."""

    course: ClassCourse
    grader: Grader
    known: dict[str, Chapter]
    state: Path
    csv: Path
    runner: Runner
    json: Path | None = None
    regrade: bool = False
    stopped: str = ""  # why the run stopped before the end (Ctrl-C, the gradebook changed)
    unproven: str = ""  # why nothing was graded: the grader failed its proof (``proof``)


def grade_class(run: ClassRun, entries: list[Submission], progress: bool = True
                ) -> list[Submission]:
    """Grade a class (see the module's docstring); return every submission, in a stable
    order. Stopped (Ctrl-C, or the gradebook written by another program), it says why in
    ``run.stopped``, and still writes the CSV and JSON of what it did. Where the grader fails
    its proof (``proof.prove``: a chapter's own solution short of full marks here), nothing
    is staged, graded or recorded, ``run.unproven`` says why, and every hand-in is refused
    saying so (a CSV row each, beside the gradebook's earlier grades)."""
    from autograder.host.gradebook import GradebookTampered
    from autograder.host.proof import prove
    from autograder.host.recording import NotRecorded

    read(entries, run.known)
    course = run.course
    state = _load_state(run.state)
    done = 0

    def on_result(entry: Submission) -> None:
        nonlocal done
        if entry.result.graded:
            try:
                course.record(entry.learner, entry.chapter, entry.executed)
            except NotRecorded as exc:
                entry.refuse(f"nbgrader could not record its grade ({exc})")
            else:
                entry.result.penalty = course.penalty(entry.learner, entry.chapter)
                _remember(state, entry, run.state)
        elif not entry.grader_failed:
            _record_refused(course, entry)
        done += 1
        if progress:
            _progress(done, todo, entry)

    try:
        prove(run.grader, [(e.target, e.language) for e in entries
                           if e.target is not None and e.result is None])
        # the chapters graded, and those a refused hand-in's place names (nbgrader records
        # it there, waiting for manual grading, even where no one else handed that one in)
        for chapter in dict.fromkeys(e.target.name if e.target else e.chapter for e in entries
                                     if e.target or e.path and e.learner and not e.ignored):
            if chapter in run.known:
                course.register(chapter)
        inputs_of = _inputs(run, *course.book.deadlines())
        for entry in entries:
            if entry.target is not None:
                course.stage(entry.path, entry.learner, entry.chapter, entry.timestamp)
                entry.inputs = inputs_of(entry)
                _decide(entry, state, run)
            else:  # refused as it was read (damaged, another chapter's content)
                _record_refused(course, entry)
        todo = sum(e.result is None and e.target is not None for e in entries)
        grade(entries, run.grader, run.runner, on_result)
    except GraderFailure as exc:  # before anything was staged, graded or recorded
        run.unproven = str(exc)
        for entry in entries:
            if entry.result is None and entry.target is not None:
                entry.refuse(f"not graded: the grader cannot grade here ({exc})")
                entry.grader_failed = True
    except KeyboardInterrupt:
        run.stopped = "stopped (Ctrl-C)"
    except (GradebookTampered, NotRecorded) as exc:  # NotRecorded: a chapter not registered
        run.stopped = f"stopped: {exc}"
    finally:
        for entry in entries:
            if entry.result is None:  # stopped first: nothing of it recorded, no page
                entry.refuse("not graded: grading stopped before it was")
            elif not entry.result.graded and entry.learner and not entry.ignored and \
                    not entry.grader_failed:  # the grader's failure: nothing of it recorded
                course.add_learner(entry.learner)
                page = course.feedback(entry.learner, entry.chapter)
                if not page.exists():  # never over a page nbgrader wrote
                    _refusal_page(entry, page)
                    course.label_page(entry.learner, entry.chapter, entry.timestamp)
            elif entry.result.graded:  # kept ones too: the penalty nbgrader holds now
                entry.result.penalty = course.penalty(entry.learner, entry.chapter)
        write_csv(run.csv, course, entries)
        if run.json:
            run.json.write_text(json.dumps([e.to_json() for e in entries], indent=2) + "\n",
                                encoding="utf-8")
    return entries


def _inputs(run: ClassRun, due: dict[str, str], extension: dict[tuple[str, str], str]
            ) -> Callable[[Submission], Inputs]:
    """What decides each hand-in's grade (``freshness.Inputs``), given the gradebook's due
    dates and extensions; each chapter's source and checks read once."""
    nbgrader, course_version = versions()
    source = cache(lambda path: digest([path]))
    checks = cache(lambda chapter, path: digest(checks_of(chapter, path)))

    def inputs_of(entry: Submission) -> Inputs:
        return Inputs(entry.digest, source(entry.target.source_in(entry.language)),
                      checks(entry.target.name, entry.target.source), nbgrader, course_version,
                      due.get(entry.chapter, ""), extension.get((entry.learner, entry.chapter), ""),
                      run.course.late_penalty, entry.when)

    return inputs_of


def _decide(entry: Submission, state: dict, run: ClassRun) -> None:
    """Whether the staged hand-in is run again, recorded again, or keeps its earlier result
    (``freshness.decide``), and why; a recording again is done here."""
    from autograder.host.recording import NotRecorded

    kept = state.get(_key(entry))
    verdict = decide(entry.inputs, kept, run.course.autograded(entry.learner, entry.chapter)
                     .exists(), run.regrade)
    entry.reason = verdict.reason
    entry.regraded = verdict.action == REGRADE
    if verdict.action not in (RECORD, KEEP):
        return
    entry.result = NotebookResult.from_json(kept["result"])
    entry.result.notebook, entry.result.timestamp = entry.origin, entry.when
    entry.reused = True
    if verdict.action == RECORD:
        try:  # not run again: nbgrader records its run with the new due date, penalty, time
            run.course.rerecord(entry.learner, entry.chapter)
        except NotRecorded as exc:
            entry.refuse(f"nbgrader could not record it again ({exc})")
        else:
            entry.rerecorded = True
            _remember(state, entry, run.state)


def _remember(state: dict, entry: Submission, path: Path) -> None:
    state[_key(entry)] = {"inputs": entry.inputs.to_json(), "result": entry.result.to_json()}
    path.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def _key(entry: Submission) -> str:
    return json.dumps([entry.learner, entry.chapter])


def _load_state(path: Path) -> dict:
    if not path.exists():
        return {}
    state = json.loads(path.read_text(encoding="utf-8"))
    # keep only entries keyed by (learner, chapter); older keys are graded again
    return {k: v for k, v in state.items() if k.startswith("[")}


def write_csv(destination: Path, course: ClassCourse, entries: list[Submission]) -> None:
    """``nbgrader export``'s rows (every learner for every chapter the gradebook holds), then
    a row for every file of this run not graded.

    Columns: ``nbgrader export``'s, then status (graded, regraded, rerecorded, unchanged,
    graded earlier, not submitted, not graded, ignored), file and message (for a hand-in
    graded in this run: why it was or was not graded again; else why it was not graded)."""
    columns, rows = course.export()
    this_run = {(e.learner, e.chapter): e for e in entries if e.result.graded or e.flagged}
    with open(destination, "w", newline="", encoding="utf-8") as handle:
        out = csv.DictWriter(handle, [*columns, "status", "file", "message"], restval="")
        out.writeheader()
        for row in rows:
            entry = this_run.get((row["student_id"], row["assignment"]))
            status = entry.status if entry else \
                "graded earlier" if row["timestamp"] else "not submitted"
            out.writerow(row | {"status": status, "file": entry.origin if entry else "",
                                "message": _message(entry)})
        for entry in entries:
            if not entry.result.graded and not entry.flagged:
                out.writerow({"assignment": entry.chapter, "timestamp": entry.when,
                              "student_id": entry.learner, "status": entry.status,
                              "file": entry.origin, "message": entry.result.error})


def _message(entry: Submission | None) -> str:
    """The message column of a gradebook row this run recorded: why a graded hand-in was
    (or was not) graded again; why one not graded was not."""
    if entry is None:
        return ""
    return entry.reason if entry.result.graded else entry.result.error


def _record_refused(course: ClassCourse, entry: Submission) -> None:
    """A refused hand-in whose file names a learner and a chapter the gradebook holds, staged
    and recorded as nbgrader's autograde records a notebook it fails on
    (``ClassCourse.record_refused``): formgrader lists it, waiting for manual grading."""
    if entry.path is None or not entry.learner or entry.ignored or \
            not course.book.is_registered(entry.chapter):
        return
    course.stage(entry.path, entry.learner, entry.chapter, entry.timestamp)
    course.record_refused(entry.learner, entry.chapter)
    entry.flagged = True


def _refusal_page(entry: Submission, destination: Path) -> None:
    import html

    destination.parent.mkdir(parents=True, exist_ok=True)
    destination.write_text(
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(entry.chapter)}"
        f"</title></head><body><h2>{html.escape(entry.chapter)}: not graded</h2>"
        f"<p>{html.escape(_shown(entry.origin))}</p><p>{html.escape(entry.result.error)}</p>"
        "</body></html>\n", encoding="utf-8")


def _shown(origin: str) -> str:
    """A file as a learner's page names it: a zip's entry, or the file's name, never the
    server's folders."""
    return origin if ".zip:" in origin else Path(origin).name


def _progress(done: int, total: int, entry: Submission) -> None:
    width = 30
    total = max(total, 1)
    bar = "#" * (width * done // total) + "." * (width - width * done // total)
    result = entry.result
    outcome = f"{result.score:g}/{result.max_score:g}" if result.graded else "not graded"
    if result.graded and result.penalty:
        outcome += f" (late penalty {result.penalty:g}, from {result.raw_score:g})"
    print(f"[{bar}] {done}/{total} {entry.learner} {entry.origin}: {outcome}",
          file=sys.stderr, flush=True)
