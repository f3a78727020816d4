"""Every chapter's checks, run directly (no notebook): right answers pass, wrong ones get hints.

For chapter NN: ``tests/alternatives/chNN.py`` must pass every check; every mutant in
``tests/mutants/chNN.py`` must fail the thorough check, and the first check it fails (visible,
else hidden) must name the idea it missed. The course's own answers pass every check where
their notebooks are graded, in both languages (tests/test_grading.py, test_zh_grading.py): a
solution gets full marks only if each of its TODOs passes its visible and its hidden test. So
do the alternative functions, graded there as one notebook: here they meet the visible
checks only.
"""

from __future__ import annotations

import importlib
import re
from contextlib import nullcontext

import pytest
from conftest import CHAPTERS, REPO
from subjects import alternative_subjects

from autograder.checks._helpers import verdict_only
from autograder.hints import in_language
from autograder.table import PARTS
from course.language import catalogue

LEVELS = {"visible": "", "hidden": "_thoroughly"}


def check(chapter, name: str, level: str):
    """The visible check of a TODO, or its thorough check in the chapter's hidden module."""
    parts = PARTS[chapter.name]
    module = importlib.import_module(parts.hidden if level == "hidden" else parts.checks)
    return getattr(module, f"check_{name}{LEVELS[level]}")


def _modules(chapter):
    parts = PARTS[chapter.name]
    checks = importlib.import_module(parts.checks)
    alternative = importlib.import_module(parts.alternatives)
    mutants = importlib.import_module(parts.mutants).MUTANTS
    return checks, alternative, mutants


def _graded_in_a_notebook(chapter) -> bool:
    """Whether tests/test_grading.py grades this chapter's alternative functions, each as the
    answer of its TODO, in one notebook that must get full marks: their hidden checks run
    there, in full. A chapter of a class grades only its last alternative class there."""
    return not hasattr(_modules(chapter)[0], "SUBJECT")


CORRECT = [
    pytest.param(chapter, name, level, id=f"ch{chapter.number}-alternative-{name}-{level}")
    for chapter in CHAPTERS
    for name in _modules(chapter)[2]
    for level in LEVELS
    if level == "visible" or not _graded_in_a_notebook(chapter)
]


@pytest.mark.parametrize(("chapter", "name", "level"), CORRECT)
def test_alternative_solutions_pass(chapter, name, level):
    checks, alternative, _ = _modules(chapter)
    for subject in alternative_subjects(checks, alternative, name):
        check(chapter, name, level)(subject)


WRONG = [
    pytest.param(chapter, name, mutant, hint,
                 id=f"ch{chapter.number}-{name}-{mutant.__name__.strip('_')}")
    for chapter in CHAPTERS
    for name, mutants in _modules(chapter)[2].items()
    for mutant, hint in mutants
]


@pytest.mark.parametrize(("chapter", "name", "mutant", "hint"), WRONG)
def test_wrong_solutions_fail_with_the_right_hint(chapter, name, mutant, hint):
    messages = {}
    for level in LEVELS:
        # the hidden check's words count only where the visible check let the mutant through
        words = nullcontext() if level == "visible" or not messages else verdict_only()
        try:
            with words:
                check(chapter, name, level)(mutant)
        except AssertionError as failure:
            messages[level] = str(failure)
    assert "hidden" in messages, "the hidden tests let a wrong solution through"
    first = messages.get("visible", messages["hidden"])
    assert hint in first
    # the hint names what broke: the call, or the operations on the class
    assert first.startswith("After ") if isinstance(mutant, type) else "(" in first
    # and a learner of the Chinese edition reads it in Chinese
    chinese = in_language(first, "zh_CN", chapter.number)
    assert re.search(r"[\u4e00-\u9fff]", chinese), chinese
    assert not left_in_english(chinese), (left_in_english(chinese), chinese)


def left_in_english(text: str) -> list[str]:
    """The English of the catalogues' sentences (four words or more) still in ``text``: a
    hint's piece its Chinese edition does not translate."""
    book = catalogue(REPO / "autograder", "zh_CN")
    pieces = [english for english, chinese in book.sentences.items() if english != chinese]
    pieces += [part for template in book.templates for part in template.parts[0::2]
               if part not in template.translation]
    return [piece for piece in pieces if len(piece.split()) >= 4 and piece in text]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.name)
def test_every_check_is_exercised_by_mutants(chapter):
    mutants = _modules(chapter)[2]
    for level, suffix in LEVELS.items():
        module = importlib.import_module(check(chapter, next(iter(mutants)), level).__module__)
        # the chapter's own checks: its module's, and those of its modules split by concern
        # (checks/ch07_wrapper.py), not another chapter's
        own = (module.__name__, f"{module.__name__}_")
        defined = {n for n, v in vars(module).items() if n.startswith("check_")
                   and str(getattr(v, "__module__", "")).startswith(own)
                   and n.endswith(suffix) and (suffix or not n.endswith("_thoroughly"))}
        assert defined == {f"check_{name}{suffix}" for name in mutants}
