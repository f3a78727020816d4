"""A class's learner edition, as its learners get it: its wheel alone runs every chapter.

The edition is built with chapters 1 to 8 revealed (chapter 9 is the one being learned). A
fresh virtual environment gets a Jupyter kernel (and CPU torch where there is no GPU, as
Colab has torch already), nothing from this checkout. The instructor's notebooks (chapter 1's
in English, every chapter's in Chinese) and the edition's exercises are copied, with the
edition's wheel beside them, to a folder outside the checkout and run there top to bottom: the
first one's setup cell installs the course from the wheel, as on Colab when a learner uploads
it. Every solution runs without an error (its visible tests pass with no answer of chapter 9
in the library), shows its charts and widgets, and, in Chinese, shows no English sentence;
every exercise fails only in its test cells. The exercises of an edition with nothing revealed
run there too: a cell that needs an unfinished TODO stops with one line.

Each notebook runs once in the suite where it can serve several tests: the English solutions
run top to bottom in JupyterLab (tests/test_browser.py), so here the Chinese ones, which need
the catalogues the wheel must ship, stand for them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch
from conftest import CHAPTERS, LEARNED, REPO
from english import english_labels, english_sentences, shown
from notebook_variants import without_hidden_tests
from run_notebooks import errors

from autograder.builder.edition import build
from autograder.builder.repository import write_setup_cell
from autograder.table import PARTS

pytestmark = pytest.mark.pipeline

PICTURES = {"application/vnd.plotly.v1+json", "application/vnd.jupyter.widget-view+json"}
ZH = "zh_CN"
# The solutions run: chapter 1's in English (its setup cell installs the wheel), every
# chapter's in Chinese.
SOLUTIONS = [(None, CHAPTERS[0])] + [(ZH, chapter) for chapter in CHAPTERS]


def _ran_as(language: str | None, chapter) -> str:
    """The name a solution runs under in the notebooks' folder."""
    return f"{language}-{chapter.source.name}" if language else chapter.source.name


def _colab_like(venv, wheels) -> None:
    """What Colab has before the course: torch (its CPU build where there is no GPU, taken as
    pip would take it: ``TORCH_CPU``, else this environment's version), a Jupyter kernel and
    nbclient, installed by uv (beside this Python, a dev requirement): 19 to 24 s here, where
    pip took 42 to 44 s, most of it unpacking and compiling torch's 190 MB wheel."""
    python = str(venv / "bin" / "python")
    wanted = ["ipykernel", "nbclient"]
    if not torch.cuda.is_available():  # never let an installer pull a CUDA build onto a CPU
        subprocess.run([python, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels),
                        *(os.environ.get("TORCH_CPU")
                          or f"torch=={torch.__version__.split('+')[0]}").split()],
                       check=True, capture_output=True, text=True)
        wanted += map(str, wheels.glob("torch-*.whl"))
    subprocess.run([str(Path(sys.executable).parent / "uv"), "pip", "install", "--python",
                    python, "-q", "--compile-bytecode", *wanted],
                   check=True, capture_output=True, text=True)


def _run(python, notebooks, out, env) -> None:
    subprocess.run([str(python), str(REPO / "tests" / "run_notebooks.py"), str(out),
                    *sorted(map(str, notebooks))], cwd=notebooks[0].parent, env=env,
                   check=True, capture_output=True, text=True, timeout=1800)


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    """(the fresh environment's Python, the folder of notebooks it ran, the edition with
    nothing revealed and the folder of its exercises as they ran)."""
    root = tmp_path_factory.mktemp("wheel")
    edition = build(root / "class", {int(c.number) for c in CHAPTERS[:-1]})
    bare = build(root / "bare", set(), wheel=False)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    _colab_like(venv, root / "wheels")
    notebooks = root / "notebooks"
    notebooks.mkdir()
    shutil.copyfile(edition.wheel, notebooks / edition.wheel.name)
    for language, chapter in SOLUTIONS:
        without_hidden_tests(chapter.source_in(language), notebooks / _ran_as(language, chapter))
    for chapter in CHAPTERS:
        shutil.copyfile(edition.root / "exercises" / chapter.source.name,
                        notebooks / f"exercise-{chapter.source.name}")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TRITON_INTERPRET", "NBGRADER_EXECUTION")}
    python = venv / "bin" / "python"
    _run(python, [notebooks / c.source.name for c in CHAPTERS[:1]], root / "ran", env)
    _run(python, [p for p in notebooks.glob("*.ipynb") if p.name != CHAPTERS[0].source.name],
         root / "ran", env)
    _run(python, sorted((bare.root / "exercises").glob("*.ipynb")), root / "bare-ran",
         dict(env, PYTHONPATH=str(bare.root)))  # the bare edition's library, not the wheel's
    return python, root / "ran", bare, root / "bare-ran"


def test_the_course_is_the_editions_wheel_with_the_learned_chapter_stubbed(wheel_env):
    python, *_ = wheel_env
    script = ("import autograder, course, kernels\n"
              "print(course.__file__, kernels.__file__, autograder.__file__)\n"
              "import importlib.util\n"
              "print(importlib.util.find_spec('autograder.hidden'))\n")
    located = subprocess.run([str(python), "-c", script], cwd=python.parents[2],
                             capture_output=True, text=True, check=True).stdout.split()
    assert all("site-packages" in path for path in located[:3]), located
    assert located[3] == "None"  # no hidden checks in a learner's environment
    module, name = next((where, grade_id) for grade_id, where in
                        PARTS[LEARNED.name].answers.items() if ":" not in where)
    stub = subprocess.run(
        [str(python), "-c", "import inspect, course; course.setup(quiet=True)\n"
         f"from {module} import {name} as answer\n"
         "answer(*[None] * len(inspect.signature(answer).parameters))"],
        cwd=python.parents[2], capture_output=True, text=True)
    assert "is not part of this edition" in stub.stderr, stub.stderr


def test_the_first_setup_cell_installed_the_course_from_the_wheel_beside_it(wheel_env):
    _, ran, *_ = wheel_env
    notebook = nbformat.read(ran / CHAPTERS[0].source.name, as_version=4)
    first = next(c for c in notebook.cells if c.cell_type == "code")
    printed = "".join(o.get("text", "") for o in first.outputs)
    assert re.search(r"Installing the course from paged_kv_course-.*\.whl", printed), printed


def test_the_editions_doctor_finds_no_problem_where_only_the_edition_is_installed(wheel_env):
    python, *_ = wheel_env
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    done = subprocess.run([str(python), "-m", "course", "doctor"], cwd=python.parents[2],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("ok   edition") and lines[-1] == "ready for the course", lines


@pytest.mark.parametrize(("language", "chapter"), SOLUTIONS,
                         ids=[_ran_as(*solution).removesuffix(".ipynb") for solution in SOLUTIONS])
def test_a_solution_runs_top_to_bottom_and_passes_its_visible_tests(language, chapter, wheel_env):
    _, ran, *_ = wheel_env
    notebook = nbformat.read(ran / _ran_as(language, chapter), as_version=4)
    assert errors(notebook) == {}
    pictures = [o for c in notebook.cells for o in c.get("outputs", [])
                if PICTURES & set(o.get("data", {}))]
    assert pictures, "the chart and widget cells showed nothing"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.name)
def test_a_chinese_solution_speaks_chinese(chapter, wheel_env):
    """Its set-up line, outputs, charts' texts and widgets' first views: no English sentence
    (tests/english.py says what one is)."""
    _, ran, *_ = wheel_env
    notebook = nbformat.read(ran / _ran_as(ZH, chapter), as_version=4)
    setup = next(c for c in notebook.cells if c.cell_type == "code")
    said = "".join(o.get("text", "") for o in setup.outputs)
    assert "解释器" in said or "GPU 模式" in said, said
    english = [f"{cell}, {output}: {said!r}" for cell, output, text in shown(notebook)
               for said in english_sentences(text) + english_labels(text)]
    assert not english, (f"{len(english)} English sentences or labels in {chapter.name}'s "
                         "outputs, in Chinese:\n" + "\n".join(english[:30]))


def _fails_only_where_a_learner_expects(notebook) -> dict[str, str]:
    """Errors other than a test cell's and a cell stopping for an unfinished TODO."""
    return {name: error for name, error in errors(notebook).items()
            if not name.startswith("test_") and not error.startswith("NotReady:")}


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.name)
def test_an_exercise_fails_only_in_its_test_cells(chapter, wheel_env):
    """Where the edition holds the chapter's answers, the course's own version stands in for
    every unfinished TODO and says so, and only test cells fail; in the chapter being
    learned, a cell that needs an unfinished TODO may stop with one line."""
    _, ran, *_ = wheel_env
    notebook = nbformat.read(ran / f"exercise-{chapter.source.name}", as_version=4)
    assert errors(notebook), "an unfilled exercise should fail its tests"
    assert _fails_only_where_a_learner_expects(notebook) == {}
    if chapter is not LEARNED:
        assert all(name.startswith("test_") for name in errors(notebook)), errors(notebook)
        notes = [o.get("text", "") for c in notebook.cells for o in c.get("outputs", [])
                 if o.get("name") == "stdout"]
        assert any("the course's own version" in text for text in notes)


def test_an_edition_with_nothing_revealed_runs_its_exercises(wheel_env):
    *_, bare, ran = wheel_env
    assert bare.included, "an edition with nothing revealed still holds chapters"
    for chapter in bare.included:
        notebook = nbformat.read(ran / f"{chapter.name}.ipynb", as_version=4)
        assert _fails_only_where_a_learner_expects(notebook) == {}, chapter.name
        stopped = [e for e in errors(notebook).values() if e.startswith("NotReady:")]
        assert all("to see this" in e for e in stopped)


def _installed_version(python: Path) -> str:
    """The course's version installed in ``python``'s environment (read outside the checkout,
    whose own metadata would answer first)."""
    return subprocess.run([str(python), "-c", "import importlib.metadata as m; "
                           "print(m.version('paged-kv-course'))"], cwd=python.parents[2],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_a_reveal_reaches_a_learner_who_installed_the_edition_before_it(wheel_env, tmp_path):
    """The class's edition is published with chapter 1 revealed and installed; then published
    again in the same folder with chapters 1-4: chapter 5's notebook of the new edition (whose
    checks and chapter 3's answers the first one lacked) upgrades the course in its setup cell
    and runs clean. Last in this file: it changes the environment, and puts it back."""
    python, ran, *_ = wheel_env
    before = _installed_version(python)
    root, chapter = tmp_path / "class", CHAPTERS[4]
    first = build(root, {1})
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(first.wheel)],
                   check=True, capture_output=True, text=True)
    assert _installed_version(python) == first.version
    second = build(root, {1, 2, 3, 4})
    assert chapter.name in [c.name for c in second.included]
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    shutil.copyfile(second.wheel, notebooks / second.wheel.name)
    released = without_hidden_tests(chapter.source, notebooks / chapter.source.name)
    write_setup_cell(released, released, "", edition=second.version)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TRITON_INTERPRET", "NBGRADER_EXECUTION")}
    try:
        _run(python, [released], tmp_path / "ran", env)
        notebook = nbformat.read(tmp_path / "ran" / released.name, as_version=4)
        first_cell = next(c for c in notebook.cells if c.cell_type == "code")
        printed = "".join(o.get("text", "") for o in first_cell.outputs)
        assert f"Installing the course from {second.wheel.name}" in printed, printed
        assert errors(notebook) == {}
        assert _installed_version(python) == second.version
    finally:  # the edition the other tests of this file ran with
        edition_wheel = next(ran.parent.glob("class/dist/*.whl"))
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps",
                        "--force-reinstall", str(edition_wheel)], check=True,
                       capture_output=True, text=True)
    assert _installed_version(python) == before
