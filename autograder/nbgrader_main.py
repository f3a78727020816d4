"""``python -m autograder.nbgrader_main ARGS``: nbgrader's own command line, started lighter.

jsonschema, which nbgrader loads through nbformat, builds a URI-syntax grammar at import time
when the optional ``rfc3987_syntax`` package is installed: about one and a half seconds of CPU
in every grading process, for a format check that nbformat's schema never asks for (nbformat
validates without format checking). Marking that package as absent makes jsonschema skip it;
everything else is nbgrader unchanged.
"""

import sys

sys.modules.setdefault("rfc3987_syntax", None)  # jsonschema skips a format it cannot import

from nbgrader.apps.nbgraderapp import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
