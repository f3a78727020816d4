"""What the grader runs in a graded notebook's kernel before the notebook's first cell.

nbgrader starts every kernel with ``--IPKernelApp.exec_lines`` set to ``ARM`` (the
configuration the grader writes, and the one ``course-dir`` writes for nbgrader's own
``autograde``), so this runs before any learner code, in the kernel itself:

1. ``course.setup()``: Triton's mode is chosen before any kernel is defined, and the library
   is told that the notebook is being graded (animations and heavy plots skip themselves);
2. ``seal.seal()``: the checks, imported from here on, are gated, and the audit hook that
   keeps the learner's code from what they know is installed (``autograder.seal``);
3. the cases the checks replay are read, where the grader hands the kernel some
   (``KV_COURSE_CASES``, ``autograder.checks._replay``; the file is removed once read, so
   the learner's code cannot read the hidden checks' inputs from it), and ``guard.arm()``:
   the chapter's checks, and what they rely on, are recorded (``autograder.guard``);
4. every answer of the chapter being graded becomes a tripwire (``autograder.borrowing``);
   the chapter is named by ``KV_COURSE_CHAPTER``, else by the kernel's working folder, which
   nbgrader names after the assignment (``autograded/<learner>/<NN_slug>/``);
5. each cell's start ends the test that the cell before it ran (``guard.verify()``, the first
   line of every test cell, starts one).

The library knows nothing of this: grading concerns stay in ``autograder``.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from pathlib import Path

ARM = "__import__('autograder.arming').arming.arm()"
TIMINGS = "KV_COURSE_TIMINGS"  # a file for the kernel's start and arming times
KERNEL_ARGUMENTS = [f"--IPKernelApp.exec_lines={ARM}"]


def arm(chapter: str | None = None) -> None:
    started = time.time()
    import course

    course.setup(quiet=True)  # first: Triton's mode is read when it is imported
    from autograder import borrowing, guard, seal
    from course.notebook import being_graded

    being_graded()
    seal.seal()
    slug = chapter or os.environ.get("KV_COURSE_CHAPTER") or Path.cwd().name
    from autograder.checks import _replay  # sealed: imported after ``seal()``

    if os.environ.get(_replay.CASES):  # read, then gone: the learner's code never sees it
        cases = Path(os.environ[_replay.CASES])
        _replay.load(cases)
        cases.unlink(missing_ok=True)
    guard.arm(slug)
    install_tripwires(slug)
    seal.AHEAD.clear()  # what a template compiled ahead is read at arming only
    from IPython import get_ipython

    shell = get_ipython()
    if shell is not None:
        shell.events.register("pre_run_cell", lambda *_: borrowing.leaving_test())
    if os.environ.get(TIMINGS):  # where the grader's breakdown of a notebook's time is kept
        Path(os.environ[TIMINGS]).write_text(json.dumps([started, time.time()]))


def install_tripwires(slug: str) -> None:
    """Make each answer of chapter ``slug`` a tripwire, wherever the library binds it. Nothing
    for an unknown chapter."""
    from autograder.answers import LIBRARY, chapter_answers
    from autograder.borrowing import tripwire
    from autograder.table import PARTS

    if slug not in PARTS:
        return
    for module_name, qualname in chapter_answers(slug):
        module = importlib.import_module(module_name)
        owner_name, _, name = qualname.rpartition(".")
        owner = getattr(module, owner_name) if owner_name else module
        original = vars(owner)[name]
        replacement = tripwire(original, qualname)
        setattr(owner, name, replacement)
        if not owner_name:  # the same function bound in other library modules
            for other in list(sys.modules.values()):
                if getattr(other, "__name__", "").split(".")[0] in LIBRARY:
                    for attribute, value in list(vars(other).items()):
                        if value is original:
                            setattr(other, attribute, replacement)
