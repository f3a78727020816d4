"""Runs the real nbgrader pipeline, one learner at a time, each in a place of its own.

    <root>/nbgrader_config.py, gradebook        the class's gradebook: only this process writes it
    <root>/source/NN_slug/, release/NN_slug/    chapters registered in it
    <root>/templates/NN_slug/                   a released course with its own gradebook, copied
                                                for every submission

    <temp>/kv-course-learner-XXXX/             one submission's course: a copy of the template
        submitted/<learner>/NN_slug/NN_slug.ipynb
        autograded/<learner>/NN_slug/NN_slug.ipynb  (the kernel's working directory)
    <temp>/kv-course-book-XXXX/gradebook.db    that course's gradebook, kept out of its tree

Isolation: nbgrader autogrades each submission in a fresh copy of the chapter's template, in
a temporary directory outside the class's course directory, so a cell that writes around its
working directory finds no gradebook and no other learner's files there. The nbgrader process
(and the kernel it starts) runs in its own process group under a memory limit (an address-space
rlimit, CPU-only machines: a CUDA context reserves more address space than any sensible limit),
with a time limit per cell and per notebook; when the notebook's time is up the whole group is
killed, and so is anything it leaves running when it ends. The grader, in this process, then
copies the scores into the class's gradebook, and checks between its own writes that nothing
else changed that file. Learner code still runs as the grader's user: it cannot stumble on
the class's files, but a determined attack could search for them; grade a hostile class in a
container or as an unprivileged user.

Checks: ``autograder.guard`` (armed by the locked first cell, verified by every test cell)
catches a notebook replacing the checks; ``suspicious_code`` flags cells the learner wrote
that reach for the grader, and such a notebook scores zero.
"""

from __future__ import annotations

import hashlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbformat.warnings import DuplicateCellId, MissingIDFieldWarning
from nbgrader.api import Gradebook, MissingEntry
from sqlalchemy.exc import SAWarning

from autograder.chapters import Chapter, NotGradable
from autograder.guard import suspicious_code
from autograder.report import NotebookResult, TestResult, failure_message

COURSE_ID = "paged-kv-course"
# nbgrader's gradebook API trips SQLAlchemy's session warnings on reads and writes alike; they
# say nothing to an instructor, and on stderr they would bury the error lines that matter.
# Likewise nbformat's notices that it gave a learner's copied or id-less cells new ids. Set
# once for the process (``catch_warnings`` is not thread-safe, and grading uses threads).
for _quiet in (SAWarning, DuplicateCellId, MissingIDFieldWarning):
    warnings.filterwarnings("ignore", category=_quiet)
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
"""


_CRASH_RETRIES = 3  # cells that kill the kernel, replaced one at a time before giving up


class GradebookTampered(RuntimeError):
    """The class's gradebook changed between two of the grader's own writes."""


@dataclass(frozen=True)
class Limits:
    """What one submission may use."""

    cell_timeout: int = 120  # seconds per cell
    notebook_timeout: int = 900  # seconds for a whole notebook, kernel start included
    memory_gib: float | None = 4.0  # address space of nbgrader and of the kernel; None: none
    # CPU threads for each kernel's torch (OMP_NUM_THREADS); None: the library's default, one
    # per core. Notebooks graded side by side must share the cores: torch's OpenMP threads
    # spin while they wait, and oversubscribed they slow small operations many times over.
    threads: int | None = None


@dataclass
class GradingCourse:
    """The class's nbgrader course directory and gradebook."""

    root: Path
    db_url: str = ""
    limits: Limits = Limits()
    runtime: str = ""  # what executes the notebooks, for the reports
    released: set[str] = field(default_factory=set)
    _fingerprint: str | None = None

    def __post_init__(self) -> None:
        self.root = self.root.resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.db_url = self.db_url or f"sqlite:///{self.root / 'gradebook.db'}"
        _write_config(self.root, self.db_url, self.limits)

    def release(self, chapter: Chapter) -> Path:
        """Register ``chapter`` in the gradebook (hidden tests included), and build its
        template for isolated grading; return the released notebook."""
        if chapter.name not in self.released:
            _generate(self.root, chapter, self.limits)
            template = self.root / "templates" / chapter.name
            shutil.rmtree(template, ignore_errors=True)
            _write_config(template, f"sqlite:///{template / 'gradebook.db'}", self.limits)
            _generate(template, chapter, self.limits)
            self.released.add(chapter.name)
        return self.root / "release" / chapter.name / f"{chapter.name}.ipynb"

    def autograde(self, chapter: Chapter, learner: str, notebook: Path,
                  feedback: Path | None = None) -> NotebookResult:
        """Grade one submission in a copy of the chapter's template; write its feedback page
        to ``feedback`` when given. Touches nothing of the class's course: safe to call from
        several threads once the chapter is released. Record the result with ``record``."""
        self.release(chapter)
        flagged = _flag(chapter, notebook, self.root / "release" / chapter.name
                        / f"{chapter.name}.ipynb")
        if flagged:
            return _result(chapter, notebook, self.runtime, {}, {},
                           f"not graded: a cell of this notebook reaches for the grader "
                           f"({flagged!r}); remove it and resubmit")
        work = Path(tempfile.mkdtemp(prefix="kv-course-learner-"))
        books = Path(tempfile.mkdtemp(prefix="kv-course-book-"))  # not under the kernel's cwd
        try:
            template = self.root / "templates" / chapter.name
            shutil.copytree(template, work, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("gradebook.db"))
            shutil.copyfile(template / "gradebook.db", books / "gradebook.db")
            db_url = f"sqlite:///{books / 'gradebook.db'}"
            _write_config(work, db_url, self.limits)
            submitted = work / "submitted" / learner / chapter.name / f"{chapter.name}.ipynb"
            submitted.parent.mkdir(parents=True)
            _sanitise(notebook, submitted, chapter)
            for _ in range(_CRASH_RETRIES + 1):
                try:
                    log = _nbgrader(work, ["autograde", chapter.name, "--student", learner,
                                           "--force"], self.limits.notebook_timeout,
                                    self.limits)
                except subprocess.TimeoutExpired:
                    return _result(chapter, notebook, self.runtime, {}, {},
                                   f"not graded: the notebook ran past its "
                                   f"{self.limits.notebook_timeout} s limit (look for an "
                                   "endless loop or a very slow cell)")
                if "Kernel died" not in log:
                    break
                crashed = self._crashing_cell(submitted)
                if crashed is None:
                    return _result(chapter, notebook, self.runtime, {}, {},
                                   "not graded: the Python kernel crashed (a segfault or an "
                                   "exit) in a test or given cell")
                _neutralise(submitted, crashed)
            executed = work / "autograded" / learner / chapter.name / f"{chapter.name}.ipynb"
            scores = _scores(db_url, chapter, learner)
            if scores is None or not executed.exists():
                errors = [line for line in log.splitlines() if "ERROR" in line]
                reason = errors[0].split("]", 1)[-1].strip() if errors else "no reason given"
                raise NotGradable(f"{notebook}: nbgrader could not grade it ({reason})")
            result = _result(chapter, notebook, self.runtime, scores,
                             _outputs_by_grade_id(executed))
            if feedback is not None:
                from autograder.feedback import write_feedback

                write_feedback(executed, result, feedback)
            return result
        finally:
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(books, ignore_errors=True)

    def _crashing_cell(self, notebook: Path) -> int | None:
        """The index of the learner's cell that kills the kernel, found by running the
        notebook under the same limits; None when it is a test or given cell, or unknown."""
        command = [sys.executable, "-m", "autograder.crash_probe", str(notebook),
                   str(self.limits.cell_timeout)]
        try:
            found = int(_run(command, notebook.parent, self.limits.notebook_timeout,
                             self.limits).strip().splitlines()[-1])
        except (subprocess.TimeoutExpired, ValueError, IndexError):
            return None
        if found < 0:
            return None
        cell = nbformat.read(notebook, as_version=4).cells[found]
        meta = cell.metadata.get("nbgrader", {})
        return None if meta.get("grade") or meta.get("locked") else found

    def record(self, learner: str, result: NotebookResult) -> None:
        """Write ``result`` into the class's gradebook as ``learner``'s submission (replacing
        an earlier one). Raises ``GradebookTampered`` if the gradebook file changed since
        the grader's last write."""
        self._check_untouched()
        points = {t.id: t.points for t in result.tests}
        with Gradebook(self.db_url, COURSE_ID) as gradebook:
            gradebook.update_or_create_student(learner)
            try:
                submission = gradebook.find_submission(result.chapter, learner)
            except MissingEntry:
                submission = gradebook.add_submission(result.chapter, learner)
            for notebook in submission.notebooks:
                for grade in notebook.grades:
                    if grade.name in points:
                        grade.auto_score = points[grade.name]
            gradebook.db.commit()
        self._fingerprint = self._current_fingerprint()

    def export_csv(self, destination: Path) -> None:
        """Write every score in the gradebook to a CSV file (nbgrader's own export)."""
        self._check_untouched()
        _nbgrader(self.root, ["export", "--to", str(destination.resolve())], 300, self.limits)

    def _current_fingerprint(self) -> str | None:
        if not self.db_url.startswith("sqlite:///"):
            return None  # a database server: its own access control protects it
        path = Path(self.db_url[len("sqlite:///"):])
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None

    def _check_untouched(self) -> None:
        if self._fingerprint is not None and self._current_fingerprint() != self._fingerprint:
            raise GradebookTampered(f"{self.db_url} changed while grading, and not by the "
                                    "grader: stop, and grade this class in a container")


def _write_config(root: Path, db_url: str, limits: Limits) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "nbgrader_config.py").write_text(_CONFIG.format(
        root=str(root), course_id=COURSE_ID, db_url=db_url, cell_timeout=limits.cell_timeout,
        pattern=WARNING_ON_STDERR))


def _generate(root: Path, chapter: Chapter, limits: Limits) -> None:
    source = root / "source" / chapter.name / f"{chapter.name}.ipynb"
    source.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(chapter.source, source)
    _nbgrader(root, ["generate_assignment", chapter.name, "--force"], 300, limits)


def _nbgrader(root: Path, args: list[str], timeout: int, limits: Limits) -> str:
    return _run([sys.executable, "-m", "nbgrader", *args], root, timeout, limits)


def _run(command: list[str], cwd: Path, timeout: int, limits: Limits) -> str:
    """Run ``command`` in its own process group under ``limits``; its output (stdout and
    stderr). On timeout the whole group is killed and ``TimeoutExpired`` raised."""
    env = dict(os.environ)
    # nbgrader calls `alembic` and starts kernels by name: this environment's bin comes first.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if limits.threads and "OMP_NUM_THREADS" not in env:  # a setting of the user's wins
        env["OMP_NUM_THREADS"] = str(limits.threads)
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True,
                               preexec_fn=_memory_limit(limits.memory_gib))
    try:
        log, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)  # the process, its kernel and all they started
        process.communicate()
        raise
    _kill_group(process.pid)  # anything a notebook left running must not outlive grading
    return log


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _sanitise(notebook: Path, destination: Path, chapter: Chapter) -> None:
    """Copy ``notebook`` to ``destination`` as nbgrader can read it: duplicated cell ids
    renumbered (a copied cell keeps its id), and the nbgrader metadata dropped from copies of a
    graded cell (the first one counts; nbgrader's own de-duplication leaves metadata it then
    rejects) and from cells whose grade id the chapter does not have (a renamed test cell: the
    real one then counts as missing). Anything unreadable is copied as it is, for nbgrader to
    report."""
    try:
        contents = nbformat.read(notebook, as_version=4)
    except Exception:
        shutil.copyfile(notebook, destination)
        return
    known = {c.metadata["nbgrader"]["grade_id"]
             for c in nbformat.read(chapter.source, as_version=4).cells
             if "grade_id" in c.metadata.get("nbgrader", {})}
    seen_ids: set[str] = set()
    seen_grade_ids: set[str] = set()
    for index, cell in enumerate(contents.cells):
        if cell.get("id") in seen_ids or "id" not in cell:
            cell["id"] = f"cell-{index}"
        seen_ids.add(cell["id"])
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id not in known or grade_id in seen_grade_ids:  # unknown, or a copy
            cell.metadata.pop("nbgrader", None)
        seen_grade_ids.add(grade_id)
    nbformat.write(contents, destination)


def _neutralise(notebook: Path, index: int) -> None:
    """Replace cell ``index`` by one that raises, saying why it was not run."""
    contents = nbformat.read(notebook, as_version=4)
    contents.cells[index].source = (
        'raise RuntimeError("This cell crashed the Python kernel when the notebook was '
        'graded (a segfault or an exit), so it was not run.")')
    nbformat.write(contents, notebook)


def _memory_limit(gib: float | None):
    """A function that caps the address space of the process it runs in (and of its
    children); None where there is no limit or a CUDA GPU (its context needs far more)."""
    if gib is None or _has_cuda():
        return None
    limit = int(gib * 2**30)

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _flag(chapter: Chapter, notebook: Path, released: Path) -> str | None:
    """The first suspicious line in a code cell the learner wrote or changed. Test cells and
    locked cells are skipped (nbgrader puts back their source by grade id), and so are cells
    equal to one of the released notebook's (the course's own code)."""
    source = nbformat.read(chapter.source, as_version=4)
    restored = {c.metadata["nbgrader"]["grade_id"] for c in source.cells
                if c.metadata.get("nbgrader", {}).get("grade")
                or c.metadata.get("nbgrader", {}).get("locked")}
    given = {c.source for c in nbformat.read(released, as_version=4).cells
             if c.cell_type == "code"}
    try:
        cells = nbformat.read(notebook, as_version=4).cells
    except Exception:  # nbgrader reports unreadable notebooks itself
        return None
    for cell in cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if cell.get("cell_type") != "code" or grade_id in restored:
            continue
        if cell.get("source") not in given:
            line = suspicious_code(cell.get("source", ""))
            if line:
                return line
    return None


def _scores(db_url: str, chapter: Chapter, learner: str) -> dict[str, float] | None:
    with Gradebook(db_url, COURSE_ID) as gradebook:
        try:
            graded = gradebook.find_submission_notebook(chapter.name, chapter.name, learner)
        except MissingEntry:
            return None
        return {g.name: g.score for g in graded.grades}


def _result(chapter: Chapter, notebook: Path, runtime: str, scores: dict[str, float],
            outputs: dict[str, list], reason: str = "") -> NotebookResult:
    """Per test cell of the source: its points, and the hint a failure left (``reason``, for
    a notebook not run at all)."""
    tests = []
    for grade_id, max_points in _test_cells(chapter.source):
        points = 0.0 if reason else float(scores.get(grade_id, 0.0))
        passed = points == max_points
        message = reason or ("" if passed else failure_message(outputs.get(grade_id)))
        tests.append(TestResult(grade_id, points, max_points, passed, message))
    return NotebookResult(str(notebook), chapter.name, runtime, tests)


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
    notebook = nbformat.read(executed, as_version=4)
    return {cell.metadata["nbgrader"]["grade_id"]: cell.get("outputs", [])
            for cell in notebook.cells
            if cell.metadata.get("nbgrader", {}).get("grade_id")}
