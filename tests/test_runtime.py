"""course.setup() and `python -m course doctor`, each in a fresh interpreter."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from course.runtime import detect

NO_GPU = detect().mode == "interpreter"


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | env
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=environment, timeout=300)


def test_a_notebooks_first_chart_loads_no_format_checker():
    """Drawing a chart, plotly's renderer imports nbformat and so jsonschema, which loads a
    checker for each string format whose package is installed (rfc3987_syntax's URI grammar
    takes about 1.5 s); after setup() it loads none."""
    done = _python("import sys, course\ncourse.setup(quiet=True)\n"
                   "import plotly.graph_objects as go\n"
                   "go.Figure(go.Bar(x=[1], y=[2]))._repr_mimebundle_()\n"
                   "from course.runtime import _FORMAT_CHECKERS\n"
                   "print('jsonschema' in sys.modules,"
                   " *(sys.modules.get(name, 0) for name in _FORMAT_CHECKERS))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"] + ["None"] * 6


@pytest.mark.skipif(not NO_GPU, reason="this machine has a CUDA GPU: interpreter mode not chosen")
def test_setup_without_a_gpu_switches_on_the_interpreter_and_says_so_in_one_line():
    done = _python("import os, course; course.setup(); print(os.environ['TRITON_INTERPRET'])")
    assert done.returncode == 0, done.stderr
    said, value = done.stdout.strip().splitlines()
    assert "Triton CPU interpreter mode" in said
    assert value == "1"


@pytest.mark.skipif(not NO_GPU, reason="this machine has a CUDA GPU: interpreter mode not chosen")
@pytest.mark.parametrize("interpreter_set_before", [False, True], ids=["unset", "set"])
def test_a_kernel_module_imported_before_setup_is_named_unless_the_interpreter_was_on(
        interpreter_set_before):
    """Imported without the interpreter, its kernels would compile for a GPU: restart. Imported
    with it already on (an earlier setup, the grader's warm kernels), they run on it."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env |= {"TRITON_INTERPRET": "1"} if interpreter_set_before else {}
    done = subprocess.run([sys.executable, "-c", "import kernels.paged_attention, course\n"
                           "course.setup(quiet=True)"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    named = "kernels.paged_attention" in done.stdout and "before course.setup()" in done.stdout
    assert named is not interpreter_set_before, done.stdout


@pytest.mark.skipif(not NO_GPU, reason="this machine has a CUDA GPU: interpreter mode not chosen")
def test_a_kernel_defined_after_setup_runs_on_cpu_tensors():
    done = _python(
        "import course; course.setup(quiet=True)\n"
        "import torch, triton, triton.language as tl\n"
        "@triton.jit\n"
        "def double(x, n, BLOCK: tl.constexpr):\n"
        "    i = tl.arange(0, BLOCK)\n"
        "    tl.store(x + i, tl.load(x + i, mask=i < n) * 2, mask=i < n)\n"
        "x = torch.arange(5.0)\n"
        "double[(1,)](x, 5, BLOCK=8)\n"
        "print(x.tolist())\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[0.0, 2.0, 4.0, 6.0, 8.0]"


@pytest.mark.gpu
@pytest.mark.skipif(NO_GPU, reason="needs a CUDA GPU")
def test_setup_with_a_gpu_names_it():
    done = _python("import course; course.setup()")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("GPU mode: Triton kernels compile for ")


@pytest.fixture(scope="module")
def doctor() -> subprocess.CompletedProcess:
    """``python -m course doctor`` in this environment, run once for the tests that read it."""
    return subprocess.run([sys.executable, "-m", "course", "doctor"], capture_output=True,
                          text=True, timeout=600)


def test_doctor_reports_every_component_and_the_mode(doctor):
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    lines = doctor.stdout.splitlines()
    for name in ["python", "torch", "triton", "numpy", "nbgrader", "jupyterlab", "ipywidgets",
                 "plotly", "mode", "grading"]:
        assert any(line.split()[:2] == ["ok", name] for line in lines), (name, doctor.stdout)
    assert lines[-1] == "ready for the course"


def test_doctor_says_whether_grading_will_be_sandboxed(doctor):
    from autograder.host.sandbox import probe

    said = [line for line in doctor.stdout.splitlines() if line.split()[1:2] == ["sandbox"]]
    assert len(said) == 1, doctor.stdout
    # ok where bwrap makes the sandbox; elsewhere a note, not a problem: learners need none
    assert said[0].split()[0] == ("ok" if probe() is None else "--")
    bare = dict(os.environ, PATH=str(Path(sys.executable).parent))  # no bwrap on this PATH
    done = subprocess.run([sys.executable, "-m", "course", "doctor"], capture_output=True,
                          text=True, timeout=600, env=bare)
    assert done.returncode == 0, done.stdout
    assert "--   sandbox" in done.stdout and "apt-get install bubblewrap" in done.stdout


def test_doctor_names_a_fix_for_a_missing_package(monkeypatch, capsys):
    from course import doctor

    real = doctor._version
    monkeypatch.setattr(doctor, "_version", lambda d: None if d == "plotly" else real(d))
    monkeypatch.setattr(doctor, "_triton_interpreter_runs", lambda: None)
    assert doctor.main() == 1
    out = capsys.readouterr().out
    assert "BAD  plotly" in out and "fix: pip install" in out and "1 problem(s) found" in out


def test_course_module_without_a_command_prints_usage():
    done = subprocess.run([sys.executable, "-m", "course"], capture_output=True, text=True)
    assert done.returncode == 2 and "usage: python -m course doctor" in done.stderr


def test_doctor_in_a_learner_edition_asks_only_for_what_the_edition_needs(tmp_path, monkeypatch,
                                                                          capsys):
    """No grader, no sandbox, JupyterLab only as a note (Colab brings its own front end), and
    fixes that exist in an edition: installing its wheel, never `make setup` or the grader."""
    from course import doctor

    held = tmp_path / "edition.json"
    held.write_text('{"chapters": ["01_kv_cache_sizing", "02_block_tables"], "revealed": [1]}')
    monkeypatch.setattr(doctor, "EDITION", held)
    real = doctor._version
    monkeypatch.setattr(doctor, "_version",
                        lambda d: None if d in ("nbgrader", "jupyterlab") else real(d))
    monkeypatch.setattr(doctor, "_triton_interpreter_runs", lambda: None)
    assert doctor.main() == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "ready for the course", out
    assert "ok   edition" in out and "chapters 01, 02" in out
    assert "--   jupyterlab" in out and "nbgrader" not in out and "sandbox" not in out
    assert not re.search(r"make setup|\[dev\]|autograder", out), out
    monkeypatch.setattr(doctor, "_version", lambda d: None if d == "plotly" else real(d))
    assert doctor.main() == 1
    out = capsys.readouterr().out
    assert "BAD  plotly" in out and "fix: pip install the edition's wheel" in out
