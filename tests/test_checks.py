"""Every chapter's checks, run directly (no notebook): right answers pass, wrong ones get hints.

For chapter NN: the library reference (``reference`` in the notebook's metadata) and
``tests/alternatives/chNN.py`` must pass every check; every mutant in
``tests/mutants/chNN.py`` must fail the thorough check, and the first check it fails (visible,
else hidden) must name the idea it missed.
"""

from __future__ import annotations

import importlib

import nbformat
import pytest
from conftest import CHAPTERS

LEVELS = {"visible": "", "hidden": "_thoroughly"}


def _modules(chapter):
    number = chapter.number
    checks = importlib.import_module(f"autograder.checks.ch{number}")
    reference = importlib.import_module(
        nbformat.read(chapter.source, as_version=4).metadata["course"]["reference"])
    alternative = importlib.import_module(f"alternatives.ch{number}")
    mutants = importlib.import_module(f"mutants.ch{number}").MUTANTS
    return checks, reference, alternative, mutants


CORRECT = [
    pytest.param(chapter, kind, name, level, id=f"ch{chapter.number}-{kind}-{name}-{level}")
    for chapter in CHAPTERS
    for name in _modules(chapter)[3]
    for kind in ("reference", "alternative")
    for level in LEVELS
]


def _subjects(checks, module, name) -> list:
    """What a check is called with: the named function, or (for checks of a class, such as
    chapter 3's BlockManager) the class; an alternatives module may offer several classes."""
    subject = getattr(checks, "SUBJECT", None)
    if subject is None or name not in getattr(checks, "SUBJECT_CHECKS", {name}):
        return [getattr(module, name)]
    return list(getattr(module, "ALTERNATIVES", [getattr(module, subject)]))


@pytest.mark.parametrize(("chapter", "kind", "name", "level"), CORRECT)
def test_correct_solutions_pass(chapter, kind, name, level):
    checks, reference, alternative, _ = _modules(chapter)
    module = reference if kind == "reference" else alternative
    for subject in _subjects(checks, module, name):
        getattr(checks, f"check_{name}{LEVELS[level]}")(subject)


WRONG = [
    pytest.param(chapter, name, mutant, hint,
                 id=f"ch{chapter.number}-{name}-{mutant.__name__.strip('_')}")
    for chapter in CHAPTERS
    for name, mutants in _modules(chapter)[3].items()
    for mutant, hint in mutants
]


@pytest.mark.parametrize(("chapter", "name", "mutant", "hint"), WRONG)
def test_wrong_solutions_fail_with_the_right_hint(chapter, name, mutant, hint):
    checks = _modules(chapter)[0]
    messages = {}
    for level, suffix in LEVELS.items():
        try:
            getattr(checks, f"check_{name}{suffix}")(mutant)
        except AssertionError as failure:
            messages[level] = str(failure)
    assert "hidden" in messages, "the hidden tests let a wrong solution through"
    first = messages.get("visible", messages["hidden"])
    assert hint in first
    # the hint names what broke: the call, or the operations on the class
    assert first.startswith("After ") if isinstance(mutant, type) else "(" in first


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.name)
def test_every_check_is_exercised_by_mutants(chapter):
    checks, _, _, mutants = _modules(chapter)
    defined = {n for n in dir(checks) if n.startswith("check_")}
    assert defined == {f"check_{name}{suffix}" for name in mutants for suffix in LEVELS.values()}
