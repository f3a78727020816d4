"""What a chapter's checks are given when the differently written correct solution in
``tests/alternatives/chNN.py`` is checked: its function of each TODO's name, or (for checks of
a class built up in steps) its class."""

from __future__ import annotations

import importlib

from autograder.table import PARTS


def alternative_subjects(checks, module, name: str) -> list:
    """The subjects of TODO ``name``: the named function, or the class (an alternatives module
    may offer several classes)."""
    subject = getattr(checks, "SUBJECT", None)
    if subject is None or name not in getattr(checks, "SUBJECT_CHECKS", {name}):
        return [getattr(module, name)]
    return list(getattr(module, "ALTERNATIVES", [getattr(module, subject)]))


def alternatives(chapter) -> dict[str, list]:
    """TODO name -> the alternative's subjects, for every TODO that has mutants."""
    parts = PARTS[chapter.name]
    checks = importlib.import_module(parts.checks)
    module = importlib.import_module(parts.alternatives)
    names = importlib.import_module(parts.mutants).MUTANTS
    return {name: alternative_subjects(checks, module, name) for name in names}
