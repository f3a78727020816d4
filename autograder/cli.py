"""``python -m autograder``: grade notebooks through nbgrader, grade a class, release exercises.

    python -m autograder grade NOTEBOOK... [--json FILE]
    python -m autograder grade-all DIR [--db URL] [--csv FILE] [--json FILE]
    python -m autograder release
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

from autograder.chapters import Chapter, NotGradable, chapters, load_submission, recognise
from autograder.report import NotebookResult, format_report


def _runtime_label() -> str:
    from course.runtime import detect

    return detect().label


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    grade = commands.add_parser("grade", help="grade notebooks and print a report per test")
    grade.add_argument("notebooks", nargs="+", type=Path, metavar="NOTEBOOK")
    grade.add_argument("--json", type=Path, metavar="FILE",
                       help="also write the results as JSON (a list when several notebooks)")
    _limits(grade)

    class_ = commands.add_parser("grade-all", help="grade DIR/<learner>/<notebook>.ipynb "
                                 "into an nbgrader gradebook and export a CSV")
    class_.add_argument("directory", type=Path, metavar="DIR")
    class_.add_argument("--db", default="sqlite:///gradebook.db",
                        help="gradebook, any SQLAlchemy URL (default: sqlite:///gradebook.db)")
    class_.add_argument("--csv", type=Path, default=Path("grades.csv"),
                        help="where to export the scores (default: grades.csv)")
    class_.add_argument("--json", type=Path, metavar="FILE", help="also write results as JSON")
    class_.add_argument("--course-dir", type=Path, metavar="DIR",
                        help="keep nbgrader's course directory here (default: a temporary one)")
    _limits(class_)

    commands.add_parser("release", help="regenerate exercises/ from solutions/ with nbgrader")
    return parser


def _limits(command: argparse.ArgumentParser) -> None:
    command.add_argument("--cell-timeout", type=int, default=120, metavar="SECONDS",
                         help="time limit for one cell (default: 120)")
    command.add_argument("--notebook-timeout", type=int, default=900, metavar="SECONDS",
                         help="time limit for one whole notebook (default: 900)")


def _absolute_db(url: str) -> str:
    """``sqlite:///relative.db`` relative to where the command runs, not to nbgrader's root."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/"):
        return prefix + str(Path(url[len(prefix):]).resolve())
    return url


def _learner_id(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", name) or "learner"


def grade(paths: list[Path], course_root: Path, db_url: str = "", cell_timeout: int = 120,
          notebook_timeout: int = 900, learners: list[str] | None = None
          ) -> tuple[list[NotebookResult], list[str]]:
    """Grade each notebook; return the results and one error line per file that was not."""
    from autograder.pipeline import GradingCourse

    known = chapters()
    course = GradingCourse(course_root, db_url, cell_timeout, notebook_timeout, _runtime_label())
    results, errors = [], []
    for index, path in enumerate(paths):
        learner = learners[index] if learners else f"learner-{index + 1:03d}"
        try:
            chapter: Chapter = recognise(path, load_submission(path), known)
            results.append(course.autograde(chapter, learner, path))
        except NotGradable as exc:
            errors.append(str(exc))
    return results, errors


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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "release":
        from autograder.release import release_all

        for path in release_all():
            print(f"wrote {path}")
        return 0

    if args.command == "grade":
        with tempfile.TemporaryDirectory(prefix="kv-course-grade-") as root:
            results, errors = grade(args.notebooks, Path(root), "", args.cell_timeout,
                                    args.notebook_timeout)
        if args.json:
            _write_json(args.json, results, always_list=len(args.notebooks) > 1)
        return _finish(results, errors)

    # grade-all: DIR/<learner>/<notebook>.ipynb
    if not args.directory.is_dir():
        print(f"error: {args.directory}: not a directory", file=sys.stderr)
        return 1
    paths, learners = [], []
    for learner_dir in sorted(p for p in args.directory.iterdir() if p.is_dir()):
        for notebook in sorted(learner_dir.glob("*.ipynb")):
            paths.append(notebook)
            learners.append(_learner_id(learner_dir.name))
    if not paths:
        print(f"error: {args.directory}: no DIR/<learner>/<notebook>.ipynb found", file=sys.stderr)
        return 1
    from autograder.pipeline import GradingCourse

    with tempfile.TemporaryDirectory(prefix="kv-course-class-") as scratch:
        root = args.course_dir or Path(scratch)
        db_url = _absolute_db(args.db)
        results, errors = grade(paths, root, db_url, args.cell_timeout, args.notebook_timeout,
                                learners)
        GradingCourse(root, db_url).export_csv(args.csv)
    if args.json:
        _write_json(args.json, results, always_list=True)
    code = _finish(results, errors)
    print(f"{len(results)} notebook(s) graded into {args.db}; scores exported to {args.csv}")
    return code
