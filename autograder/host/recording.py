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
flag (``SaveAutoGrades``: a manual grade already given is kept and flagged for review), the
late penalty (``AssignLatePenalties``, through the class's ``LateSubmissionPlugin``), and the
feedback page (``generate_feedback``, with the class's preprocessors). ``release_feedback``,
``fetch_feedback``, ``export`` and formgrader work after it as after nbgrader's autograde.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import shutil
import tempfile
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook
from nbgrader.apps import NbGraderAPI
from nbgrader.plugins import CsvExportPlugin
from nbgrader.preprocessors import AssignLatePenalties, CheckCellMetadata, SaveAutoGrades
from nbgrader.preprocessors.base import NbGraderPreprocessor
from traitlets import Unicode
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

from autograder.host.gradebook import ClassGradebook, prepare_for_nbgrader


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
        config.Autograde.autograde_preprocessors = [SaveAutoGrades, AssignLatePenalties,
                                                    CheckCellMetadata]
        config.Replay.executed_directory = str(self._executed)
        config.NbGraderAPI.log_level = "WARN"
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
        with its ``timestamp.txt``; nothing to do for a file already there."""
        destination = self.submitted(learner, chapter)
        if destination.exists() and destination.resolve() == path.resolve():
            return
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, destination)
        stamp = destination.parent / "timestamp.txt"
        if when is not None:
            stamp.write_text(when.strftime("%Y-%m-%d %H:%M:%S.%f UTC"), encoding="utf-8")
        else:
            stamp.unlink(missing_ok=True)

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
            lines = (outcome.get("log", "") + outcome.get("error", "")).strip().splitlines()
            raise NotRecorded(" / ".join(lines[-3:]) or "nbgrader gave no reason")
