"""Grading a whole class into its nbgrader course directory: every hand-in found gets exactly
one row, and the course directory ends as nbgrader's own ``autograde`` would leave it.

    found (``layouts.collect``) -> read and recognised (``submission.read``) -> staged in
    ``submitted/`` (``recording.ClassCourse.stage``) -> graded (``autograde``, by a pool of
    threads or a Dask cluster), or reused when neither it nor what grades it changed ->
    recorded by nbgrader (``recording``: gradebook, late penalty, ``autograded/``, feedback
    page) -> CSV (``nbgrader export``'s rows), JSON

A hand-in is keyed by (learner, chapter). One that cannot be graded (damaged, two files for
one learner and chapter, a path that names no learner, a notebook whose content is another
chapter than its name says) is not graded, keeps whatever grade the gradebook held, and gets
a row, a JSON entry, an error line, and a page where the learner has none yet. A notebook
beside the chapter's own in a hand-in folder is ignored, as nbgrader ignores it, with a row
that says so. Only this process writes the course directory and the state file.
"""

from __future__ import annotations

import csv
import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autograder import kernel_side
from autograder.host.autograde import Grader, Outcome, grader_failed
from autograder.host.chapters import Chapter, NotGradable
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
    """Where a class is graded from and into: its course directory (``course``), the files
    the run writes, and whether every hand-in is graded again (``regrade``)."""

    course: ClassCourse
    grader: Grader
    known: dict[str, Chapter]
    state: Path
    csv: Path
    runner: Runner
    json: Path | None = None
    regrade: bool = False
    stopped: str = ""  # why the run stopped before the end (Ctrl-C, the gradebook changed)


def grade_class(run: ClassRun, entries: list[Submission], progress: bool = True
                ) -> list[Submission]:
    """Grade a class (see the module's docstring); return every submission, in a stable
    order. Stopped (Ctrl-C, or the gradebook written by another program), it says why in
    ``run.stopped``, and still writes the CSV and JSON of what it did."""
    from autograder.host.gradebook import GradebookTampered
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
                _remember(state, entry, run.state)
        done += 1
        if progress:
            _progress(done, todo, entry)

    try:
        for chapter in dict.fromkeys(e.target.name for e in entries if e.target):
            course.register(chapter)
        for entry in entries:
            if entry.target is not None:
                course.stage(entry.path, entry.learner, entry.chapter, entry.timestamp)
                _reuse(entry, state.get(_key(entry)), run)
                if entry.reused and state[_key(entry)].get("timestamp") != entry.when:
                    try:  # handed in again, unchanged: its new time may change its penalty
                        course.rerecord(entry.learner, entry.chapter)
                    except NotRecorded as exc:
                        entry.refuse(f"nbgrader could not record its new time ({exc})")
                    else:
                        _remember(state, entry, run.state)
        todo = sum(e.result is None and e.target is not None for e in entries)
        grade(entries, run.grader, run.runner, on_result)
    except KeyboardInterrupt:
        run.stopped = "stopped (Ctrl-C)"
    except (GradebookTampered, NotRecorded) as exc:  # NotRecorded: a chapter not registered
        run.stopped = f"stopped: {exc}"
    finally:
        for entry in entries:
            if entry.result is None:  # stopped first: nothing of it recorded, no page
                entry.refuse("not graded: grading stopped before it was")
            elif not entry.result.graded and entry.learner and not entry.ignored:
                course.add_learner(entry.learner)
                page = course.feedback(entry.learner, entry.chapter)
                if not page.exists():  # never over a page nbgrader wrote
                    _refusal_page(entry, page)
        write_csv(run.csv, course, entries)
        if run.json:
            run.json.write_text(json.dumps([e.to_json() for e in entries], indent=2) + "\n",
                                encoding="utf-8")
    return entries


def _reuse(entry: Submission, before: dict | None, run: ClassRun) -> None:
    """Take the earlier result where neither the file nor what grades it changed (and not
    ``run.regrade``); mark a regrade where only what grades it changed."""
    entry.graded_by = graded_by(entry)
    same_file = bool(before) and before["sha256"] == entry.digest
    if same_file and not run.regrade and before.get("graded_by") == entry.graded_by and \
            run.course.autograded(entry.learner, entry.chapter).exists():
        entry.result = NotebookResult.from_json(before["result"])
        entry.result.notebook, entry.result.timestamp = entry.origin, entry.when
        entry.reused = True
    elif same_file:
        entry.regraded = True


def graded_by(entry: Submission) -> str:
    """What a grade depends on besides the hand-in: the chapter's source (the class's own, in
    the notebook's language), the checks of the chapter and those all chapters share, and
    nbgrader's version. A change to any of them grades the chapter's hand-ins again."""
    from importlib import metadata

    digest = hashlib.sha256(metadata.version("nbgrader").encode())
    digest.update(entry.target.source_in(entry.language).read_bytes())
    for path in checks_of(entry.target.number):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def checks_of(number: str) -> list[Path]:
    """The grader's code that decides chapter ``number``'s grades: its visible and hidden
    checks, what every chapter's checks share, and the rest of the kernel side (the guard,
    its arming, the tripwires)."""
    package = Path(__file__).parents[1]
    return [path for folder in ("checks", "hidden") for path in
            sorted((package / folder).glob("*.py"))
            if path.name.startswith(("_", f"ch{number}"))] + kernel_side()


def _remember(state: dict, entry: Submission, path: Path) -> None:
    state[_key(entry)] = {"sha256": entry.digest, "graded_by": entry.graded_by,
                          "timestamp": entry.when, "result": entry.result.to_json()}
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

    Columns: ``nbgrader export``'s, then status (graded, regraded, unchanged, graded
    earlier, not submitted, not graded, ignored), file and message."""
    columns, rows = course.export()
    this_run = {(e.learner, e.chapter): e for e in entries if e.result.graded}
    with open(destination, "w", newline="", encoding="utf-8") as handle:
        out = csv.DictWriter(handle, [*columns, "status", "file", "message"], restval="")
        out.writeheader()
        for row in rows:
            entry = this_run.get((row["student_id"], row["assignment"]))
            status = entry.status if entry else \
                "graded earlier" if row["timestamp"] else "not submitted"
            out.writerow(row | {"status": status, "file": entry.origin if entry else ""})
        for entry in entries:
            if not entry.result.graded:
                out.writerow({"assignment": entry.chapter, "timestamp": entry.when,
                              "student_id": entry.learner, "status": entry.status,
                              "file": entry.origin, "message": entry.result.error})


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
    print(f"[{bar}] {done}/{total} {entry.learner} {entry.origin}: {outcome}",
          file=sys.stderr, flush=True)
