"""``python -m autograder.nbgrader_main ARGS``: nbgrader's own command line, started lighter,
that leaves the grades an ``autograde`` gave where the grader reads them.

jsonschema, which nbgrader loads through nbformat, builds a URI-syntax grammar at import time
when the optional ``rfc3987_syntax`` package is installed: about one and a half seconds of CPU
in every grading process, for a format check that nbformat's schema never asks for (nbformat
validates without format checking). Marking that package as absent makes jsonschema skip it;
everything else is nbgrader unchanged. The grader's own command line starts the same way
(``autograder.__main__``).

With ``KV_COURSE_SCORES`` set to a file, ``autograde ASSIGNMENT --student LEARNER`` also
writes there, as JSON, the score of each graded cell of the learner's notebook, read with
nbgrader's own API in this process, which has it loaded already: the grader need not load
nbgrader to read them.
"""

import json
import os
import sys
from pathlib import Path

SCORES = "KV_COURSE_SCORES"


def without_uri_grammar() -> None:
    """Make jsonschema skip the grammar; call before nbformat is first imported."""
    sys.modules.setdefault("rfc3987_syntax", None)


def write_scores(coursedir, destination: Path) -> None:
    """The scores nbgrader recorded for the notebook of the assignment it just autograded
    (one notebook, named as the assignment), grade id -> points; nothing when it recorded
    none."""
    from nbgrader.api import Gradebook, MissingEntry

    chapter, learner = coursedir.assignment_id, coursedir.student_id
    with Gradebook(coursedir.db_url, coursedir.course_id) as gradebook:
        try:
            graded = gradebook.find_submission_notebook(chapter, chapter, learner)
        except MissingEntry:
            return
        destination.write_text(json.dumps({g.name: g.score for g in graded.grades}))


if __name__ == "__main__":
    without_uri_grammar()
    from nbgrader.apps import AutogradeApp
    from nbgrader.apps.nbgraderapp import main

    main()
    if os.environ.get(SCORES) and AutogradeApp.initialized():
        write_scores(AutogradeApp.instance().coursedir, Path(os.environ[SCORES]))
