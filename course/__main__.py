"""``python -m course doctor``."""

import sys

from course import doctor

USAGE = "usage: python -m course doctor   (checks this environment for the course)"

if __name__ == "__main__":
    if sys.argv[1:] != ["doctor"]:
        print(USAGE, file=sys.stderr)
        sys.exit(2)
    sys.exit(doctor.main())
