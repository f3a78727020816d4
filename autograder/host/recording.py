"""A notebook graded elsewhere, recorded in the class's course directory by nbgrader itself.

The notebook was executed in a course of its own (``autograder.host.autograde``: its kernel
sandboxed, maybe on another machine). Everything nbgrader's ``autograde`` does besides
executing is then done by nbgrader, in the class's course directory, through its own API
(``NbGraderAPI.autograde``), with one step swapped: ``Replay`` hands nbgrader the notebook
as the sandboxed run executed it, where nbgrader would clear and execute it again.

    <course>/
        nbgrader_config.py  gradebook.db  source/NN_slug/
        submitted/<learner>/NN_slug/NN_slug.ipynb, timestamp.txt   the hand-in, as
                 ``nbgrader collect`` leaves it (``stage`` puts a zip's or folder's there)
        autograded/<learner>/NN_slug/   written by nbgrader's autograde (timestamp.txt too)
        feedback/<learner>/NN_slug/     written by nbgrader's generate_feedback

So nbgrader decides, as in its own ``autograde``: the learner and the submission with its
hand-in time, notebooks it does not know skipped, every grade and its ``needs_manual_grade``
flag (``SaveAutoGrades``: a manual grade already given is kept and flagged for review; then
``FlagRestored``: a test cell the learner deleted, put back and graded, is flagged as
nbgrader flags a missing one), the late penalty (``AssignLatePenalties``, through the
class's ``LateSubmissionPlugin``), and the feedback page (``generate_feedback``, with the
class's preprocessors). ``release_feedback``,
``fetch_feedback``, ``export`` and formgrader work after it as after nbgrader's autograde.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import secrets
import shutil
import tempfile
from pathlib import Path

import nbformat
from nbgrader import utils
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.apps import NbGraderAPI
from nbgrader.plugins import CsvExportPlugin
from nbgrader.preprocessors import AssignLatePenalties, CheckCellMetadata, SaveAutoGrades
from nbgrader.preprocessors.base import NbGraderPreprocessor
from traitlets import Unicode
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

from autograder.host.chapters import grade_id_of
from autograder.host.gradebook import ClassGradebook, prepare_for_nbgrader
from autograder.host.restore import was_restored

# What ``nbgrader submit`` writes beside a hand-in, ``autograde`` and ``generate_feedback``
# copy along, and ``release_feedback`` reads beside every feedback page
TIMESTAMP, SECRET = "timestamp.txt", "submission_secret.txt"


class Replay(NbGraderPreprocessor):
    """Stands in for nbgrader's sanitising and executing: the notebook as the sandboxed run
    executed it, from ``executed_directory/<learner>/<assignment>/<notebook>.ipynb``. The
    sandboxed run was nbgrader's own autograde, of the same source, so its cells are the
    registered ones and its outputs are final (outputs limited, warnings on stderr ignored)."""

    executed_directory = Unicode("", help="where the executed notebooks wait").tag(config=True)

    def preprocess(self, nb, resources):
        about = resources["nbgrader"]
        path = Path(self.executed_directory, about["student"], about["assignment"],
                    f"{about['notebook']}.ipynb")
        return nbformat.read(path, as_version=4), resources


def _late_penalty(config: Config) -> str:
    """The class's late-penalty configuration as text: which plugin nbgrader's
    ``AssignLatePenalties`` uses, and the settings of ``LateSubmissionPlugin``."""
    sections = ("AssignLatePenalties", "LateSubmissionPlugin")
    return repr([(section, sorted((key, repr(value)) for key, value in config[section].items()))
                 for section in sections if section in config])


class FlagRestored(NbGraderPreprocessor):
    """After ``SaveAutoGrades``: the grade of a test cell the learner deleted, graded as put
    back (``restore.mark_restored``), waits for manual grading, as nbgrader's own autograde
    leaves the grade of a test cell missing from a submission; its score stands."""

    def preprocess(self, nb, resources):
        about = resources["nbgrader"]
        deleted = [grade_id_of(c) for c in nb.cells if utils.is_grade(c) and was_restored(c)]
        if deleted:
            with Gradebook(about["db_url"]) as book:  # as ``SaveAutoGrades`` opens it
                for grade_id in deleted:
                    book.find_grade(grade_id, about["notebook"], about["assignment"],
                                    about["student"]).needs_manual_grade = True
                book.db.commit()
        return nb, resources


class NotRecorded(RuntimeError):
    """nbgrader refused to record a grade; the message is the end of its log."""


class ClassCourse:
    """A class's nbgrader course directory at ``root``, with the class's own configuration
    (its ``nbgrader_config.py``) and its gradebook (``db_url``, where one is given)."""

    def __init__(self, root: Path, db_url: str | None = None) -> None:
        prepare_for_nbgrader()
        self.root = root.resolve()
        config = Config()
        if (self.root / "nbgrader_config.py").exists():
            config.merge(PyFileConfigLoader("nbgrader_config.py", path=str(self.root))
                         .load_config())
        config.CourseDirectory.root = str(self.root)  # wherever the folder was copied to
        if db_url:
            config.CourseDirectory.db_url = db_url
        self._executed = Path(tempfile.mkdtemp(prefix="kv-course-executed-"))
        config.Autograde.sanitize_preprocessors = [Replay]
        config.Autograde.autograde_preprocessors = [SaveAutoGrades, FlagRestored,
                                                    AssignLatePenalties, CheckCellMetadata]
        config.Replay.executed_directory = str(self._executed)
        config.NbGraderAPI.log_level = "WARN"
        self.late_penalty = _late_penalty(config)  # a change records every hand-in again
        self.api = NbGraderAPI(config=config)
        self.db_url = self.api.coursedir.db_url
        self.course_id = self.api.coursedir.course_id
        self.book = ClassGradebook(self.db_url, self.course_id)

    def close(self) -> None:
        shutil.rmtree(self._executed, ignore_errors=True)

    def register(self, chapter: str) -> None:
        """nbgrader's ``generate_assignment`` of a chapter the gradebook does not hold yet (a
        chapter registered is never registered again: that would overwrite its cells)."""
        if not self.book.is_registered(chapter):
            self._check(self.api.generate_assignment(chapter, force=True))
            self.book.remember()

    def submitted(self, learner: str, chapter: str) -> Path:
        return Path(self.api.coursedir.format_path(
            self.api.coursedir.submitted_directory, learner, chapter)) / f"{chapter}.ipynb"

    def autograded(self, learner: str, chapter: str) -> Path:
        return Path(self.api.coursedir.format_path(
            self.api.coursedir.autograded_directory, learner, chapter)) / f"{chapter}.ipynb"

    def feedback(self, learner: str, chapter: str) -> Path:
        return Path(self.api.coursedir.format_path(
            self.api.coursedir.feedback_directory, learner, chapter)) / f"{chapter}.html"

    def stage(self, path: Path, learner: str, chapter: str, when: dt.datetime | None) -> None:
        """Put a hand-in where ``nbgrader collect`` would: ``submitted/<learner>/<chapter>/``
        with its ``timestamp.txt`` and ``submission_secret.txt`` (the one beside ``path``,
        else the one staged before, else a new one); nothing to do for a file already
        there."""
        destination = self.submitted(learner, chapter)
        if destination.exists() and destination.resolve() == path.resolve():
            return
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, destination)
        stamp = destination.parent / TIMESTAMP
        if when is not None:
            stamp.write_text(_stamp(when), encoding="utf-8")
        else:
            stamp.unlink(missing_ok=True)
        if (path.parent / SECRET).is_file():
            shutil.copyfile(path.parent / SECRET, destination.parent / SECRET)
        elif not (destination.parent / SECRET).exists():
            # a hand-in that came by no exchange; stable once made, so a page released
            # again keeps its name in the exchange
            (destination.parent / SECRET).write_text(new_secret(), encoding="utf-8")

    def record(self, learner: str, chapter: str, executed: dict) -> None:
        """nbgrader's autograde of the staged hand-in, the notebook ``executed`` standing in
        for its execution; then its feedback page. Raises ``NotRecorded``."""
        waiting = self._executed / learner / chapter / f"{chapter}.ipynb"
        waiting.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nbformat.from_dict(executed), waiting)
        try:
            self.book.check_untouched()
            self._check(self.api.autograde(chapter, learner, force=True, create=True))
            self._check(self.api.generate_feedback(chapter, learner, force=True))
        finally:
            waiting.unlink(missing_ok=True)
            self.book.remember()

    def record_refused(self, learner: str, chapter: str) -> None:
        """nbgrader's autograde of a staged hand-in the grader refused, which fails as
        nbgrader's own fails on a notebook it cannot grade (a damaged file fails as it
        reads it; any other, as ``Replay`` finds no executed notebook): the submission is
        recorded with its hand-in time, its grades keep what they held (new ones wait for
        manual grading), and its ``autograded/`` folder is removed. Formgrader then lists it
        as it lists such a hand-in after nbgrader's autograde."""
        self.book.check_untouched()
        try:
            self.api.autograde(chapter, learner, force=True, create=True)  # fails, as meant
        finally:
            self.book.remember()

    def penalty(self, learner: str, chapter: str) -> float:
        """The late penalty nbgrader recorded for the learner's hand-in of the chapter (0
        where it holds none)."""
        with Gradebook(self.db_url, self.course_id) as book:
            try:
                return float(book.find_submission(chapter, learner).late_submission_penalty)
            except MissingEntry:
                return 0.0

    def label_page(self, learner: str, chapter: str, when: dt.datetime | None) -> None:
        """Beside a feedback page the grader wrote itself (for a hand-in not graded), what
        ``release_feedback`` reads as ``generate_feedback`` leaves it: the hand-in's
        ``timestamp.txt``, and the staged hand-in's ``submission_secret.txt`` (else a new
        one)."""
        folder = self.feedback(learner, chapter).parent
        if when is not None:
            (folder / TIMESTAMP).write_text(_stamp(when), encoding="utf-8")
        staged = self.submitted(learner, chapter).parent / SECRET
        if staged.is_file():
            shutil.copyfile(staged, folder / SECRET)
        elif not (folder / SECRET).exists():
            (folder / SECRET).write_text(new_secret(), encoding="utf-8")

    def rerecord(self, learner: str, chapter: str) -> None:
        """Record again what is in ``autograded/`` (a resubmission of the same file: its new
        hand-in time may change its late penalty)."""
        executed = nbformat.read(self.autograded(learner, chapter), as_version=4)
        self.record(learner, chapter, executed)

    def add_learner(self, learner: str) -> None:
        self.book.add_learner(learner)

    def export(self) -> tuple[list[str], list[dict[str, str]]]:
        """``nbgrader export``'s columns and rows (its own plugin), a row per learner and
        chapter."""
        with tempfile.TemporaryDirectory(prefix="kv-course-export-") as folder:
            destination = Path(folder) / "grades.csv"
            with Gradebook(self.db_url, self.course_id) as gradebook:
                CsvExportPlugin(to=str(destination)).export(gradebook)
            exported = csv.DictReader(io.StringIO(destination.read_text(encoding="utf-8")))
            return list(exported.fieldnames or []), list(exported)

    @staticmethod
    def _check(outcome: dict) -> None:
        if not outcome.get("success"):
            raise NotRecorded(nbgraders_error(outcome))


def nbgraders_error(outcome: dict) -> str:
    """What failed, in nbgrader's own words, from what its API returned (``capture_log``'s
    log and traceback): the first ERROR line of its log, and the exception it logged (the
    last line of the first traceback there); else the exception its command raised."""
    log = outcome.get("log", "").splitlines()
    said = [line.removeprefix("[ERROR]").strip() for line in log if line.startswith("[ERROR]")]
    first = next((line for line in said if not line.startswith("Traceback")), "")
    start = next((i for i, line in enumerate(log) if line.startswith("[ERROR] Traceback")),
                 None)
    raised = outcome.get("error", "").strip().splitlines()[-1:]
    if start is not None:  # the logged traceback runs to the next log line
        block = [line for line in log[start + 1:] if line.strip()]
        end = next((i for i, line in enumerate(block) if line.startswith("[")), len(block))
        raised = [block[end - 1].strip()] if end else raised
    raised = [line for line in raised if not first or first not in line]  # said once
    return " / ".join(filter(None, [first, *raised])) or "nbgrader gave no reason"


def new_secret() -> str:
    """A submission secret as ``nbgrader submit`` makes one: the key a learner's feedback is
    released and fetched under."""
    return secrets.token_hex(64)


def _stamp(when: dt.datetime) -> str:
    """A hand-in time as ``nbgrader submit`` writes ``timestamp.txt``."""
    return when.strftime("%Y-%m-%d %H:%M:%S.%f UTC")
