"""``python -m autograder``: grade notebooks through nbgrader, grade a class, release exercises.

    python -m autograder grade NOTEBOOK... [--json FILE] [--jobs N]
    python -m autograder grade-all DIR|ZIP [--db URL] [--csv FILE] [--json FILE] [--jobs N]
                                   [--feedback DIR] [--state FILE]
    python -m autograder release
    python -m autograder repository URL

``grade-all`` takes a folder of ``<learner>/<NN_slug>.ipynb`` (nbgrader's ``collect`` writes
``submitted/<learner>/<NN_slug>/<NN_slug>.ipynb``, also accepted), or a zip of uploads from
a learning platform holding either layout or flat files named ``<learner>_<NN_slug>.ipynb``.
It grades N submissions at a time, shows progress, writes every learner's feedback page,
exports CSV (and JSON), and resumes: a submission whose content is unchanged since it was
last graded (by SHA-256, recorded in the state file) is not graded again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from autograder.chapters import Chapter, NotGradable, chapters, load_submission, recognise
from autograder.pipeline import GradingCourse, Limits
from autograder.report import NotebookResult, TestResult, format_report

_CHAPTER_NAME = re.compile(r"(\d\d_[a-z0-9_]+)\.ipynb$")


def _runtime_label() -> str:
    from course.runtime import detect

    return detect().label


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    grade_ = commands.add_parser("grade", help="grade notebooks and print a report per test")
    grade_.add_argument("notebooks", nargs="+", type=Path, metavar="NOTEBOOK")
    grade_.add_argument("--json", type=Path, metavar="FILE",
                        help="also write the results as JSON (a list when several notebooks)")
    _limits(grade_, default_jobs=1)

    class_ = commands.add_parser("grade-all", help="grade a class into an nbgrader gradebook, "
                                 "with feedback pages, CSV and JSON")
    class_.add_argument("submissions", type=Path, metavar="DIR|ZIP")
    class_.add_argument("--db", default="sqlite:///gradebook.db",
                        help="gradebook, any SQLAlchemy URL (default: sqlite:///gradebook.db)")
    class_.add_argument("--csv", type=Path, default=Path("grades.csv"),
                        help="where to export the scores (default: grades.csv)")
    class_.add_argument("--json", type=Path, metavar="FILE", help="also write results as JSON")
    class_.add_argument("--feedback", type=Path, default=Path("feedback"), metavar="DIR",
                        help="feedback pages, DIR/<learner>/<NN_slug>.html (default: feedback)")
    class_.add_argument("--state", type=Path, default=Path("grading-state.json"),
                        metavar="FILE", help="what was graded, by content hash, for resuming "
                        "(default: grading-state.json)")
    class_.add_argument("--course-dir", type=Path, metavar="DIR",
                        help="keep nbgrader's course directory here (default: a temporary one)")
    _limits(class_, default_jobs=os.cpu_count() or 1)

    commands.add_parser("release", help="regenerate exercises/ from solutions/ with nbgrader")
    where = commands.add_parser("repository", help="set the repository URL that Colab installs "
                                "from and the README's Colab links open (then `release`)")
    where.add_argument("url", help="for example https://github.com/you/paged-kv-course")
    return parser


def _limits(command: argparse.ArgumentParser, default_jobs: int) -> None:
    command.add_argument("--cell-timeout", type=int, default=120, metavar="SECONDS",
                         help="time limit for one cell (default: 120)")
    command.add_argument("--notebook-timeout", type=int, default=900, metavar="SECONDS",
                         help="time limit for one whole notebook (default: 900)")
    command.add_argument("--memory-limit", type=float, default=4.0, metavar="GIB",
                         help="address space for each grading process and its kernel, on "
                         "CPU-only machines (default: 4; 0: none)")
    command.add_argument("--jobs", type=int, default=default_jobs, metavar="N",
                         help=f"notebooks graded at once (default: {default_jobs})")


def _limits_of(args: argparse.Namespace) -> Limits:
    cores = os.cpu_count() or 1
    threads = max(1, cores // args.jobs) if args.jobs > 1 else None  # the cores, shared
    return Limits(args.cell_timeout, args.notebook_timeout, args.memory_limit or None, threads)


def _absolute_db(url: str) -> str:
    """``sqlite:///relative.db`` relative to where the command runs, not to nbgrader's root."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/"):
        return prefix + str(Path(url[len(prefix):]).resolve())
    return url


def _learner_id(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", name) or "learner"


@dataclass
class Submission:
    path: Path
    learner: str
    feedback: Path | None = None


def grade(submissions: list[Submission], course: GradingCourse, jobs: int = 1,
          progress: bool = False, done_already: dict[int, NotebookResult] | None = None
          ) -> tuple[list[NotebookResult | None], list[str]]:
    """Grade each submission (``jobs`` at a time) and record it in ``course``'s gradebook;
    return the results in order (None for a file that was not graded) and one error line per
    such file. ``done_already`` maps indices to results to reuse instead of grading."""
    known = chapters()
    results: list[NotebookResult | None] = [None] * len(submissions)
    errors: dict[int, str] = {}
    work: dict[int, Chapter] = {}
    for index, submission in enumerate(submissions):
        if done_already and index in done_already:
            results[index] = done_already[index]
            continue
        try:
            work[index] = recognise(submission.path, load_submission(submission.path), known)
            course.release(work[index])  # once per chapter, before the threads start
        except NotGradable as exc:
            errors[index] = str(exc)
    finished = len(submissions) - len(work)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(course.autograde, chapter, submissions[i].learner,
                               submissions[i].path, submissions[i].feedback): i
                   for i, chapter in work.items()}
        for future in as_completed(futures):
            index = futures[future]
            try:
                results[index] = future.result()
                course.record(submissions[index].learner, results[index])
            except NotGradable as exc:
                errors[index] = str(exc)
            finished += 1
            if progress:
                _progress(finished, len(submissions), submissions[index], results[index])
    return results, [errors[i] for i in sorted(errors)]


def _progress(done: int, total: int, submission: Submission,
              result: NotebookResult | None) -> None:
    width = 30
    bar = "#" * (width * done // total) + "." * (width - width * done // total)
    outcome = (f"{result.score:g}/{result.max_score:g}" if result is not None
               else "not gradable")
    print(f"[{bar}] {done}/{total} {submission.learner} {submission.path.name}: {outcome}",
          file=sys.stderr, flush=True)


def _write_json(destination: Path, results: list[NotebookResult], always_list: bool) -> None:
    payload = [r.to_json() for r in results]
    if len(payload) == 1 and not always_list:
        payload = payload[0]
    destination.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


def _finish(results: list[NotebookResult], errors: list[str]) -> int:
    for result in results:
        print(format_report(result))
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    return 1 if errors else 0


def collect(folder: Path) -> list[Submission]:
    """Every submission under ``folder``: ``<learner>/<NN_slug>.ipynb``,
    ``submitted/<learner>/<NN_slug>/<NN_slug>.ipynb`` (nbgrader's collect) or flat
    ``<learner>_<NN_slug>.ipynb`` (a platform's download), in a stable order."""
    found = []
    for path in sorted(folder.rglob("*.ipynb")):
        relative = path.relative_to(folder).parts
        if any(part.startswith(".") for part in relative):
            continue  # .ipynb_checkpoints and the like
        if relative[0] == "submitted" and len(relative) == 4:
            learner = relative[1]
        elif len(relative) >= 2:
            learner = relative[-2]
        else:
            match = _CHAPTER_NAME.search(path.name)
            learner = path.name[:match.start()].rstrip("_-") if match else path.stem
        found.append(Submission(path, _learner_id(learner)))
    return found


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _result_from_json(data: dict) -> NotebookResult:
    return NotebookResult(data["notebook"], data["chapter"], data["runtime"],
                          [TestResult(**t) for t in data["tests"]])


def _grade_class(args: argparse.Namespace, folder: Path) -> int:
    submissions = collect(folder)
    if not submissions:
        print(f"error: {args.submissions}: no <learner>/<NN_slug>.ipynb found", file=sys.stderr)
        return 1
    state = json.loads(args.state.read_text()) if args.state.exists() else {}
    keys = [f"{s.learner}/{s.path.name}" for s in submissions]
    digests = [_digest(s.path) for s in submissions]
    reuse = {i: _result_from_json(state[k]["result"]) for i, k in enumerate(keys)
             if k in state and state[k]["sha256"] == digests[i]}
    for submission in submissions:
        match = _CHAPTER_NAME.search(submission.path.name)
        page = match.group(1) if match else submission.path.stem
        submission.feedback = args.feedback.resolve() / submission.learner / f"{page}.html"
    with tempfile.TemporaryDirectory(prefix="kv-course-class-") as scratch:
        course = GradingCourse(args.course_dir or Path(scratch), _absolute_db(args.db),
                               _limits_of(args), _runtime_label())
        results, errors = grade(submissions, course, args.jobs, progress=True,
                                done_already=reuse)
        course.export_csv(args.csv)
    for key, digest, result in zip(keys, digests, results, strict=True):
        if result is not None:
            state[key] = {"sha256": digest, "result": result.to_json()}
    args.state.write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
    graded = [r for r in results if r is not None]
    if args.json:
        _write_json(args.json, graded, always_list=True)
    code = _finish(graded, errors)
    print(f"{len(graded)} notebook(s) graded into {args.db} ({len(reuse)} unchanged since "
          f"the last run, not graded again); scores exported to {args.csv}; feedback in "
          f"{args.feedback}")
    return code


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "release":
        from autograder.release import release_all

        for path in release_all():
            print(f"wrote {path}")
        return 0

    if args.command == "repository":
        from autograder.chapters import chapters
        from autograder.repository import set_url

        try:
            set_url(args.url, list(chapters().values()))
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"pyproject.toml, the solutions' setup cells and the README's Colab links now "
              f"point at {args.url}; run `make exercises` and commit")
        return 0

    if args.command == "grade":
        with tempfile.TemporaryDirectory(prefix="kv-course-grade-") as root:
            course = GradingCourse(Path(root), "", _limits_of(args), _runtime_label())
            submissions = [Submission(p, f"learner-{i + 1:03d}")
                           for i, p in enumerate(args.notebooks)]
            results, errors = grade(submissions, course, args.jobs)
        graded = [r for r in results if r is not None]
        if args.json:
            _write_json(args.json, graded, always_list=len(args.notebooks) > 1)
        return _finish(graded, errors)

    source = args.submissions
    if source.is_file() and zipfile.is_zipfile(source):
        with tempfile.TemporaryDirectory(prefix="kv-course-uploads-") as unpacked:
            with zipfile.ZipFile(source) as archive:
                archive.extractall(unpacked)
            return _grade_class(args, Path(unpacked))
    if not source.is_dir():
        print(f"error: {source}: not a directory or a zip file", file=sys.stderr)
        return 1
    return _grade_class(args, source)
