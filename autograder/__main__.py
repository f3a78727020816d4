"""``python -m autograder``: see ``autograder.host.cli``."""

import sys

from course.runtime import without_format_checkers

without_format_checkers()  # before nbformat is imported

from autograder.host.cli import main  # noqa: E402

sys.exit(main())
