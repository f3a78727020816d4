"""The built wheel alone runs every chapter, as a Colab or VS Code session would.

A fresh virtual environment gets a Jupyter kernel (and CPU torch where there is no GPU, as
Colab has torch already), nothing from this checkout. The solution notebooks are copied, with
the built wheel beside them, to a folder outside the checkout and run there top to bottom, in
order: the first one's setup cell installs the course from the wheel, as on Colab when a
learner uploads it. Each must run without an error and show its charts and widgets.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import nbformat
import pytest
import torch
from conftest import CHAPTERS, REPO
from run_notebooks import errors

pytestmark = pytest.mark.pipeline

PICTURES = {"application/vnd.plotly.v1+json", "application/vnd.jupyter.widget-view+json"}


def _pip(venv, *args: str) -> None:
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *args],
                   check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    """(the fresh environment's Python, the folder of notebooks it executed)."""
    root = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir",
                    str(root / "dist"), str(REPO)], check=True, capture_output=True)
    wheel = next((root / "dist").glob("paged_kv_course-*.whl"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    if not torch.cuda.is_available():  # never let pip pull a CUDA build onto a CPU machine
        _pip(venv, os.environ.get("TORCH_CPU") or f"torch=={torch.__version__.split('+')[0]}")
    _pip(venv, "ipykernel", "nbclient")
    notebooks = root / "notebooks"
    notebooks.mkdir()
    shutil.copyfile(wheel, notebooks / wheel.name)
    for chapter in CHAPTERS:
        shutil.copyfile(chapter.source, notebooks / chapter.source.name)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TRITON_INTERPRET", "NBGRADER_EXECUTION")}
    python = venv / "bin" / "python"
    subprocess.run([str(python), str(REPO / "tests" / "run_notebooks.py"), str(root / "ran"),
                    *sorted(map(str, notebooks.glob("*.ipynb")))],
                   cwd=notebooks, env=env, check=True, capture_output=True, text=True,
                   timeout=1800)
    return python, root / "ran"


def test_the_course_is_imported_from_the_wheel_not_from_this_checkout(wheel_env):
    python, _ = wheel_env
    located = subprocess.run(
        [str(python), "-c", "import autograder, course, kernels\n"
         "print(course.__file__, kernels.__file__, autograder.__file__)"],
        cwd=python.parents[2], capture_output=True, text=True, check=True).stdout.split()
    assert all("site-packages" in path for path in located), located


def test_the_first_setup_cell_installed_the_course_from_the_wheel_beside_it(wheel_env):
    _, ran = wheel_env
    notebook = nbformat.read(ran / CHAPTERS[0].source.name, as_version=4)
    first = next(c for c in notebook.cells if c.cell_type == "code")
    printed = "".join(o.get("text", "") for o in first.outputs)
    assert re.search(r"Installing the course from paged_kv_course-.*\.whl", printed), printed


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.name)
def test_a_solution_runs_top_to_bottom_from_the_wheel(chapter, wheel_env):
    _, ran = wheel_env
    notebook = nbformat.read(ran / chapter.source.name, as_version=4)
    assert errors(notebook) == {}
    shown = [o for c in notebook.cells for o in c.get("outputs", [])
             if PICTURES & set(o.get("data", {}))]
    assert shown, "the chart and widget cells showed nothing"
