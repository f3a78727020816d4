"""Grading throughput: notebooks graded per minute for a synthetic class, and where one
notebook's time goes.

    python -m autograder.builder.bench [--learners 50] [--jobs 1 2] [--dask local:2]
        [--sandbox auto|on|off]
    python -m autograder.builder.bench --breakdown [--repeat 3] [--sandbox auto|on|off]
    python -m autograder bench --vs-nbgrader [--repeat 5] [--chapters 1-9] [--class-size 4]
    python -m autograder bench --scaling [--chapters 1-14] [--class-size 4]
    python -m autograder bench --memory-needs [--chapters 1-11] [--sandbox auto|on|off]

Learner i hands in chapter i mod (number of chapters): correct (the course's solutions),
partial (the first half of the TODOs solved) or broken (an endless loop, a syntax error or a
crashing kernel in the last TODO), in turn. Each ``--jobs`` value grades the whole class with
``grade-all`` from scratch (a fresh gradebook, per-cell limit 20 s, ``--sandbox`` as given)
and prints notebooks per minute; so does each ``--dask`` address (``local:N``: N worker
processes on this machine).

``--breakdown`` grades each chapter's solution notebook alone (``--repeat`` times, the median
kept) and prints where its time went (``autograder.builder.timing``): copying its course, nbgrader
and the kernel starting, the imports and set-up before the first cell, the kernel made ready
and the time between cells, the notebook's own cells, the test cells, nbgrader after the last
cell; and the part that is not the tests.

``--vs-nbgrader`` grades a class handing in each chapter's solution with the grader and with
stock nbgrader, paired, and prints wall time and CPU time per notebook and peak memory, with
their ratios (``autograder.builder.versus``).

``--scaling`` grades a class of each chapter on a local Dask cluster of 1, then 2 worker
processes (``scaling``) and prints notebooks per hour per core, per chapter, how 2 workers
scale over 1, and the cores that grade a class of 10,000 through every chapter in an hour.

``--memory-needs`` finds, for each chapter, the smallest ``--memory-limit`` on a ladder of
limits under which its own solution earns full marks: the proof ``grade`` and ``grade-all``
run first (``autograder.host.proof``), with no cached proof.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from autograder.builder.synthetic import BREAKAGES, broken, solved
from autograder.host.chapters import chapters


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
    parser = argparse.ArgumentParser(prog="python -m autograder bench",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--breakdown", action="store_true",
                        help="where one notebook's time goes, per chapter (seconds)")
    parser.add_argument("--vs-nbgrader", action="store_true",
                        help="the grader against stock nbgrader, per chapter")
    parser.add_argument("--scaling", action="store_true",
                        help="notebooks per hour per core, per chapter, on 1 and 2 Dask "
                        "workers, and the cores a class of 10,000 needs")
    parser.add_argument("--memory-needs", action="store_true",
                        help="the smallest --memory-limit each chapter grades under (GiB)")
    parser.add_argument("--chapters", default="all", help="with --vs-nbgrader, --scaling or "
                        "--memory-needs: for example 1-3 (default: all)")
    parser.add_argument("--repeat", type=int, default=None,
                        help="runs per notebook (default: 3, or 5 with --vs-nbgrader)")
    parser.add_argument("--learners", type=int, default=50)
    parser.add_argument("--class-size", type=int, default=4,
                        help="with --vs-nbgrader or --scaling: learners handing in each chapter "
                        "(default: 4)")
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
        print(f"per notebook, a class of {args.class_size}; median of {repeat} paired runs per "
              f"chapter, on {os.cpu_count()} cores; `python -m autograder bench --vs-nbgrader "
              f"--repeat {repeat} --chapters {args.chapters} --class-size {args.class_size}`")
        median, wall, memory = report(parse_chapters(args.chapters, chapters()), repeat,
                                      args.class_size)
        print(f"ratios, ours / stock nbgrader: wall {median:.2f} on the median chapter, "
              f"{wall:.2f} at most; memory {memory:.2f} at most")
        return 0
    if args.scaling:
        from autograder.builder.classdir import parse_chapters

        print(f"a class of {args.class_size} per chapter, each handing in the solution, graded "
              f"by grade-all on a local Dask cluster of 1, then 2 workers (one thread each), "
              f"on {os.cpu_count()} cores; `python -m autograder bench --scaling --chapters "
              f"{args.chapters} --class-size {args.class_size}`")
        print(scaling(parse_chapters(args.chapters, chapters()), args.class_size, args.sandbox))
        return 0
    if args.memory_needs:
        from autograder.builder.classdir import parse_chapters

        print(f"the smallest --memory-limit (GiB) of {', '.join(map(str, MEMORY_LADDER))} under "
              "which each chapter's own solution earns full marks; `python -m autograder bench "
              f"--memory-needs --chapters {args.chapters} --sandbox {args.sandbox}`")
        for chapter, gib in memory_needs(parse_chapters(args.chapters, chapters()),
                                         args.sandbox):
            print(f"  {chapter.name}: {gib if gib is not None else 'more than the ladder'}")
        return 0
    args.repeat = args.repeat or 3
    if args.breakdown:
        import course
        from autograder.builder.timing import breakdown, breakdown_table
        from autograder.host.sandbox import probe

        course.setup(quiet=True)
        sandbox = args.sandbox == "on" or (args.sandbox == "auto" and probe() is None)
        print(f"seconds per notebook, median of {args.repeat}; `python -m autograder.builder.bench "
              f"--breakdown --repeat {args.repeat} --sandbox {args.sandbox}` (sandbox "
              f"{'on' if sandbox else 'off'})")
        print(breakdown_table(breakdown(args.repeat, sandbox)))
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


MEMORY_LADDER = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # GiB


def memory_needs(selected: list, sandbox: str):
    """Yield (chapter, the least limit of ``MEMORY_LADDER`` under which its English solution
    earns full marks, or None), each proof made afresh in a cache of its own."""
    import course
    from autograder.host.autograde import Grader
    from autograder.host.chapters import GraderFailure
    from autograder.host.proof import prove
    from autograder.host.sandbox import Limits, probe
    from course.language import ENGLISH
    from course.runtime import detect

    course.setup(quiet=True)
    sandboxed = sandbox == "on" or (sandbox == "auto" and probe() is None)
    for chapter in selected:
        found = None
        for gib in MEMORY_LADDER:
            with tempfile.TemporaryDirectory(prefix="kv-course-memory-") as cache:
                grader = Grader(Limits(memory_gib=gib, sandbox=sandboxed), detect().label,
                                cache=Path(cache))
                try:
                    prove(grader, [(chapter, ENGLISH)], diagnose=False)
                except GraderFailure:
                    continue
            found = gib
            break
        yield chapter, found


WORKERS = (1, 2)
CLASS_OF = 10_000  # learners, each handing in every chapter, to grade in an hour


def scaling(selected: list, learners: int, sandbox: str) -> str:
    """For each number of ``WORKERS``: a local Dask cluster started once; for each chapter, an
    untimed run that grades one solution per worker (proofs cached, released chapters cached,
    the workers' kernel templates started: the fixed costs a worker pays once), then a timed
    ``grade-all`` of ``learners`` solutions. The table: seconds per run, notebooks
    per hour per core (one worker is one core), and how 2 workers scale over 1; then the
    cores that grade ``CLASS_OF`` learners through every selected chapter in an hour, at the
    per-core rates of the largest cluster."""
    from distributed import LocalCluster

    seconds: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="kv-course-scaling-") as scratch:
        for workers in WORKERS:
            seconds[workers] = {}
            with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                              dashboard_address=None) as cluster:
                for chapter in selected:
                    run = Path(scratch) / f"{workers}" / chapter.name
                    for count, kind in ((workers, "warm"), (learners, "timed")):
                        hand_in = run / kind / "hand-ins"
                        for index in range(count):
                            path = hand_in / f"learner{index}" / f"{chapter.name}.ipynb"
                            path.parent.mkdir(parents=True)
                            nbformat.write(solved(chapter), path)
                        started = time.monotonic()
                        done = subprocess.run(
                            [sys.executable, "-m", "autograder", "grade-all", str(hand_in),
                             "--dask", cluster.scheduler_address, "--sandbox", sandbox],
                            cwd=run / kind, capture_output=True, text=True)
                        if done.returncode != 0:
                            raise RuntimeError(f"grade-all failed on {chapter.name}: "
                                               f"{done.stderr.strip()[-500:]}")
                    seconds[workers][chapter.name] = time.monotonic() - started
    header = "".join(f"{f'{w} worker(s) s':>14}{'nb/h/core':>11}" for w in WORKERS)
    lines = [f"{'chapter':<38}{header}{'speed-up':>10}"]
    cores_needed = 0.0
    for chapter in selected:
        taken = [seconds[w][chapter.name] for w in WORKERS]
        rates = [learners * 3600 / (run * w) for run, w in zip(taken, WORKERS, strict=True)]
        lines.append(f"{chapter.name:<38}" + "".join(
            f"{run:>14.1f}{rate:>11.0f}" for run, rate in zip(taken, rates, strict=True))
            + f"{taken[0] / taken[-1]:>10.2f}")
        cores_needed += CLASS_OF / rates[-1]
    largest = WORKERS[-1]
    per_core = learners * len(selected) * 3600 / (sum(seconds[largest].values()) * largest)
    lines.append(f"all {len(selected)} chapters: {per_core:.0f} notebooks per hour per core on "
                 f"{largest} workers")
    lines.append(f"to grade {CLASS_OF:,} learners through these {len(selected)} chapters "
                 f"({CLASS_OF * len(selected):,} notebooks) in an hour: {cores_needed:,.0f} cores "
                 "at these per-core rates")
    return "\n".join(lines)


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
