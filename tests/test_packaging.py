"""The project's own files install and run everything: pyproject, environment.yml, Makefile, CI."""

from __future__ import annotations

import re

import tomllib
import yaml
from packaging.requirements import Requirement


def _normalised(requirements: list[str]) -> set[str]:
    return {str(Requirement(r)).lower() for r in requirements}


def test_environment_yml_lists_the_same_requirements_as_pyproject(repo):
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    declared = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        declared += extra
    environment = yaml.safe_load((repo / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in environment["dependencies"] if isinstance(d, dict))
    listed = [r for r in pip_section if not r.startswith("-e")]
    assert _normalised(listed) == _normalised(declared)
    assert "-e ." in pip_section  # and the course itself


def test_readme_gives_the_two_commands_and_ci_runs_the_test_one(repo):
    readme = (repo / "README.md").read_text()
    commands = re.findall(r"^\s*(make \w+)\s*$", readme, flags=re.M)
    assert commands[:2] == ["make lab", "make test"]
    makefile = (repo / "Makefile").read_text()
    assert re.search(r"^lab: setup$", makefile, flags=re.M)
    assert re.search(r"^test: setup$", makefile, flags=re.M)
    ci = (repo / ".ci" / "run").read_text()
    assert re.search(r"^make test\b", ci, flags=re.M)


def test_setup_installs_cpu_torch_where_there_is_no_gpu(repo):
    makefile = (repo / "Makefile").read_text()
    no_gpu_branch = makefile.split("nvidia-smi", 1)[1]
    assert "$(TORCH_CPU)" in no_gpu_branch
    assert re.search(r"^TORCH_CPU \?= torch==\d", makefile, flags=re.M)


def test_the_readme_shows_every_picture_the_browser_tests_take(repo):
    readme = (repo / "README.md").read_text()
    shown = set(re.findall(r"\]\((docs/images/[^)]+\.png)\)", readme))
    taken = {str(p.relative_to(repo)) for p in (repo / "docs" / "images").glob("*.png")}
    assert shown == taken
    browser_tests = (repo / "tests" / "test_browser.py").read_text()
    assert all(f'"{p.split("/")[-1][:-4]}"' in browser_tests for p in taken)
