"""nbgrader's configuration for this course: one text, for a class's course directory
(``python -m autograder course-dir``) and for the course each submission is graded in
(``grade``, ``grade-all``), so that nbgrader's own ``autograde`` and the grader run a notebook
the same way.

What it sets, and why:

* the course's folder is the folder of the file, so a class can be copied or moved;
* a time limit per cell; a Python warning on stderr does not zero a test cell (nbgrader
  scores any stderr as a failure); outputs capped;
* the kernel arms before the first cell (``autograder.arming``: the checks recorded, the
  chapter's answers made tripwires);
* the kernel runs in the bubblewrap sandbox, alone (``autograder.host.kernel``), and is ended at
  once when the notebook is done;
* feedback pages show each failing test's hint instead of hidden tests and tracebacks.
"""

from __future__ import annotations

from pathlib import Path

from autograder.arming import KERNEL_ARGUMENTS

COURSE_ID = "paged-kv-course"  # nbgrader's course id, unless a class names its own

# A Python warning on stderr (say, a library's DeprecationWarning) must not zero a test cell:
# nbgrader scores any stderr output as a failure, so IgnorePattern drops these outputs first.
WARNING_ON_STDERR = r"(?m)^.*:\d+: \w*Warning: "

_TEXT = '''\
# nbgrader's settings for this course, written by its grader (`python -m autograder`).
import os

from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
from nbgrader.preprocessors import GetGrades

from autograder.host.feedback import HideHiddenTests

c = get_config()
c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.course_id = {course_id!r}
{optional}
# Learner code runs in a fresh kernel with a time limit per cell.
c.Execute.timeout = {cell_timeout}
c.Execute.kernel_name = "python3"
# A Python warning on stderr must not zero a test cell (nbgrader scores any stderr as failed).
c.IgnorePattern.enabled = True
c.IgnorePattern.pattern = {pattern!r}
c.LimitOutput.max_lines = 1000
c.LimitOutput.max_traceback = 100
# Before a graded notebook's first cell: the checks recorded, the chapter's answers guarded.
c.Execute.extra_arguments = {kernel_arguments!r}
# The kernel, the one process that runs learner code, runs alone in a bubblewrap sandbox;
# it is the notebook's alone, so nothing waits for it to end gracefully.
c.Execute.kernel_manager_class = "autograder.host.kernel.SandboxedKernelManager"
c.SandboxedKernelManager.sandbox = {sandbox}
c.Execute.shutdown_kernel = "immediate"
# Feedback: the hidden tests' source and every traceback are replaced by the test's hint.
c.GenerateFeedback.preprocessors = [GetGrades, CSSHTMLHeaderPreprocessor, HideHiddenTests]
'''


def write(root: Path, course_id: str, cell_timeout: int = 120, sandbox: bool = True,
          db_url: str | None = None, scratch: Path | None = None,
          exchange: Path | None = None) -> Path:
    """Write ``root/nbgrader_config.py``: the gradebook ``db_url`` (default: nbgrader's, in
    ``root``), the kernel's files in ``scratch`` (default: a temporary folder per kernel),
    nbgrader's exchange at ``exchange`` (for a class hub). Returns the file."""
    optional = [f"c.CourseDirectory.db_url = {db_url!r}" if db_url else "",
                f"c.SandboxedKernelManager.scratch = {str(scratch)!r}" if scratch else "",
                f"c.Exchange.root = {str(exchange.resolve())!r}" if exchange else ""]
    config = root / "nbgrader_config.py"
    root.mkdir(parents=True, exist_ok=True)
    config.write_text(_TEXT.format(
        course_id=course_id, optional="\n".join(line for line in optional if line),
        cell_timeout=cell_timeout, pattern=WARNING_ON_STDERR,
        kernel_arguments=KERNEL_ARGUMENTS, sandbox=sandbox), encoding="utf-8")
    return config
