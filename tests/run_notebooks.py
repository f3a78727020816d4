"""Execute notebooks as a learner's session would, outside nbgrader (so charts draw).

Imported by the tests (``execute``, ``errors``), and run by another environment's Python:

    python run_notebooks.py OUT NOTEBOOK...

runs each notebook in a new kernel of that Python, with the notebook's folder as the working
directory, and writes it, executed, to OUT under its own name.
"""

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def execute(path: Path, cwd: Path, timeout: int = 600) -> nbformat.NotebookNode:
    """``path`` run top to bottom in a fresh kernel; errors are recorded, not raised."""
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=timeout, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(cwd)}}).execute()
    return notebook


def errors(notebook: nbformat.NotebookNode) -> dict[str, str]:
    """``ename: evalue`` of each failing cell, by grade id (or ``cell N``)."""
    found = {}
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []):
            if output.output_type == "error":
                name = cell.metadata.get("nbgrader", {}).get("grade_id", f"cell {index}")
                found[name] = f"{output.ename}: {output.evalue}"
    return found


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for path in map(Path, sys.argv[2:]):
        nbformat.write(execute(path, path.parent), out / path.name)
        print(f"ran {path.name}", flush=True)
