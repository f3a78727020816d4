"""``python -m autograder.nbgrader_main ARGS``: nbgrader's own command line, started lighter.

jsonschema, which nbgrader loads through nbformat, builds a URI-syntax grammar at import time
when the optional ``rfc3987_syntax`` package is installed: about one and a half seconds of CPU
in every grading process, for a format check that nbformat's schema never asks for (nbformat
validates without format checking). Marking that package as absent makes jsonschema skip it;
everything else is nbgrader unchanged. The grader's own command line starts the same way
(``autograder.__main__``).
"""

import sys


def without_uri_grammar() -> None:
    """Make jsonschema skip the grammar; call before nbformat is first imported."""
    sys.modules.setdefault("rfc3987_syntax", None)


if __name__ == "__main__":
    without_uri_grammar()
    from nbgrader.apps.nbgraderapp import main

    sys.exit(main())
