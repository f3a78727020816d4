"""A class's nbgrader course directory: setting one up, and reading its settings.

    python -m autograder course-dir DIR [--chapters 1-3,5] [--course-id ID] [--exchange PATH]

writes ``DIR/source/NN_slug/NN_slug.ipynb`` for each chapter (from the package's solutions)
and ``DIR/nbgrader_config.py``: the settings grading needs (time limits, warnings on stderr
that must not zero a test), and feedback that keeps hidden tests hidden, so that nbgrader's
own ``generate_feedback`` on this course shows no hidden test's source and no traceback.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from autograder.chapters import Chapter
from autograder.gradebook import COURSE_ID

CONFIG = '''\
# nbgrader settings for this class (written by `python -m autograder course-dir`).
from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
from nbgrader.preprocessors import GetGrades

from autograder.feedback import HideHiddenTests

c = get_config()
c.CourseDirectory.root = {root!r}
c.CourseDirectory.course_id = {course_id!r}
{exchange}
# Learner code runs in a fresh kernel with a time limit per cell.
c.Execute.timeout = 120
c.Execute.kernel_name = "python3"
# A Python warning on stderr must not zero a test cell (nbgrader scores any stderr as failed).
c.IgnorePattern.enabled = True
c.IgnorePattern.pattern = {pattern!r}
c.LimitOutput.max_lines = 1000
# Before a graded notebook's first cell: the checks recorded, the chapter's answers guarded.
c.Execute.extra_arguments = {kernel_arguments!r}
# Feedback: the hidden tests' source and every traceback are replaced by the test's hint.
c.GenerateFeedback.preprocessors = [GetGrades, CSSHTMLHeaderPreprocessor, HideHiddenTests]
'''


def parse_chapters(spec: str, known: dict[str, Chapter]) -> list[Chapter]:
    """``1-3,5`` -> those chapters; ``all`` -> every chapter. Raises ValueError naming what
    is unknown."""
    if spec == "all":
        return list(known.values())
    by_number = {int(c.number): c for c in known.values()}
    wanted: list[int] = []
    for part in spec.split(","):
        first, _, last = part.strip().partition("-")
        try:
            wanted += range(int(first), int(last or first) + 1)
        except ValueError:
            raise ValueError(f"{part!r} is not a chapter number or range (say 1-3,5)") from None
    missing = sorted(set(wanted) - set(by_number))
    if missing:
        raise ValueError(f"no chapter {', '.join(map(str, missing))} (there are "
                         f"{min(by_number)}-{max(by_number)})")
    return [by_number[n] for n in sorted(set(wanted))]


def write_course_dir(root: Path, selected: list[Chapter], course_id: str = COURSE_ID,
                     exchange: Path | None = None) -> list[Path]:
    """Set up (or add chapters to) an nbgrader course directory; return what was written.
    A chapter already in ``source/`` is left as the class has it."""
    from autograder.arming import KERNEL_ARGUMENTS
    from autograder.autograde import WARNING_ON_STDERR

    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    written = []
    config = root / "nbgrader_config.py"
    if not config.exists():
        line = f"c.Exchange.root = {str(exchange.resolve())!r}\n" if exchange else ""
        config.write_text(CONFIG.format(root=str(root), course_id=course_id, exchange=line,
                                        pattern=WARNING_ON_STDERR,
                                        kernel_arguments=KERNEL_ARGUMENTS), encoding="utf-8")
        written.append(config)
    for chapter in selected:
        destination = root / "source" / chapter.name / f"{chapter.name}.ipynb"
        if not destination.exists():
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(chapter.source, destination)
            written.append(destination)
    return written


@dataclass(frozen=True)
class CourseSettings:
    db_url: str
    course_id: str


def settings(course: Path) -> CourseSettings:
    """The gradebook and course id that the course directory's ``nbgrader_config.py`` sets
    (nbgrader's defaults where it sets none)."""
    from traitlets.config.loader import PyFileConfigLoader

    config = course / "nbgrader_config.py"
    loaded = PyFileConfigLoader(config.name, path=str(course)).load_config() \
        if config.exists() else {}
    directory = loaded.get("CourseDirectory", {})
    db_url = directory.get("db_url") or f"sqlite:///{course.resolve() / 'gradebook.db'}"
    return CourseSettings(str(db_url), str(directory.get("course_id") or ""))
