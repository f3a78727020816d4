"""``python -m autograder``: see ``autograder.cli``."""

import sys

from autograder.nbgrader_main import without_uri_grammar

without_uri_grammar()  # before nbformat is imported: see autograder.nbgrader_main

from autograder.cli import main  # noqa: E402

sys.exit(main())
