"""Grading throughput: notebooks graded per minute for a synthetic class, and where one
notebook's time goes.

    python -m autograder.builder.bench [--learners 50] [--jobs 1 2] [--dask local:2]
        [--sandbox auto|on|off]
    python -m autograder.builder.bench --breakdown [--repeat 3] [--sandbox auto|on|off]
    python -m autograder bench --vs-nbgrader [--repeat 5] [--chapters 1-9]

Learner i hands in chapter i mod (number of chapters): correct (the course's solutions),
partial (the first half of the TODOs solved) or broken (an endless loop, a syntax error or a
crashing kernel in the last TODO), in turn. Each ``--jobs`` value grades the whole class with
``grade-all`` from scratch (a fresh gradebook, per-cell limit 20 s, ``--sandbox`` as given)
and prints notebooks per minute; so does each ``--dask`` address (``local:N``: N worker
processes on this machine).

``--breakdown`` grades each chapter's solution notebook alone (``--repeat`` times, the median
kept) and prints where its time went (``parts_of``): copying its course, nbgrader
and the kernel starting, the imports and set-up before the first cell, the notebook's own
cells, the test cells, nbgrader after the last cell; and the part that is not the tests.

``--vs-nbgrader`` grades each chapter's solution with the grader and with stock nbgrader,
paired, and prints wall time, CPU time and peak memory with their ratios
(``autograder.builder.versus``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import nbformat

from autograder.builder.synthetic import BREAKAGES, broken, solved
from autograder.host.chapters import chapters

if TYPE_CHECKING:  # the grader itself is loaded only by what grades
    from autograder.host.autograde import Outcome


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


def parts_of(outcome: Outcome) -> dict[str, float]:
    """Where one notebook's grading time went, from its outcome's marks (``Outcome.marks``)
    and the executed notebook's cell times: copying its course, nbgrader and the kernel
    starting, the imports and set-up before the first cell (``arming``; when the kernel
    wrote no times, they count as nbgrader's), the notebook's own cells (set-up, answers,
    demonstrations), the test cells, and nbgrader after the last cell."""
    import datetime as dt

    marks = outcome.marks
    started = marks["nbgrader_started"]
    armed_from, armed_to = marks.get("armed", (started, started))
    cells, tests, last = 0.0, 0.0, None
    for cell in outcome.executed.cells:
        times = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" not in times or "shell.execute_reply" not in times:
            continue
        began = dt.datetime.fromisoformat(times["iopub.execute_input"]).timestamp()
        last = dt.datetime.fromisoformat(times["shell.execute_reply"]).timestamp()
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade"):
            tests += last - began
        else:
            cells += last - began
    return {"course copy": marks["place"] - marks["strip_demonstrations"],
            "nbgrader and kernel start": armed_from - started,
            "imports and set-up": armed_to - armed_from,
            "notebook's own cells": cells, "test cells": tests,
            "nbgrader after the last cell": marks["run_nbgrader"] - (last or marks["run_nbgrader"])}


def breakdown(repeat: int, sandbox: bool) -> dict[str, dict[str, float]]:
    """Chapter -> part -> seconds (the median of ``repeat`` gradings of its solution)."""
    import statistics

    from autograder.host.autograde import Grader, Job, Limits
    from course.runtime import detect

    grader = Grader(Limits(sandbox=sandbox), detect().label)
    found = {}
    for chapter in chapters().values():
        source = chapter.source.read_text(encoding="utf-8")
        grader.template(chapter.name, source)  # released before timing, as grade-all does
        runs = [parts_of(grader.autograde(Job(chapter.name, source, "learner",
                                              str(chapter.source),
                                              nbformat.reads(source, as_version=4))))
                for _ in range(repeat)]
        found[chapter.name] = {part: statistics.median(run[part] for run in runs)
                               for part in runs[0]}
    return found


def _breakdown_table(found: dict[str, dict[str, float]]) -> str:
    parts = list(next(iter(found.values())))
    lines = [f"{'chapter':<38}" + "".join(f"{p[:14]:>15}" for p in parts) + f"{'not tests':>11}"]
    for chapter, times in found.items():
        fixed = sum(v for p, v in times.items() if p != "test cells")
        lines.append(f"{chapter:<38}" + "".join(f"{times[p]:>15.2f}" for p in parts)
                     + f"{fixed:>11.2f}")
    mean = {p: sum(t[p] for t in found.values()) / len(found) for p in parts}
    fixed = sum(v for p, v in mean.items() if p != "test cells")
    lines.append(f"{'mean':<38}" + "".join(f"{mean[p]:>15.2f}" for p in parts)
                 + f"{fixed:>11.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder bench",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--breakdown", action="store_true",
                        help="where one notebook's time goes, per chapter (seconds)")
    parser.add_argument("--vs-nbgrader", action="store_true",
                        help="the grader against stock nbgrader, per chapter")
    parser.add_argument("--chapters", default="all", help="with --vs-nbgrader: for example "
                        "1-3 (default: all)")
    parser.add_argument("--repeat", type=int, default=None,
                        help="runs per notebook (default: 3, or 5 with --vs-nbgrader)")
    parser.add_argument("--learners", type=int, default=50)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--sandbox", choices=["auto", "on", "off"], default="auto",
                        help="grade-all's --sandbox (default: auto)")
    parser.add_argument("--dask", nargs="*", default=[], metavar="ADDRESS",
                        help="also grade the class on these Dask clusters (grade-all's --dask, "
                        "for example local:2)")
    args = parser.parse_args(argv)
    if args.vs_nbgrader:
        from autograder.builder.classdir import parse_chapters
        from autograder.builder.versus import report

        repeat = args.repeat or 5
        print(f"median of {repeat} paired runs per chapter, on {os.cpu_count()} cores; "
              f"`python -m autograder bench --vs-nbgrader --repeat {repeat} --chapters "
              f"{args.chapters}`")
        wall, memory = report(parse_chapters(args.chapters, chapters()), repeat)
        print(f"largest ratios, ours / stock nbgrader: wall {wall:.2f}, memory {memory:.2f}")
        return 0
    args.repeat = args.repeat or 3
    if args.breakdown:
        import course
        from autograder.host.sandbox import probe

        course.setup(quiet=True)
        sandbox = args.sandbox == "on" or (args.sandbox == "auto" and probe() is None)
        print(f"seconds per notebook, median of {args.repeat}; `python -m autograder.builder.bench "
              f"--breakdown --repeat {args.repeat} --sandbox {args.sandbox}` (sandbox "
              f"{'on' if sandbox else 'off'})")
        print(_breakdown_table(breakdown(args.repeat, sandbox)))
        return 0
    with tempfile.TemporaryDirectory(prefix="kv-course-bench-") as scratch:
        uploads = Path(scratch) / "uploads"
        synthetic_class(uploads, args.learners)
        print(f"{args.learners} learners, chapters and kinds in turn; "
              f"`python -m autograder.builder.bench --learners {args.learners} --sandbox "
              f"{args.sandbox}`")
        runs = [("--jobs", str(jobs)) for jobs in args.jobs]
        runs += [("--dask", address) for address in args.dask]
        for number, (option, value) in enumerate(runs):
            run = Path(scratch) / f"run-{number}"
            run.mkdir()
            started = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "autograder", "grade-all", str(uploads), option, value,
                 "--cell-timeout", "20", "--sandbox", args.sandbox], cwd=run,
                capture_output=True, text=True)
            minutes = (time.monotonic() - started) / 60
            rows = (run / "grades.csv").read_text().count("\n") - 1
            print(f"{option} {value}: {args.learners} notebooks in {minutes * 60:.0f} s = "
                  f"{args.learners / minutes:.1f} notebooks per minute ({rows} gradebook "
                  f"rows, exit code {done.returncode})")
            if (option, value) == ("--jobs", "1"):
                print(_projection(args.learners / minutes, len(chapters())))
    return 0


def _projection(per_worker: float, chapters: int) -> str:
    """Hours for whole classes (every learner hands in every chapter) on N workers that each
    grade at ``per_worker`` notebooks per minute, as one core here did with ``--jobs 1``: a
    projection, assuming each worker has a core of its own and the scheduler is not the limit."""
    lines = [f"  projected, at {per_worker:.1f} notebooks per minute per worker "
             f"(hours for {chapters} chapters each):"]
    for learners in (300, 10_000):
        lines.append(f"    {learners:>6} learners: " + ", ".join(
            f"{learners * chapters / (per_worker * workers) / 60:.1f} h on {workers} "
            f"worker{'s' * (workers > 1)}" for workers in (1, 16, 64)))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
