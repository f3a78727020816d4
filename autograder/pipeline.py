"""Runs the real nbgrader pipeline in a course directory built from ``solutions/``.

    <root>/nbgrader_config.py
    <root>/source/NN_slug/NN_slug.ipynb            the instructor's notebook (hidden tests in it)
    <root>/release/NN_slug/NN_slug.ipynb           written by `nbgrader generate_assignment`
    <root>/submitted/<learner>/NN_slug/NN_slug.ipynb   a copy of what the learner handed in
    <root>/autograded/<learner>/NN_slug/NN_slug.ipynb  written by `nbgrader autograde`
    gradebook (SQLite in <root>, or any SQLAlchemy URL)

Each nbgrader step runs in its own process group, so a learner's notebook that hangs or
crashes its kernel costs that learner's grade and nothing else: the group is killed when the
notebook's time is up, and grading goes on with the next one.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook, MissingEntry

from autograder.chapters import Chapter, NotGradable
from autograder.report import NotebookResult, TestResult, failure_message

COURSE_ID = "paged-kv-course"
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
"""


@dataclass
class GradingCourse:
    """An nbgrader course directory for grading; ``release`` a chapter before grading it."""

    root: Path
    db_url: str = ""
    cell_timeout: int = 120  # seconds per cell
    notebook_timeout: int = 900  # seconds for a whole notebook, kernel start included
    runtime: str = ""  # what executes the notebooks, for the reports
    released: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.root = self.root.resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.db_url = self.db_url or f"sqlite:///{self.root / 'gradebook.db'}"
        (self.root / "nbgrader_config.py").write_text(_CONFIG.format(
            root=str(self.root), course_id=COURSE_ID, db_url=self.db_url,
            cell_timeout=self.cell_timeout, pattern=WARNING_ON_STDERR))

    def release(self, chapter: Chapter) -> Path:
        """Register ``chapter`` in the gradebook (hidden tests included); return the release."""
        if chapter.name not in self.released:
            source = self.root / "source" / chapter.name / f"{chapter.name}.ipynb"
            source.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(chapter.source, source)
            self._nbgrader(["generate_assignment", chapter.name, "--force"], timeout=300)
            self.released.add(chapter.name)
        return self.root / "release" / chapter.name / f"{chapter.name}.ipynb"

    def autograde(self, chapter: Chapter, learner: str, notebook: Path) -> NotebookResult:
        """Grade one learner's notebook for ``chapter`` and read the result back."""
        self.release(chapter)
        submitted = self.root / "submitted" / learner / chapter.name
        shutil.rmtree(submitted, ignore_errors=True)
        submitted.mkdir(parents=True)
        shutil.copyfile(notebook, submitted / f"{chapter.name}.ipynb")
        # A result from an earlier run must never stand in for this one.
        shutil.rmtree(self.root / "autograded" / learner / chapter.name, ignore_errors=True)
        try:
            log = self._nbgrader(
                ["autograde", chapter.name, "--student", learner, "--force"],
                timeout=self.notebook_timeout)
        except subprocess.TimeoutExpired:
            return self._result(chapter, learner, notebook, timed_out=True)
        if not self._graded(chapter, learner):
            errors = [line for line in log.splitlines() if "ERROR" in line]
            reason = errors[0].split("]", 1)[-1].strip() if errors else "no reason given"
            raise NotGradable(f"{notebook}: nbgrader could not grade it ({reason})")
        return self._result(chapter, learner, notebook)

    def export_csv(self, destination: Path) -> None:
        """Write every score in the gradebook to a CSV file (nbgrader's own export)."""
        self._nbgrader(["export", "--to", str(destination.resolve())], timeout=300)

    def _graded(self, chapter: Chapter, learner: str) -> bool:
        with Gradebook(self.db_url, COURSE_ID) as gradebook:
            try:
                gradebook.find_submission_notebook(chapter.name, chapter.name, learner)
            except MissingEntry:
                return False
        return (self.root / "autograded" / learner / chapter.name).exists()

    def _result(self, chapter: Chapter, learner: str, notebook: Path, timed_out: bool = False
                ) -> NotebookResult:
        executed = self.root / "autograded" / learner / chapter.name / f"{chapter.name}.ipynb"
        outputs = _outputs_by_grade_id(executed) if not timed_out else {}
        scores: dict[str, tuple[float, float]] = {}
        if not timed_out:
            with Gradebook(self.db_url, COURSE_ID) as gradebook:
                graded = gradebook.find_submission_notebook(chapter.name, chapter.name, learner)
                scores = {g.name: (g.score, g.max_score) for g in graded.grades}
        tests = []
        for grade_id, max_points in _test_cells(chapter.source):
            points, _ = scores.get(grade_id, (0.0, max_points))
            passed = points == max_points
            if timed_out:
                message = (f"not graded: the notebook ran past its {self.notebook_timeout} s "
                           "limit (look for an endless loop or a very slow cell)")
            elif passed:
                message = ""
            else:
                message = failure_message(outputs.get(grade_id))
            tests.append(TestResult(grade_id, points, max_points, passed, message))
        return NotebookResult(str(notebook), chapter.name, self.runtime, tests)

    def _nbgrader(self, args: list[str], timeout: int) -> str:
        env = dict(os.environ)
        # nbgrader calls `alembic` and starts kernels by name: this environment's bin comes first.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        command = [sys.executable, "-m", "nbgrader", *args]
        process = subprocess.Popen(command, cwd=self.root, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            log, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # nbgrader, its kernel and all they started
            process.communicate()
            raise
        return log


def _test_cells(source: Path) -> list[tuple[str, float]]:
    """(grade_id, points) of every graded test cell, in notebook order."""
    notebook = nbformat.read(source, as_version=4)
    cells = []
    for cell in notebook.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade") and cell.cell_type == "code":
            cells.append((meta["grade_id"], float(meta["points"])))
    return cells


def _outputs_by_grade_id(executed: Path) -> dict[str, list]:
    if not executed.exists():
        return {}
    notebook = nbformat.read(executed, as_version=4)
    return {cell.metadata["nbgrader"]["grade_id"]: cell.get("outputs", [])
            for cell in notebook.cells
            if cell.metadata.get("nbgrader", {}).get("grade_id")}
