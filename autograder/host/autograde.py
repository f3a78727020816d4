"""One submission through the real nbgrader, in a place of its own: data in, data out.

    <cache>/templates/NN_slug-<source hash>/  a released course of the chapter, with its own
                                             gradebook (hidden tests registered), built once
                                             per chapter source and copied for every submission
    <temp>/kv-course-learner-XXXX/          one submission's course: a copy of the template
        gradebook.db                                its gradebook
        submitted/<learner>/NN_slug/NN_slug.ipynb   the submission, rebuilt (``restore``)
        autograded/<learner>/NN_slug/NN_slug.ipynb  (the kernel's working directory)
    <cache>/cases/NN_slug-<code hash>       the cases its checks drew on the solution,
                                             recorded for a class (``Grader.record_cases``)
    <temp>/kv-k-XXXX/                       the kernel's own: sockets, HOME, caches, and a
                                             copy of those cases, which its checks replay

``Grader.autograde`` takes a ``Job`` (the chapter's source notebook as text, the learner's
notebook, who and what it is) and gives back an ``Outcome`` (the result of every test, and
the executed notebook for the feedback page), through ``STEPS``: rebuild the answers, flag,
strip demonstrations, place, run nbgrader, read scores, keep recorded cases, report. It
touches no class files, reads no file it is not given, and can run on another machine
(``autograder.host.cluster``).
nbgrader runs under ``sandbox.run`` (time, memory, and nothing outliving it), and its
kernel, the one process that runs learner code, in the bubblewrap sandbox
(``autograder.host.kernel``): its working folder and its own scratch folder are all it can write,
and all of the host it sees besides the system, the Python environment and the course's
packages.

Checks: ``autograder.arming`` records the checks before the first cell and
``autograder.guard`` verifies them in every test cell; ``flagging`` flags cells the
learner wrote that reach for the grader, and such a notebook scores zero.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import nbformat

from autograder.checks import _replay
from autograder.hints import in_language
from autograder.host import configuration, forkserver, warm
from autograder.host.chapters import GraderFailure, grade_id_of, test_cells_of
from autograder.host.configuration import COURSE_ID
from autograder.host.flagging import flagged_line
from autograder.host.nbgrader_main import SCORES
from autograder.host.release_history import released_lines
from autograder.host.report import NOT_GRADED, NotebookResult, result_of
from autograder.host.restore import defines, mark_restored, rebuild
from autograder.host.sandbox import Limits, environment_for, run
from course.language import ENGLISH, tr_later
from course.language import ENVIRONMENT as LANGUAGE_SETTING

__all__ = ["Grader", "Job", "Limits", "Outcome"]

Step = Callable[["Grader", "Grading"], "Outcome | None"]  # one of ``STEPS``

_CRASH_RETRIES = 3  # cells that kill the kernel, replaced one at a time before giving up
RECORDER = "course-cases"  # the learner a recording of the checks' cases grades as


@dataclass(frozen=True)
class Job:
    """What grading one submission needs: plain data, so it can travel to another machine."""

    chapter: str
    source: str  # the chapter's instructor notebook, as text
    learner: str
    origin: str  # what the reports call the file
    notebook: dict  # the learner's notebook (nbformat 4)
    language: str = ENGLISH  # the notebook's (``source`` is the chapter in that language)


@dataclass
class Outcome:
    result: NotebookResult
    executed: dict | None = None  # the graded notebook, for the feedback page


@dataclass
class Grading:
    """One submission on its way through ``STEPS``: what the steps found so far."""

    job: Job
    tests: list[tuple[str, float]]  # (grade id, points) of every test cell of the chapter
    released: nbformat.NotebookNode  # the notebook nbgrader released for the chapter
    template: Path
    notebook: nbformat.NotebookNode | None = None  # the learner's, rebuilt on the release
    to_run: nbformat.NotebookNode | None = None  # that, less its unchanged demonstrations
    work: Path | None = None  # the submission's course
    scratch: Path | None = None  # its kernel's own folder
    log: str = ""  # what nbgrader's last run said
    scores: dict[str, float] | None = None  # grade id -> points, as nbgrader recorded them
    executed: nbformat.NotebookNode | None = None  # the notebook as nbgrader ran it
    restored: tuple[str, ...] = ()  # grade ids of the cells the learner deleted, put back
    cases: Path | None = None  # the cases its checks replay (``Grader.cases``)

    @property
    def submitted(self) -> Path:
        return _notebook(self.work / "submitted" / self.job.learner, self.job.chapter)


def cache_folder() -> Path:
    """Where released chapters are kept between runs (``KV_COURSE_CACHE``, else the user's
    cache folder)."""
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kv-course"
    return Path(os.environ.get("KV_COURSE_CACHE") or default)


class Grader:
    """Grades jobs with nbgrader under ``limits``; ``runtime`` names what executes the
    notebooks in the reports."""

    def __init__(self, limits: Limits | None = None, runtime: str = "",
                 course_id: str = COURSE_ID, cache: Path | None = None) -> None:
        self.limits = limits or Limits()
        self.runtime = runtime
        self.course_id = course_id
        self.cache = (cache or cache_folder()).resolve()
        self.recording: Path | None = None  # where the recording run's cases go

    def template(self, chapter: str, source: str) -> Path:
        """The released course of a chapter's source: built once per source text and kept
        (built in a folder of its own and moved into place, so runs side by side never see
        half of one)."""
        key = f"{metadata.version('nbgrader')}\n{self.course_id}\n{source}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        template = self.cache / "templates" / f"{chapter}-{digest}"
        if not (template / "gradebook.db").exists():
            template.parent.mkdir(parents=True, exist_ok=True)
            building = Path(tempfile.mkdtemp(prefix=f".{chapter}-", dir=template.parent))
            try:
                generate(building, chapter, source, self.limits, self.course_id)
                building.rename(template)
            except OSError:  # another run put the same template in place first
                pass
            finally:
                shutil.rmtree(building, ignore_errors=True)
        return template

    def cases(self, chapter: str) -> Path | None:
        """The cases the checks of ``chapter`` drew on its solution, for its kernels to replay
        (``autograder.checks._replay``): recorded by ``record_cases`` with this code; None
        where there are none."""
        kept = self._cases_file(chapter)
        return kept if kept.exists() and kept.stat().st_size else None

    def record_cases(self, chapter: str, source: str) -> None:
        """Record, where this code has not yet, the cases the checks of ``chapter`` draw on
        its solution (``source``): the solution graded as ``RECORDER``, its kernel keeping
        what every check drew, kept if it earned full marks (an empty file where no check
        draws, so that it is not graded again for nothing). Nothing is kept where it fell
        short or could not be graded (the proof says why), or the cache cannot be written:
        the checks then draw, as without a record."""
        kept = self._cases_file(chapter)
        if kept.exists():
            return
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            self.recording = kept.parent / f".{kept.name}.{os.getpid()}"
            outcome = self.autograde(Job(chapter, source, RECORDER, "the solution",
                                         nbformat.reads(source, as_version=4)))
            if outcome.result.tests and outcome.result.score == outcome.result.max_score:
                self.recording.touch()  # empty where no check draws: nothing to replay
                self.recording.replace(kept)
        except Exception:  # noqa: BLE001 - a record only saves time: never a reason to stop
            pass
        finally:
            if self.recording is not None:
                self.recording.unlink(missing_ok=True)
            self.recording = None

    def _cases_file(self, chapter: str) -> Path:
        return self.cache / "cases" / f"{chapter}-{_replay.fingerprint()[:16]}"

    def released(self, chapter: str, source: str) -> nbformat.NotebookNode:
        """The learner notebook nbgrader releases for a chapter's source."""
        return _released(self.template(chapter, source), chapter)

    def autograde(self, job: Job) -> Outcome:
        """Grade one submission in a copy of its chapter's template, step by step
        (``STEPS``). Raises ``GraderFailure`` (the grader's own failure: nbgrader could not
        grade it, its kernel did not start or died in a given cell before any of the
        learner's) and ``restore.Unmatched`` (no answer cell of it could be matched); a
        notebook that flags, hangs or crashes gets zero with the reason."""
        template = self.template(job.chapter, job.source)
        tests = test_cells_of(nbformat.reads(job.source, as_version=4).cells)
        grading = Grading(job, tests, _released(template, job.chapter), template)
        try:
            for step in STEPS:  # the last, ``report``, always gives an outcome
                outcome = self.step(step, grading)
                if outcome is not None:
                    return outcome
        finally:
            for folder in (grading.work, grading.scratch):
                if folder is not None:
                    shutil.rmtree(folder, ignore_errors=True)

    def step(self, step: Step, grading: Grading) -> Outcome | None:
        """Run one step of ``STEPS`` on ``grading``: the one place a step runs, where
        ``python -m autograder bench --breakdown`` times them."""
        return step(self, grading)

    def kernel_template(self, chapter: str) -> Path | None:
        """The socket of this process's template for ``chapter``'s kernels (started on first
        use), from which each is forked in its sandbox (``autograder.host.warm``); None where
        kernels start cold: no sandbox, ``--kernels cold``, a GPU."""
        limits = self.limits
        if not (limits.sandbox and limits.warm_kernels):
            return None
        return warm.template_for(chapter, environment_for(dict(os.environ), [Path.cwd()],
                                                          limits.threads))

    def kernel_environment(self, grading: Grading) -> dict[str, str]:
        """What the grading kernel's environment holds besides the notebook's language and
        where its scores go: nothing (the benchmark asks for the kernel's own times)."""
        return {}

    def zero(self, grading: Grading, reason: str) -> Outcome:
        """Zero for every test, and the notebook as nbgrader should record it: not run, each
        test cell failing with ``reason`` (so nbgrader scores it zero, and the feedback page
        says why)."""
        job = grading.job
        return Outcome(result_of(job.chapter, grading.tests, job.learner, job.origin,
                                 self.runtime, {}, None, reason, job.language),
                       _not_run(grading.notebook, reason))

    def crashing_cell(self, notebook: Path, scratch: Path, source: str) -> int | None:
        """The index of the cell that kills the kernel, found by running a copy of the
        notebook as nbgrader runs it (its test and locked cells as ``source`` has them, hidden
        tests included) under the same limits, in a sandbox that sees that copy alone; None
        when unknown."""
        probe = scratch / "crash-probe"
        probe.mkdir()
        nbformat.write(as_graded(nbformat.read(notebook, as_version=4),
                                 nbformat.reads(source, as_version=4)), probe / notebook.name)
        command = [sys.executable, "-m", "autograder.host.crash_probe", notebook.name,
                   str(self.limits.cell_timeout)]
        try:
            found = int(run(command, probe, self.limits.notebook_timeout, self.limits,
                            (probe,)).strip().splitlines()[-1])
        except (subprocess.TimeoutExpired, ValueError, IndexError):
            return None
        finally:
            shutil.rmtree(probe, ignore_errors=True)
        return None if found < 0 else found


def grader_failed(error: Exception) -> GraderFailure:
    """What a submission is told when grading it failed in the grader itself (a bug of the
    grader's, or of the Python it runs on): it is refused alone, nothing of it recorded, the
    others are graded."""
    return GraderFailure(tr_later(f"the grader failed on it ({type(error).__name__}: {error}); "
                                "grade it again, and report it if it fails again"))


# --- the steps of grading one submission, in order -------------------------------------------


def rebuild_answers(grader: Grader, grading: Grading) -> None:
    """The learner's answers in the released notebook (``restore.rebuild``): test and locked
    cells are the course's, whatever the learner did to them."""
    rebuilt = rebuild(nbformat.from_dict(grading.job.notebook), grading.released)
    grading.notebook, grading.restored = rebuilt.notebook, tuple(rebuilt.restored)


def flag(grader: Grader, grading: Grading) -> Outcome | None:
    """Zero, unrun, for a notebook with a line of the learner's that reaches for the grader
    (``flagged_line``)."""
    flagged = flagged_line(grading.notebook, grading.released,
                           released_lines(grading.job.chapter))
    if flagged:
        return grader.zero(grading, tr_later(f"not graded: a cell of this notebook reaches "
                                             f"for the grader ({flagged!r}); remove it and "
                                             "resubmit"))
    return None


def strip_demonstrations(grader: Grader, grading: Grading) -> None:
    """Unchanged demonstrations are not run (``without_demonstrations``)."""
    grading.to_run = without_demonstrations(grading.notebook, grading.released,
                                            grading.job.language)


def place(grader: Grader, grading: Grading) -> None:
    """The submission's course: a copy of the chapter's template, configured, with the
    notebook handed in as nbgrader's ``collect`` leaves it; and the kernel's own folder, the
    one besides its working folder that the sandbox lets it write (its connection file and
    sockets, HOME, caches, timings; a short path: a Unix socket's must fit 107 bytes)."""
    grading.work = Path(tempfile.mkdtemp(prefix="kv-course-learner-"))
    grading.scratch = Path(tempfile.mkdtemp(prefix="kv-k-"))
    # not the instructor's notebook (source/): nbgrader restores cells from the gradebook,
    # which only nbgrader sees (the kernel sees its own folders alone)
    shutil.copytree(grading.template, grading.work, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("source"))
    _configure(grading.work, grader.limits, grader.course_id, grading.scratch)
    job = grading.job
    grading.cases = None if job.learner == RECORDER else grader.cases(job.chapter)
    grading.submitted.parent.mkdir(parents=True)
    nbformat.write(grading.to_run, grading.submitted)


def run_nbgrader(grader: Grader, grading: Grading) -> Outcome | None:
    """nbgrader's ``autograde`` of the submission under the limits; zero for a notebook past
    its time limit. A cell that kills the kernel is found (``Grader.crashing_cell``) and kept from
    running (``_neutralise``), and the notebook run again, up to ``_CRASH_RETRIES`` times;
    zero when that cell cannot be found or kept from running. A kernel that never started, or
    died in a given cell before any cell the learner wrote ran, is the grader's failure (a
    memory limit, a missing kernel, a sandbox that hides the environment), not the learner's:
    ``GraderFailure``."""
    job, limits = grading.job, grader.limits
    environment = {**grader.kernel_environment(grading), LANGUAGE_SETTING: job.language,
                   SCORES: str(grading.work / "scores.json")}
    if job.learner == RECORDER:  # the kernel records what its checks draw
        environment[_replay.RECORD] = str(grading.scratch / "recorded")
    elif grading.cases is not None:  # a copy in the kernel's folder, which it reads, then removes
        environment[_replay.CASES] = str(grading.scratch / "cases")
    forkserver.start()  # nbgrader loads while the kernel's template loads the chapter
    template = grader.kernel_template(job.chapter)
    if template is not None:  # the kernel forked from it, in the sandbox (autograder.host.warm)
        environment[warm.SETTING] = str(template)
    for _ in range(_CRASH_RETRIES + 1):
        (grading.work / "scores.json").unlink(missing_ok=True)
        if _replay.CASES in environment:
            shutil.copyfile(grading.cases, environment[_replay.CASES])
        try:
            grading.log = nbgrader(
                grading.work, ["autograde", job.chapter, "--student", job.learner, "--force"],
                limits.notebook_timeout, limits, environment=environment)
        except subprocess.TimeoutExpired:
            return grader.zero(grading, tr_later(
                f"not graded: the notebook ran past its {limits.notebook_timeout} s limit (look "
                "for an endless loop or a very slow cell)"))
        if "Kernel died" not in grading.log:  # what nbgrader's executor says of a crash
            return None
        if _NEVER_STARTED in grading.log:  # before its first cell: no learner code ran
            raise GraderFailure(tr_later("not graded: the grader failed, not this notebook "
                                         "(its Python kernel did not start); it keeps its "
                                         "earlier grade"))
        crashed = grader.crashing_cell(grading.submitted, grading.scratch, job.source)
        given = _given_before_learner(grading.submitted, crashed, job.language)
        if given is not None:
            raise GraderFailure(tr_later(
                f"not graded: the grader failed, not this notebook (its Python kernel died in "
                f"the given cell {given!r}, before any cell of yours ran); it keeps its earlier "
                "grade"), given)
        if crashed is None or not _neutralise(grading.submitted, crashed, job.source,
                                              job.language):
            return grader.zero(grading, tr_later("not graded: the Python kernel crashed (a "
                                                 "segfault or an exit) in a test or given cell"))
    return None


def read_scores(grader: Grader, grading: Grading) -> None:
    """The scores nbgrader recorded (``autograder.host.nbgrader_main``) and the notebook as it
    ran; ``GraderFailure``, with nbgrader's own words, when it wrote either not (the
    submission is the course's released notebook with the learner's answers in it: nbgrader
    failing on it is the grader's failure, a missing kernel's most often)."""
    job = grading.job
    executed = _notebook(grading.work / "autograded" / job.learner, job.chapter)
    scores = grading.work / "scores.json"
    grading.scores = json.loads(scores.read_text()) if scores.exists() else None
    if grading.scores is None or not executed.exists():
        lines = grading.log.splitlines()
        errors = [line for line in lines if "ERROR" in line]
        said = [line.strip() for line in lines if line.strip()]
        reason = errors[0].split("]", 1)[-1].strip() if errors else \
            " / ".join(said[-3:]) or tr_later("it wrote nothing")
        raise GraderFailure(tr_later(f"nbgrader could not grade it ({reason})"))
    grading.executed = nbformat.read(executed, as_version=4)


def keep_recorded_cases(grader: Grader, grading: Grading) -> None:
    """In a recording run (``Grader.record_cases``), what the kernel's checks drew, kept before
    its folder goes."""
    recorded = grading.scratch / "recorded"
    if grading.job.learner == RECORDER and recorded.exists():
        shutil.move(recorded, grader.recording)


def report(grader: Grader, grading: Grading) -> Outcome:
    """Every test's result, and the executed notebook for the feedback page and the
    gradebook, the cells the learner deleted marked (``mark_restored``)."""
    job = grading.job
    mark_restored(grading.executed, grading.restored)
    return Outcome(result_of(job.chapter, grading.tests, job.learner, job.origin,
                             grader.runtime, grading.scores, grading.executed,
                             language=job.language, cell_timeout=grader.limits.cell_timeout),
                   grading.executed)


# Grading one submission: each step reads and fills the ``Grading``; the first to return an
# ``Outcome`` ends it (a zero, or the report). A step is known by its function's name.
STEPS: tuple[Step, ...] = (
    rebuild_answers, flag, strip_demonstrations, place, run_nbgrader, read_scores,
    keep_recorded_cases, report)


def _notebook(folder: Path, chapter: str) -> Path:
    """The chapter's notebook in one of nbgrader's folders (``source``, ``release``, or a
    learner's in ``submitted`` or ``autograded``): ``folder/NN_slug/NN_slug.ipynb``."""
    return folder / chapter / f"{chapter}.ipynb"


def _released(template: Path, chapter: str) -> nbformat.NotebookNode:
    return nbformat.read(_notebook(template / "release", chapter), as_version=4)


def _not_run(notebook: nbformat.NotebookNode, reason: str) -> nbformat.NotebookNode:
    """``notebook`` without outputs, every test cell's one output an error saying ``reason``."""
    marked = nbformat.from_dict(notebook)  # a copy
    for cell in marked.cells:
        if cell.cell_type != "code":
            continue
        cell.execution_count = None
        cell.outputs = []
        if cell.metadata.get("nbgrader", {}).get("grade"):
            cell.outputs = [nbformat.v4.new_output("error", ename=NOT_GRADED, evalue=reason,
                                                   traceback=[])]
    return marked


def _configure(root: Path, limits: Limits, course_id: str, scratch: Path | None = None
               ) -> None:
    """nbgrader's configuration for a course at ``root`` (its own gradebook there); its kernel
    keeps its files in ``scratch`` (default: a temporary folder per kernel)."""
    configuration.write(root, course_id, limits.cell_timeout, limits.sandbox,
                        f"sqlite:///{root / 'gradebook.db'}", scratch)


def generate(root: Path, chapter: str, source: str, limits: Limits,
             course_id: str = COURSE_ID) -> None:
    """Release a chapter from its source (text) in a course folder at ``root``, registering it
    in the gradebook there (hidden tests included)."""
    _configure(root, limits, course_id)
    path = _notebook(root / "source", chapter)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source, encoding="utf-8")
    # generate_assignment runs no notebook (no learner code, only the instructor's source)
    nbgrader(root, ["generate_assignment", chapter, "--force"], 300, limits)


def nbgrader(root: Path, args: list[str], timeout: int, limits: Limits,
             environment: dict[str, str] | None = None) -> str:
    """nbgrader's command line in the course at ``root``, under ``limits`` but outside the
    sandbox: it runs no learner code, and its kernel is sandboxed on its own
    (``autograder.host.kernel``)."""
    return run([sys.executable, "-m", "autograder.host.nbgrader_main", *args], root, timeout,
               dataclasses.replace(limits, sandbox=False), environment=environment)


def as_graded(notebook: nbformat.NotebookNode, source: nbformat.NotebookNode
              ) -> nbformat.NotebookNode:
    """``notebook`` with its test and locked cells as the instructor's ``source`` has them
    (by grade id), as nbgrader's autograde restores them before it runs the notebook."""
    def graded_or_locked(cell) -> bool:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        return bool(meta.get("grade_id")) and bool(
            meta.get("grade") and not meta.get("solution") or meta.get("locked"))

    by_id = {grade_id_of(c): c.source for c in source.cells if graded_or_locked(c)}
    restored = nbformat.from_dict(notebook)
    for cell in restored.cells:
        if graded_or_locked(cell) and grade_id_of(cell) in by_id:
            cell.source = by_id[grade_id_of(cell)]
    return restored


# what nbclient says of a kernel that died (or never ran) before it answered its first message
_NEVER_STARTED = "Kernel died before replying to kernel_info"


def _given_before_learner(notebook: Path, index: int | None, language: str) -> str | None:
    """The grade id of cell ``index`` of ``notebook`` where it is a given cell (locked, or a
    test) that runs before every cell the learner wrote (an answer cell, a cell of their
    own): a crash there is none of the learner's doing. None otherwise, or unknown."""
    if index is None:
        return None
    not_run = in_language(NOT_RUN, language)  # an unchanged demonstration, emptied
    for position, cell in enumerate(nbformat.read(notebook, as_version=4).cells):
        meta = cell.metadata.get("nbgrader", {})
        given = bool(meta.get("locked") or meta.get("grade") and not meta.get("solution"))
        if position == index:
            return (grade_id_of(cell) or "") if given and cell.cell_type == "code" else None
        if cell.cell_type == "code" and not given and cell.source != not_run:
            return None  # a cell the learner wrote ran first
    return None


def _neutralise(notebook: Path, index: int, source: str, language: str = ENGLISH) -> bool:
    """Keep cell ``index``, which killed the kernel, from running again; False where it
    cannot be. A cell of the learner's is replaced by one that raises, saying why. A test
    cell (nbgrader restores it from the gradebook, as ``source`` has it) is traced to the
    answers it checks, the names its ``check_*(name)`` calls pass: each such answer cell
    ends with a stand-in that raises when used, so that TODO's tests fail saying why and
    the rest of the notebook is graded without it. What it writes is in ``language``."""
    contents = nbformat.read(notebook, as_version=4)
    meta = contents.cells[index].metadata.get("nbgrader", {})
    if not (meta.get("grade") or meta.get("locked")):
        contents.cells[index].source = in_language(_CRASHED_CELL, language)
        nbformat.write(contents, notebook)
        return True
    if not meta.get("grade"):  # a given locked cell: it checks no answer of the learner's
        return False
    test = as_graded(contents, nbformat.reads(source, as_version=4)).cells[index]
    checked = set(re.findall(r"\bcheck_\w+\(\s*(\w+)", test.source))
    answers = [(c, sorted(defines(c.source) & checked)) for c in contents.cells
               if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")]
    answers = [(c, names) for c, names in answers if names]
    if not answers:
        return False
    for answer, names in answers:
        stand_ins = "".join(f"\n\n{name} = _CrashedAnswer({name!r})" for name in names)
        answer.source = in_language(_CRASHED_ANSWER, language) + answer.source + stand_ins
    nbformat.write(contents, notebook)
    return True


_CRASHED_CELL = tr_later(
    'raise RuntimeError("This cell crashed the Python kernel when the notebook was graded (a '
    'segfault or an exit), so it was not run.")')
_CRASHED_ANSWER = tr_later('''class _CrashedAnswer:
    """Stands in for an answer that crashed the Python kernel when its test ran."""

    def __init__(self, name):
        self.name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self.name} crashed the Python kernel when its test ran while "
                           "grading (a segfault or an exit), so it was not run again")

    __getitem__ = __call__  # a Triton kernel is launched as kernel[grid](...)


''')


DEMO = "demo"  # the tag of a cell that only shows something: no test needs what it does
NOT_RUN = tr_later("# A demonstration, not run while grading: no test needs it.\n")


def without_demonstrations(notebook: nbformat.NotebookNode, released: nbformat.NotebookNode,
                           language: str = ENGLISH) -> nbformat.NotebookNode:
    """``notebook`` with every cell that is one of the released notebook's demonstrations
    (tagged ``demo``, its source unchanged) emptied: serving a workload or animating a pool
    costs a grading run time and decides no grade; ``NOT_RUN``, in ``language``, says so in
    its place. A learner's own or edited cell still runs."""
    shown = {c.source for c in released.cells
             if c.cell_type == "code" and DEMO in c.get("metadata", {}).get("tags", [])}
    trimmed, not_run = nbformat.from_dict(notebook), in_language(NOT_RUN, language)
    for cell in trimmed.cells:
        if cell.get("cell_type") == "code" and cell.get("source") in shown:
            cell.source = not_run
    return trimmed
