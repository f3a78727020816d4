"""A hint in the learner's language: the checks write English; a notebook set up in another
language (``course.setup(language=...)``) reads each hint through the grader's catalogues
(``autograder/locale/``; see ``course.language``)."""

from __future__ import annotations

from pathlib import Path

from course.language import catalogue, current

_GRADER = Path(__file__).resolve().parent


def in_language(text: str, language: str | None = None, chapter: str | None = None) -> str:
    """``text`` (a hint, a verdict, a report line) in ``language`` (else the chosen one).
    A hint of chapter ``chapter`` (``"07"``) is read with the grader's catalogue and those of
    that chapter and the ones before it, which its checks build on: a later chapter's entries
    could only match its text in the wrong places."""
    domains = ("grader", *(f"ch{n:02d}" for n in range(1, int(chapter) + 1))) if chapter else ()
    book = catalogue(_GRADER, language or current(), domains)
    return text if book is None else book.translate(text)
