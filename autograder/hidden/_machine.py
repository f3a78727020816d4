"""The base of the stateful hidden checks that drive a chapter's harness (chapters 3 and 4).

Kept apart from ``autograder.checks._harness``, which visible checks import: hypothesis is
imported only where a check runs it.
"""

from __future__ import annotations

from hypothesis.stateful import RuleBasedStateMachine, invariant

from autograder.checks._harness import Harness


class HarnessMachine(RuleBasedStateMachine):
    """Random operations on a learner's class through a harness ``h``, which a subclass's
    ``initialize`` rule makes; after every step, the harness verifies what the class holds.
    ``next_id`` is the id the next new sequence gets."""

    h: Harness
    next_id = 0

    @invariant()
    def books_balance(self) -> None:
        if hasattr(self, "h"):
            self.h.verify()
