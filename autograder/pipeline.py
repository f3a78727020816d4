"""Runs the real nbgrader pipeline on one submission at a time, each in a place of its own.

    <scratch>/templates/NN_slug/             a released course of the chapter, with its own
                                             gradebook: copied for every submission
    <temp>/kv-course-learner-XXXX/          one submission's course: a copy of the template
        submitted/<learner>/NN_slug/NN_slug.ipynb   the submission, rebuilt (``restore``)
        autograded/<learner>/NN_slug/NN_slug.ipynb  (the kernel's working directory)
    <temp>/kv-course-book-XXXX/gradebook.db    that course's gradebook, kept out of its tree

The chapter's source notebook is the class's own when a class's nbgrader course directory is
graded, the package's ``solutions/`` otherwise. nbgrader runs under ``sandbox.run``; in the
sandbox, a submission's two folders are all it can write, and all of the host's folders it
sees besides the system, the Python environment and the course's packages. The grader, in
this process, then reads the scores and copies them into the class's gradebook
(``gradebook.ClassGradebook``); nothing here touches it.

Checks: ``autograder.guard`` (armed by the locked first cell, verified by every test cell)
catches a notebook replacing the checks; ``suspicious_code`` flags cells the learner wrote
that reach for the grader, and such a notebook scores zero.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

from autograder.arming import KERNEL_ARGUMENTS
from autograder.chapters import Chapter, NotGradable
from autograder.gradebook import COURSE_ID
from autograder.guard import suspicious_code
from autograder.report import NotebookResult, TestResult, failure_message
from autograder.restore import rebuild
from autograder.sandbox import Limits, run

__all__ = ["Grader", "Limits"]

# A Python warning on stderr (say, a library's DeprecationWarning) must not zero a test cell:
# nbgrader scores any stderr output as a failure, so IgnorePattern drops these outputs first.
WARNING_ON_STDERR = r"(?m)^.*:\d+: \w*Warning: "

_CONFIG = """\
c = get_config()
c.CourseDirectory.root = {root!r}
c.CourseDirectory.course_id = {course_id!r}
c.CourseDirectory.db_url = {db_url!r}
c.Execute.timeout = {cell_timeout}
c.Execute.kernel_name = "python3"
c.IgnorePattern.enabled = True
c.IgnorePattern.pattern = {pattern!r}
c.LimitOutput.max_lines = 1000
c.LimitOutput.max_traceback = 100
c.Execute.extra_arguments = {kernel_arguments!r}
"""

_CRASH_RETRIES = 3  # cells that kill the kernel, replaced one at a time before giving up


class Grader:
    """Grades submissions with nbgrader; ``prepare`` each chapter (once, before grading from
    several threads), then ``autograde`` each submission."""

    def __init__(self, scratch: Path, limits: Limits | None = None, runtime: str = "",
                 course_id: str = COURSE_ID) -> None:
        self.scratch = scratch.resolve()
        self.limits = limits or Limits()
        self.runtime = runtime  # what executes the notebooks, for the reports
        self.course_id = course_id
        self._prepared: set[str] = set()

    def prepare(self, chapter: Chapter) -> None:
        """Build ``chapter``'s template: its source released, hidden tests in its gradebook."""
        if chapter.name in self._prepared:
            return
        template = self.scratch / "templates" / chapter.name
        shutil.rmtree(template, ignore_errors=True)
        generate(template, chapter, f"sqlite:///{template / 'gradebook.db'}", self.limits,
                 self.course_id)
        self._prepared.add(chapter.name)

    def released(self, chapter: Chapter) -> Path:
        """The learner notebook nbgrader released for ``chapter``."""
        self.prepare(chapter)
        return self.scratch / "templates" / chapter.name / "release" / chapter.name / \
            f"{chapter.name}.ipynb"

    def autograde(self, chapter: Chapter, learner: str, submitted: nbformat.NotebookNode,
                  origin: str, feedback: Path | None = None) -> NotebookResult:
        """Grade one submission in a copy of the chapter's template; write its feedback page
        to ``feedback`` when given. Touches no class files: safe to call from several threads
        once the chapter is prepared."""
        released = nbformat.read(self.released(chapter), as_version=4)
        rebuilt = rebuild(submitted, released)  # raises restore.Unmatched
        flagged = _flag(rebuilt.notebook, released)
        if flagged:
            return self._zero(chapter, learner, origin,
                              f"not graded: a cell of this notebook reaches for the grader "
                              f"({flagged!r}); remove it and resubmit")
        work = Path(tempfile.mkdtemp(prefix="kv-course-learner-"))
        books = Path(tempfile.mkdtemp(prefix="kv-course-book-"))  # not under the kernel's cwd
        try:
            template = self.scratch / "templates" / chapter.name
            # not the instructor's notebook (source/): its answers and hidden tests stay out of
            # the submission's view; nbgrader restores cells from the gradebook
            shutil.copytree(template, work, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("gradebook.db", "source"))
            shutil.copyfile(template / "gradebook.db", books / "gradebook.db")
            db_url = f"sqlite:///{books / 'gradebook.db'}"
            write_config(work, db_url, self.limits, self.course_id)
            path = work / "submitted" / learner / chapter.name / f"{chapter.name}.ipynb"
            path.parent.mkdir(parents=True)
            nbformat.write(rebuilt.notebook, path)
            for _ in range(_CRASH_RETRIES + 1):
                try:
                    log = nbgrader(work, ["autograde", chapter.name, "--student", learner,
                                          "--force"], self.limits.notebook_timeout,
                                   self.limits, writable=(work, books))
                except subprocess.TimeoutExpired:
                    return self._zero(chapter, learner, origin,
                                      f"not graded: the notebook ran past its "
                                      f"{self.limits.notebook_timeout} s limit (look for an "
                                      "endless loop or a very slow cell)")
                if "Kernel died" not in log:
                    break
                crashed = self._crashing_cell(path, (work, books))
                if crashed is None:
                    return self._zero(chapter, learner, origin,
                                      "not graded: the Python kernel crashed (a segfault or "
                                      "an exit) in a test or given cell")
                _neutralise(path, crashed)
            executed = work / "autograded" / learner / chapter.name / f"{chapter.name}.ipynb"
            scores = _scores(db_url, chapter, learner, self.course_id)
            if scores is None or not executed.exists():
                errors = [line for line in log.splitlines() if "ERROR" in line]
                reason = errors[0].split("]", 1)[-1].strip() if errors else "no reason given"
                raise NotGradable(f"nbgrader could not grade it ({reason})")
            result = _result(chapter, learner, origin, self.runtime, scores,
                             _outputs_by_grade_id(executed))
            if feedback is not None:
                from autograder.feedback import write_feedback

                write_feedback(executed, result, feedback)
            return result
        finally:
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(books, ignore_errors=True)

    def _zero(self, chapter: Chapter, learner: str, origin: str, reason: str
              ) -> NotebookResult:
        return _result(chapter, learner, origin, self.runtime, {}, {}, reason)

    def _crashing_cell(self, notebook: Path, writable: tuple[Path, ...]) -> int | None:
        """The index of the learner's cell that kills the kernel, found by running the
        notebook under the same limits and sandbox; None when it is a test or given cell, or
        unknown."""
        command = [sys.executable, "-m", "autograder.crash_probe", str(notebook),
                   str(self.limits.cell_timeout)]
        try:
            found = int(run(command, notebook.parent, self.limits.notebook_timeout,
                            self.limits, writable).strip().splitlines()[-1])
        except (subprocess.TimeoutExpired, ValueError, IndexError):
            return None
        if found < 0:
            return None
        cell = nbformat.read(notebook, as_version=4).cells[found]
        meta = cell.metadata.get("nbgrader", {})
        return None if meta.get("grade") or meta.get("locked") else found


def write_config(root: Path, db_url: str, limits: Limits, course_id: str = COURSE_ID) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "nbgrader_config.py").write_text(_CONFIG.format(
        root=str(root), course_id=course_id, db_url=db_url, cell_timeout=limits.cell_timeout,
        pattern=WARNING_ON_STDERR, kernel_arguments=KERNEL_ARGUMENTS))


def generate(root: Path, chapter: Chapter, db_url: str, limits: Limits,
             course_id: str = COURSE_ID) -> None:
    """Release ``chapter`` from its source in a course folder at ``root`` whose gradebook is
    ``db_url`` (registering the chapter there, hidden tests included)."""
    write_config(root, db_url, limits, course_id)
    source = root / "source" / chapter.name / f"{chapter.name}.ipynb"
    source.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(chapter.source, source)
    # Outside the sandbox: generate_assignment runs no notebook (no learner code, only the
    # instructor's source), and registering a chapter writes the class's own gradebook.
    nbgrader(root, ["generate_assignment", chapter.name, "--force"], 300,
             dataclasses.replace(limits, sandbox=False))


def nbgrader(root: Path, args: list[str], timeout: int, limits: Limits,
             writable: tuple[Path, ...] = ()) -> str:
    return run([sys.executable, "-m", "nbgrader", *args], root, timeout, limits, writable)


def _neutralise(notebook: Path, index: int) -> None:
    """Replace cell ``index`` by one that raises, saying why it was not run."""
    contents = nbformat.read(notebook, as_version=4)
    contents.cells[index].source = (
        'raise RuntimeError("This cell crashed the Python kernel when the notebook was '
        'graded (a segfault or an exit), so it was not run.")')
    nbformat.write(contents, notebook)


def _flag(notebook: nbformat.NotebookNode, released: nbformat.NotebookNode) -> str | None:
    """The first suspicious line in a code cell the learner wrote or changed. Locked and
    graded cells are the released ones (``restore``), and so are cells equal to one of the
    released notebook's (the course's own code): both are skipped."""
    given = {c.source for c in released.cells if c.cell_type == "code"}
    for cell in notebook.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") != "code" or meta.get("locked") or meta.get("grade"):
            continue
        if cell.get("source") not in given:
            line = suspicious_code(cell.get("source", ""))
            if line:
                return line
    return None


def _scores(db_url: str, chapter: Chapter, learner: str, course_id: str
            ) -> dict[str, float] | None:
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(db_url, course_id) as gradebook:
        try:
            graded = gradebook.find_submission_notebook(chapter.name, chapter.name, learner)
        except MissingEntry:
            return None
        return {g.name: g.score for g in graded.grades}


def _result(chapter: Chapter, learner: str, origin: str, runtime: str,
            scores: dict[str, float], outputs: dict[str, list], reason: str = ""
            ) -> NotebookResult:
    """Per test cell of the source: its points, and the hint a failure left (``reason``, for
    a notebook not run at all)."""
    tests = []
    for grade_id, max_points in chapter.test_cells():
        points = 0.0 if reason else float(scores.get(grade_id, 0.0))
        passed = points == max_points
        message = reason or ("" if passed else failure_message(outputs.get(grade_id)))
        tests.append(TestResult(grade_id, points, max_points, passed, message))
    return NotebookResult(origin, chapter.name, runtime, tests, learner=learner)


def _outputs_by_grade_id(executed: Path) -> dict[str, list]:
    notebook = nbformat.read(executed, as_version=4)
    return {cell.metadata["nbgrader"]["grade_id"]: cell.get("outputs", [])
            for cell in notebook.cells
            if cell.metadata.get("nbgrader", {}).get("grade_id")}
