"""``python -m course doctor``."""

import sys

from course.runtime import without_format_checkers

without_format_checkers()  # before the doctor imports nbgrader, which imports nbformat

from course import doctor  # noqa: E402

USAGE = "usage: python -m course doctor   (checks this environment for the course)"

if __name__ == "__main__":
    if sys.argv[1:] != ["doctor"]:
        print(USAGE, file=sys.stderr)
        sys.exit(2)
    sys.exit(doctor.main())
