"""``python -m autograder``: see ``autograder.host.cli``."""

import sys

from course.runtime import without_format_checkers

without_format_checkers()  # before nbformat is imported

if sys.argv[1:2] in (["grade"], ["grade-all"]) and "--dask" not in sys.argv:
    # Grading here: the fork server loads nbgrader (about 0.8 s) while this process loads
    # its own modules and reads the hand-ins, rather than once the first notebook is placed.
    from autograder.host import forkserver

    forkserver.start()

from autograder.host.cli import main  # noqa: E402

sys.exit(main())
