"""Where one notebook's grading time goes (``python -m autograder bench --breakdown``): the
grader as it grades, each step of ``autograde.STEPS`` timed as it ends and the grading kernel
asked for its own times around arming. The grader keeps no times of its own.

    course copy                    strip_demonstrations ends -> place ends
    nbgrader and kernel start      place ends -> the kernel begins arming
    imports and set-up             the kernel begins arming -> ends arming
    kernel ready, between cells    arming ends -> the last cell ends, less the cells' own
                                   times: the client's handshake, each cell's round trip
    own cells, test cells          each cell's execution times, as the notebook records them
    nbgrader after the last cell   the last cell's end -> run_nbgrader ends
    slowest test cell              the longest of the test cells (a check's time limit,
                                   ``autograder.private.check_seconds``, leaves it room)
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import statistics
import time

import nbformat

from autograder.arming import TIMINGS
from autograder.host.autograde import Grader, Grading, Job, Limits, Outcome, Step, read_scores
from autograder.host.chapters import chapters

_TIMES = "timings.json"  # in the kernel's own folder: [began arming, ended arming]


class Timed(Grader):
    """A grader that writes down, in ``marks``, when each step of its last grading ended (by
    the step's name) and, as "armed", when its kernel began and ended arming."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.marks: dict[str, float | list[float]] = {}

    def autograde(self, job: Job) -> Outcome:
        self.marks = {}
        return super().autograde(job)

    def step(self, step: Step, grading: Grading) -> Outcome | None:
        outcome = super().step(step, grading)
        self.marks[step.__name__] = time.time()
        if step is read_scores:  # before the kernel's folder goes
            with contextlib.suppress(OSError, ValueError):
                self.marks["armed"] = json.loads((grading.scratch / _TIMES).read_text())
        return outcome

    def kernel_environment(self, grading: Grading) -> dict[str, str]:
        return {TIMINGS: str(grading.scratch / _TIMES)}


def time_parts(marks: dict[str, float | list[float]], executed: dict) -> dict[str, float]:
    """Where one notebook's grading time went, from a ``Timed`` grader's ``marks`` and the
    executed notebook's cell times: copying its course, nbgrader and the kernel starting, the
    imports and set-up before the first cell (``arming``; when the kernel wrote no times, they
    count as nbgrader's), the kernel made ready and the time between cells (the client's
    handshake, each cell's round trip), the notebook's own cells (set-up, answers,
    demonstrations), the test cells, and nbgrader after the last cell: together, the whole
    from the course's copy to nbgrader's end."""
    started = marks["place"]  # nbgrader starts as the submission's course is in place
    armed_from, armed_to = marks.get("armed", (started, started))
    cells, tests, last = 0.0, 0.0, None
    for cell in executed["cells"]:
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
            "kernel ready, between cells": (last or armed_to) - armed_to - cells - tests,
            "notebook's own cells": cells, "test cells": tests,
            "nbgrader after the last cell": marks["run_nbgrader"] - (last or marks["run_nbgrader"])}


SLOWEST = "slowest test cell"  # a column of its own: it is one of the test cells, not more


def test_cell_seconds(executed: dict) -> dict[str, float]:
    """Grade id -> seconds, for every test cell the executed notebook timed."""
    found = {}
    for cell in executed["cells"]:
        meta = cell.get("metadata", {})
        times = meta.get("execution", {})
        if meta.get("nbgrader", {}).get("grade") and "iopub.execute_input" in times and \
                "shell.execute_reply" in times:
            found[meta["nbgrader"]["grade_id"]] = (
                dt.datetime.fromisoformat(times["shell.execute_reply"]).timestamp()
                - dt.datetime.fromisoformat(times["iopub.execute_input"]).timestamp())
    return found


def breakdown(repeat: int, sandbox: bool) -> dict[str, dict[str, float]]:
    """Chapter -> part -> seconds (the median of ``repeat`` gradings of its solution)."""
    from course.runtime import detect

    grader = Timed(Limits(sandbox=sandbox), detect().label)
    found = {}
    for chapter in chapters().values():
        source = chapter.source.read_text(encoding="utf-8")
        grader.template(chapter.name, source)  # released before timing, as grade-all does
        grader.kernel_template(chapter.name)  # started once, before its first notebook
        runs = []
        for _ in range(repeat):
            outcome = grader.autograde(Job(chapter.name, source, "learner", str(chapter.source),
                                           nbformat.reads(source, as_version=4)))
            runs.append(time_parts(grader.marks, outcome.executed)
                        | {SLOWEST: max(test_cell_seconds(outcome.executed).values())})
        found[chapter.name] = {part: statistics.median(run[part] for run in runs)
                               for part in runs[0]}
    return found


def breakdown_table(found: dict[str, dict[str, float]]) -> str:
    parts = list(next(iter(found.values())))

    def row(label: str, times: dict[str, float]) -> str:
        fixed = sum(v for p, v in times.items() if p not in ("test cells", SLOWEST))
        return f"{label:<38}" + "".join(f"{times[p]:>15.2f}" for p in parts) + f"{fixed:>11.2f}"

    header = f"{'chapter':<38}" + "".join(f"{p[:14]:>15}" for p in parts) + f"{'not tests':>11}"
    mean = {p: sum(t[p] for t in found.values()) / len(found) for p in parts}
    rows = [row(chapter, times) for chapter, times in found.items()]
    return "\n".join([header, *rows, row("mean", mean)])
