"""The learner edition: no answer of a chapter not revealed is in it, and its visible tests
still catch every mutant with the hint it gets in the open course.

The notebooks of an edition are run in a fresh environment in tests/test_wheel.py.
"""

from __future__ import annotations

import ast
import importlib
import re
import zipfile

import nbformat
import pytest
from conftest import CHAPTERS
from subjects import alternatives

import autograder.private as private
from autograder.edition import build, recordings
from autograder.render import (
    BEGIN,
    END,
    chapter_answers,
    library_modules,
    load,
    module_file,
    span,
    subjects,
)
from autograder.table import PARTS


def _normalised(text: str) -> str:
    """Code without comments, blank lines or indentation: what a leak would still contain."""
    lines = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    return "\n".join(line for line in lines if line)


def _answer_regions() -> dict[str, str]:
    """qualname -> the normalised code between each answer's markers."""
    found = {}
    for module in library_modules():
        text = module_file(module).read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef):
                start, end = span(lines, node)
                body = "\n".join(lines[start:end])
                for region in re.findall(re.escape(BEGIN) + r"\n(.*?)\n\s*" + re.escape(END),
                                         body, re.S):
                    found[f"{module}.{node.name}"] = _normalised(region)
    return found


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """An edition with nothing revealed, and its wheel."""
    return build(tmp_path_factory.mktemp("edition") / "class", set())


def test_an_edition_with_nothing_revealed_holds_no_answer(bare):
    texts = {str(p.relative_to(bare.root)): p.read_text(encoding="utf-8", errors="replace")
             for p in bare.root.rglob("*") if p.is_file() and p.suffix in (".py", ".ipynb")}
    with zipfile.ZipFile(bare.wheel) as wheel:
        texts |= {f"wheel:{name}": wheel.read(name).decode("utf-8", "replace")
                  for name in wheel.namelist() if name.endswith(".py")}
    corpus = {name: _normalised(text) for name, text in texts.items()}
    regions = _answer_regions()
    assert len(regions) >= 40
    leaks = [(answer, name) for answer, region in regions.items()
             for name, text in corpus.items() if region in text]
    assert leaks == []
    assert not [name for name in texts if "hidden" in name.split("/")
                or name.startswith(("solutions", "tests"))]
    private_code = [_normalised(ast.unparse(node))
                    for path in sorted(module_file("autograder.hidden").parent.glob("*.py"))
                    for node in ast.parse(path.read_text()).body
                    if isinstance(node, ast.FunctionDef | ast.ClassDef)]
    assert not [code for code in private_code for text in corpus.values() if code in text]


def test_chapters_whose_notebooks_need_unrevealed_answers_are_left_out(bare):
    assert sorted(bare.refused) == sorted(n for n, p in PARTS.items() if p.needs)
    shipped = sorted(p.stem for p in (bare.root / "exercises").glob("*.ipynb"))
    assert shipped == sorted(c.name for c in bare.included)


def _visible_messages(chapter) -> dict[tuple[str, str], str]:
    """Every mutant's first visible failure, by (TODO, mutant)."""
    checks = importlib.import_module(PARTS[chapter.name].checks)
    mutants = importlib.import_module(PARTS[chapter.name].mutants).MUTANTS
    found = {}
    for name, wrong in mutants.items():
        for mutant, _ in wrong:
            try:
                getattr(checks, f"check_{name}")(mutant)
            except AssertionError as failure:
                found[(name, mutant.__name__)] = str(failure)
    return found


def test_visible_checks_replay_every_mutants_hint_without_the_hidden_checks(tmp_path,
                                                                           monkeypatch):
    live = {chapter.name: _visible_messages(chapter) for chapter in CHAPTERS}
    recordings(tmp_path)
    monkeypatch.setattr(private, "RECORDED", tmp_path)
    private._replay.cache_clear()
    try:
        for chapter in CHAPTERS:
            assert _visible_messages(chapter) == live[chapter.name], chapter.name
            checks = importlib.import_module(PARTS[chapter.name].checks)
            for grade_id, target in subjects(nbformat.read(chapter.source, 4)).items():
                getattr(checks, f"check_{grade_id}")(load(target))  # the answers still pass
    finally:
        private._replay.cache_clear()


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.name)
def test_visible_checks_never_run_the_chapters_own_answers(chapter, monkeypatch):
    """In the learner edition the chapter's answers are stubs: its visible checks, given a
    differently written correct solution, must pass without ever calling them."""
    def refuse(qualname):
        def refused(*args, **kwargs):
            raise AssertionError(f"a visible check ran the course's own {qualname}")
        return refused

    # imported before the answers are refused: mutants build on them, and the hidden module
    # (an edition replays its answers from recordings instead) computes with them
    subjects = alternatives(chapter)
    importlib.import_module(PARTS[chapter.name].hidden)
    for module_name, qualname in chapter_answers(chapter.name):
        owner_name, _, name = qualname.rpartition(".")
        module = importlib.import_module(module_name)
        owner = getattr(module, owner_name) if owner_name else module
        if not hasattr(vars(owner)[name], "__getitem__"):  # a Triton kernel is launched
            monkeypatch.setattr(owner, name, refuse(qualname))
    checks = importlib.import_module(PARTS[chapter.name].checks)
    for grade_id, found in subjects.items():
        for subject in found:
            getattr(checks, f"check_{grade_id}")(subject)
