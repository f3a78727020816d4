"""The harness that chapters 3 to 5 drive a learner's class through, one operation at a time.

A chapter's harness (a subclass of ``Harness``) holds the learner's object and what the
contract expects of it; this module gives what every such harness shares: the operations so
far, written as code (``log``), a failure's hint ("After <operations>: <problem> <idea>"),
the blame rule (when an earlier TODO fails its own test, a failure says to fix that TODO
first instead of giving this check's idea), the hint for a method still a stub, and the
learner's calls with their exceptions turned into hints.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from autograder.checks._helpers import not_written


class Harness:
    """The operations run on a learner's object so far, and how a failure of one reads.

    ``blame``: an earlier TODO whose own visible test fails (None when none does). A hint
    lists the latest ``shown`` operations, after "... " when there were more.
    """

    shown = 12

    def __init__(self, blame: str | None = None) -> None:
        self.log: list[str] = []
        self.blame = blame

    def operations(self) -> str:
        """The operations a hint lists."""
        more = "... " if len(self.log) > self.shown else ""
        return more + "; ".join(self.log[-self.shown:])

    def fail(self, problem: str, idea: str = "") -> NoReturn:
        """Raise the hint: the operations so far, ``problem``, and ``idea`` (the idea the
        check is about; under blame, which TODO to fix first)."""
        if self.blame:  # the likely cause is an earlier TODO: say that, not this one's idea
            idea = blamed(self.blame)
        raise AssertionError(f"After {self.operations()}: {problem}" + (f" {idea}" if idea else ""))

    def call(self, text: str, action: Callable[[], Any],
             allowed: tuple[type[BaseException], ...] = ()) -> Any:
        """Log ``text`` (the learner's call, as code) and return ``action()``, which makes it.

        A stub's NotImplementedError becomes the hint that the method ``text`` calls is not
        written yet; an exception in ``allowed`` passes through as it is; any other fails
        the check, naming the call and what it raised.
        """
        self.log.append(text)
        try:
            return action()
        except NotImplementedError:
            raise unwritten(text) from None
        except allowed:
            raise
        except Exception as exc:
            self.fail(f"{text} raised {type(exc).__name__}: {exc}")


def blamed(todo: str) -> str:
    """What a failure says instead of its idea when the earlier TODO ``todo`` fails its own
    test."""
    return f"{todo} fails its own test, and this test relies on it: fix {todo} first."


def unwritten(text: str) -> AssertionError:
    """The not-written hint for the method that the logged call ``text`` runs: ``allocate``
    for ``bm.allocate(0, 4)``, the class for ``bm = BlockManager(8, 4)``."""
    return AssertionError(not_written(re.split(r"[ .]", text.split("(")[0])[-1]))


def blame_where_due(cases: Callable[[type, str | None], None], cls: type,
                    probes: Mapping[str, Callable[[type], None]], course: type,
                    *earlier: str, methods: Mapping[str, str] | None = None) -> None:
    """``cases(cls, None)``: a check's scenarios. Where they fail, the note that an earlier
    TODO is at fault (``blamed``) replaces the check's idea only where it is due: that TODO
    fails its own visible cases (``probes``) *and* these scenarios pass with ``course``'s
    version of it lent (``methods`` names the method a TODO writes, where it differs). Else
    the learner reads this check's own failure and idea.

    Where the course's version cannot run (an edition without that chapter's answers), no
    blame is given: the check's own failure is never wrong."""
    from autograder.borrowing import course_version

    try:
        cases(cls, None)
        return
    except AssertionError as failure:
        own = failure
    for todo in earlier:
        if not _fails(probes[todo], cls):
            continue
        method = (methods or {}).get(todo, todo)
        lent = type(cls.__name__, (cls,), {
            method: course_version(inspect.getattr_static(course, method))})
        if not _fails(lambda subject: cases(subject, None), lent):
            cases(cls, todo)  # the same failure again, now saying which TODO to fix first
    raise own


def _fails(check: Callable[[type], None], cls: type) -> bool:
    try:
        check(cls)
    except Exception:  # a failure, or a stub's NotImplementedError: not a pass either way
        return True
    return False
