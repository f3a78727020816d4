"""``python -m autograder.host.nbgrader_main ARGS``: nbgrader's own command line, started lighter,
that leaves the grades an ``autograde`` gave where the grader reads them.

nbgrader starts without jsonschema's format checkers (``course.runtime.without_format_checkers``:
about one and a half seconds of CPU in every grading process, for a check nbformat never
asks for), and checks its metadata schema once rather than before each cell it validates
(``_schema_checked_once``); everything else is nbgrader unchanged. The grader's own command
line starts the same way (``autograder.__main__``).

With ``KV_COURSE_SCORES`` set to a file, ``autograde ASSIGNMENT --student LEARNER`` also
writes there, as JSON, the score of each graded cell of the learner's notebook, read with
nbgrader's own API in this process, which has it loaded already: the grader need not load
nbgrader to read them.
"""

import json
import os
import sys
import types
from pathlib import Path

from course.runtime import without_format_checkers

SCORES = "KV_COURSE_SCORES"


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


def _schema_checked_once() -> None:
    """nbgrader validates each graded cell's metadata with ``jsonschema.validate``, which
    checks the schema itself before every cell (about 25 ms a notebook, of the three
    validations an ``autograde`` makes). Here nbgrader's validation checks each schema once,
    then validates each cell as ``jsonschema.validate`` does: the same validator class, the
    best match among the errors raised."""
    from jsonschema import exceptions, validators
    from nbgrader.nbgraderformat import common

    checked: dict[int, tuple] = {}  # id(schema) -> (schema, its validator)

    def validate(instance: object, schema: dict) -> None:
        if checked.get(id(schema), (None,))[0] is not schema:
            kind = validators.validator_for(schema)
            kind.check_schema(schema)
            checked[id(schema)] = (schema, kind(schema))
        error = exceptions.best_match(checked[id(schema)][1].iter_errors(instance))
        if error is not None:
            raise error

    common.jsonschema = types.SimpleNamespace(validate=validate)


def preload() -> None:
    """Import what nbgrader's ``autograde`` uses, and build the notebook validators it builds
    on first use, so that a process forked after it (``autograder.host.forkserver``) starts
    grading at once."""
    without_format_checkers()
    import nbclient  # noqa: F401 - loaded for the processes forked after
    import nbformat
    from nbformat.validator import get_validator
    from nbgrader.apps import AutogradeApp  # noqa: F401
    from nbgrader.apps.nbgraderapp import main  # noqa: F401

    from autograder.host import kernel  # noqa: F401 - nbgrader's kernel manager (configuration)

    _schema_checked_once()

    # Each is compiled from nbformat's schema on first use (about 50 ms): strict for reading
    # and writing a notebook, relaxed for nbconvert's checks between preprocessors. Built
    # here, a forked nbgrader finds them built, as one nbgrader process grading a class does.
    for relaxed in (False, True):
        get_validator(4, nbformat.v4.nbformat_minor, relax_add_props=relaxed)
    # The gradebook's ORM classes are configured on their first use (about 20 ms): here, once,
    # rather than in each forked nbgrader.
    from sqlalchemy.orm import configure_mappers

    configure_mappers()


def main(args: list[str]) -> int:
    """nbgrader's command line with ``args``; its exit status."""
    preload()
    from nbgrader.apps import AutogradeApp
    from nbgrader.apps.nbgraderapp import main as nbgrader

    sys.argv = ["nbgrader", *args]
    try:
        nbgrader()
    except SystemExit as exit:
        if exit.code is None or isinstance(exit.code, int):
            return exit.code or 0
        print(exit.code, file=sys.stderr)
        return 1
    if os.environ.get(SCORES) and AutogradeApp.initialized():
        write_scores(AutogradeApp.instance().coursedir, Path(os.environ[SCORES]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
