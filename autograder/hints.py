"""A hint in the learner's language: the checks write English; a notebook set up in another
language (``course.setup(language=...)``) reads each hint through the grader's catalogues
(``autograder/locale/``; see ``course.language``)."""

from __future__ import annotations

from pathlib import Path

from course.language import catalogue, current

_GRADER = Path(__file__).resolve().parent


def in_language(text: str, language: str | None = None) -> str:
    """``text`` (a hint, a verdict, a report line) in ``language`` (else the chosen one)."""
    book = catalogue(_GRADER, language or current())
    return text if book is None else book.translate(text)
