"""Grading throughput: notebooks graded per minute for a synthetic class.

    python -m autograder.bench [--learners 50] [--jobs 1 2] [--sandbox auto|on|off]

Learner i hands in chapter i mod (number of chapters): correct (the course's solutions),
partial (the first half of the TODOs solved) or broken (an endless loop, a syntax error or a
crashing kernel in the last TODO), in turn. Each ``--jobs`` value grades the whole class with
``grade-all`` from scratch (a fresh gradebook, per-cell limit 20 s, ``--sandbox`` as given)
and prints notebooks per minute.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from autograder.chapters import chapters
from autograder.synthetic import BREAKAGES, broken, solved


def synthetic_class(folder: Path, learners: int) -> None:
    known = list(chapters().values())
    kinds = ["correct", "partial", *BREAKAGES]
    for index in range(learners):
        chapter = known[index % len(known)]
        kind = kinds[index % len(kinds)]
        if kind == "correct":
            notebook = solved(chapter)
        elif kind == "partial":
            notebook = solved(chapter, fraction=0.5)
        else:
            notebook = broken(chapter, BREAKAGES[kind])
        path = folder / f"learner-{index:03d}-{kind}" / f"{chapter.name}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(notebook, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learners", type=int, default=50)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--sandbox", choices=["auto", "on", "off"], default="auto",
                        help="grade-all's --sandbox (default: auto)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kv-course-bench-") as scratch:
        uploads = Path(scratch) / "uploads"
        synthetic_class(uploads, args.learners)
        print(f"{args.learners} learners, chapters and kinds in turn; "
              f"`python -m autograder.bench --learners {args.learners} --sandbox "
              f"{args.sandbox}`")
        for jobs in args.jobs:
            run = Path(scratch) / f"jobs-{jobs}"
            run.mkdir()
            started = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "autograder", "grade-all", str(uploads), "--jobs",
                 str(jobs), "--cell-timeout", "20", "--sandbox", args.sandbox], cwd=run,
                capture_output=True, text=True)
            minutes = (time.monotonic() - started) / 60
            rows = (run / "grades.csv").read_text().count("\n") - 1
            print(f"--jobs {jobs}: {args.learners} notebooks in {minutes * 60:.0f} s = "
                  f"{args.learners / minutes:.1f} notebooks per minute ({rows} gradebook "
                  f"rows, exit code {done.returncode})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
