"""Every rule a chapter states is checked: each row of a chapter's rule table
(``tests/mutants/chNN.py``'s ``RULES``) quotes the notebook and names the mutants that break
that rule alone, which ``tests/test_checks.py`` runs against the TODO's checks."""

from __future__ import annotations

import importlib
import re

import nbformat
import pytest
from conftest import CHAPTERS

from autograder.table import PARTS


def _words(text: str) -> str:
    """``text`` as a reader reads it: markdown's emphasis and code marks gone, one space
    between words."""
    return re.sub(r"\s+", " ", re.sub(r"[*`]", "", text)).strip()


def _rules_and_mutants(chapter):
    module = importlib.import_module(PARTS[chapter.name].mutants)
    return module.RULES, module.MUTANTS


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.name)
def test_every_rule_is_quoted_from_the_notebook_with_a_mutant_that_breaks_it(chapter):
    rules, mutants = _rules_and_mutants(chapter)
    notebook = _words("\n".join(c.source for c in
                                nbformat.read(chapter.source, as_version=4).cells))
    for rule in rules:
        assert _words(rule.quote) in notebook, f"not in the notebook: {rule.quote!r}"
        names = {getattr(m, "__name__", "") for m, _ in mutants.get(rule.todo, [])}
        assert rule.mutants, f"no mutant breaks {rule.quote!r}"
        assert set(rule.mutants) <= names, (rule, sorted(names))


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.name)
def test_every_todo_has_its_rules_and_every_mutant_a_rule(chapter):
    rules, mutants = _rules_and_mutants(chapter)
    assert {rule.todo for rule in rules} == set(mutants)
    ruled = {(rule.todo, name) for rule in rules for name in rule.mutants}
    unruled = [(todo, m.__name__) for todo, pairs in mutants.items() for m, _ in pairs
               if (todo, m.__name__) not in ruled]
    assert not unruled, f"mutants that break no stated rule: {unruled}"
