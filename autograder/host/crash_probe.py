"""Which cell of a notebook kills its kernel (a segfault, ``os._exit``), found by running it.

    python -m autograder.host.crash_probe NOTEBOOK CELL_TIMEOUT   # prints the cell's index, or -1

The grader runs this, under the same limits as grading, only after nbgrader reported that a
submission's kernel died; it then grades the notebook again with that cell replaced by one
that raises, so the rest of the notebook still counts.
"""

from __future__ import annotations

import sys

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError

from autograder.arming import KERNEL_ARGUMENTS


def crashing_cell(path: str, cell_timeout: int) -> int:
    notebook = nbformat.read(path, as_version=4)
    started = {"index": -1}

    def note(cell, cell_index: int) -> None:
        started["index"] = cell_index

    client = NotebookClient(notebook, timeout=cell_timeout, kernel_name="python3",
                            allow_errors=True, on_cell_execute=note,
                            extra_arguments=KERNEL_ARGUMENTS)  # armed as when graded
    try:
        client.execute()
    except DeadKernelError:
        return started["index"]
    except Exception:  # a timeout or another failure: not a crash this probe can place
        return -1
    return -1


if __name__ == "__main__":
    print(crashing_cell(sys.argv[1], int(sys.argv[2])))
