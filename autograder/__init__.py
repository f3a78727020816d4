"""The course's autograder, in folders by where its code runs (which decides what it may trust):

    autograder/*.py     the kernel side: runs in a learner's kernel and in the grading kernel,
                        beside the learner's code (the guard, the tripwires, the hints, the
                        chapter table); a learner's edition ships it (``__main__``, the
                        command line, aside)
    autograder/checks/  the visible checks, kernel side too: a test cell calls them
    autograder/hidden/  the hidden checks: the grading kernel only; the instructor's alone
    autograder/host/    the grader's own process: the command line, a class's submissions,
                        the sandbox each runs in, nbgrader, the gradebook, reports, a cluster;
                        it reads a submission's source but never runs it outside the sandbox
    autograder/builder/ the instructor's build: rendering and releasing the notebooks, the
                        learner edition, translations, a class's course directory, benchmarks

Each layer imports only those before it, except that the command line (``host/cli.py``)
starts the build's commands; ``tests/test_layers.py`` holds it. The kernel side needs only
the course library; the host and the build need nbgrader (the ``grader`` extra).
"""

from pathlib import Path


def kernel_side() -> list[Path]:
    """The kernel side's modules: those at this package's top, less its command line's door
    (``__main__``)."""
    return [path for path in sorted(Path(__file__).resolve().parent.glob("*.py"))
            if path.name != "__main__.py"]
