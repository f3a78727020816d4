"""Execute notebooks as a learner's fresh session would; run by another environment's Python.

    python run_notebooks.py OUT NOTEBOOK...

Each notebook runs in a new kernel of this Python with its folder as the working directory,
errors recorded rather than raised, and is written, executed, to OUT under its own name.
"""

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
for path in map(Path, sys.argv[2:]):
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(notebook, out / path.name)
    print(f"ran {path.name}", flush=True)
