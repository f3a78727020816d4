"""Wrong implementations, each with the hint its check must give: every check must catch one.

Each chapter's module also holds ``RULES``: every rule the chapter's notebook states about a
TODO, quoted as the notebook words it, with the mutants that break that rule alone (and so
must fail that TODO's checks: ``tests/test_checks.py`` runs every mutant).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    """A rule the notebook states (``quote``, words of the English solution notebook), the
    TODO it binds, and the names of the mutants in ``MUTANTS[todo]`` that break it alone."""

    quote: str
    todo: str
    mutants: tuple[str, ...]
