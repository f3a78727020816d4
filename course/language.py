"""The language the course speaks to a learner, and its translations (gettext catalogues).

English is the source: every sentence is written in English in the code or the notebook, and
a translation lives in a gettext catalogue (``<package>/locale/<language>/LC_MESSAGES/*.po``),
keyed by that English sentence. Change the sentence and its translation is out of date: the
suite says which (``tests/test_translations.py``).

A learner chooses the language once: ``course.setup(language="zh_CN")`` (what the Chinese
notebooks' set-up cell does), or ``KV_COURSE_LANGUAGE=zh_CN`` in the environment.

What is translated is text made at run time (a hint, a chart's title), so a catalogue entry may
be a template: an f-string's source, ``{...}`` holes where values go (flagged
``python-brace-format``). ``Catalogue.translate`` finds the templates a text was made from,
translates the values in the holes too (a hint often holds another hint), and keeps what no
entry covers (code, numbers) as it is::

    f"seq_len({seq}) is {got}, expected {length}."     the template, from the source
    "seq_len(2) is 3, expected 4."                      the text a check raised
    "seq_len(2) 是 3，应为 4。"                          its translation: holes filled back in
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ENGLISH = "en"
LANGUAGES = (ENGLISH, "zh_CN")
ENVIRONMENT = "KV_COURSE_LANGUAGE"

_CHOSEN: dict[str, str] = {}  # set by ``choose`` (mutated, never rebound)


def choose(language: str | None) -> str:
    """Make ``language`` (else ``KV_COURSE_LANGUAGE``, else English) this process's language;
    return it. An unknown language is refused by name."""
    language = language or os.environ.get(ENVIRONMENT) or ENGLISH
    if language not in LANGUAGES:
        raise ValueError(f"language {language!r}: the course speaks {', '.join(LANGUAGES)}")
    _CHOSEN["language"] = language
    os.environ[ENVIRONMENT] = language  # processes this one starts speak it too
    return language


def current() -> str:
    """The language chosen for this process (English until one is chosen)."""
    return _CHOSEN.get("language") or os.environ.get(ENVIRONMENT) or ENGLISH


def locale_folder(package: Path, language: str) -> Path:
    return package / "locale" / language / "LC_MESSAGES"


@dataclass(frozen=True)
class _Template:
    """One catalogue entry: its English text cut into literal parts and holes."""

    english: str
    translation: str
    parts: tuple[str, ...]  # literal, hole, literal, hole, ..., literal (holes at odd places)

    @property
    def holes(self) -> tuple[str, ...]:
        return self.parts[1::2]

    @property
    def literal_length(self) -> int:
        return sum(len(p) for p in self.parts[0::2])

    @property
    def pattern(self) -> re.Pattern:
        return _pattern(self.parts)

    def fill(self, values: dict[str, str]) -> str:
        cut = split_template(self.translation)
        return "".join(values.get(p, "{" + p + "}") if i % 2 else p for i, p in enumerate(cut))


def split_template(text: str) -> tuple[str, ...]:
    """``"a {x} b {y!r:>4}"`` -> ``("a ", "x", " b ", "y!r:>4", "")``: literal parts at even
    places, the holes' source at odd ones (``{{`` and ``}}`` are literal braces)."""
    parts, literal, i = [], [], 0
    while i < len(text):
        pair = text[i:i + 2]
        if pair in ("{{", "}}"):
            literal.append(pair[0])
            i += 2
        elif text[i] == "{":
            depth, j = 1, i + 1
            while j < len(text) and depth:
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                j += 1
            parts += ["".join(literal), text[i + 1:j - 1]]
            literal, i = [], j
        else:
            literal.append(text[i])
            i += 1
    return (*parts, "".join(literal))


_PLAIN = r"[^()\[\]{}]"


def _group(depth: int) -> str:
    """A bracketed group whose brackets balance, nested up to ``depth`` deep (``re`` has no
    recursion)."""
    inner = _PLAIN
    for _ in range(depth):
        inner = f"{_PLAIN}|\\((?:{inner})*\\)|\\[(?:{inner})*\\]|\\{{(?:{inner})*\\}}"
    return f"\\((?:{inner})*\\)|\\[(?:{inner})*\\]|\\{{(?:{inner})*\\}}"


_GROUP = _group(3)


def _hole(following: str) -> str:
    """A hole holds a value: its brackets balance, and outside its brackets it never holds
    the literal text that follows the hole. So "0 (10 tokens), 1 (4 tokens)" is two matches of
    "{id} ({n} tokens)", not one whose first hole is "0 (10 tokens), 1"."""
    stop = f"(?!{re.escape(following)})" if following else ""
    return f"((?:{stop}{_PLAIN}|{_GROUP})*?)"


@cache
def _pattern(parts: tuple[str, ...]) -> re.Pattern:
    return re.compile("".join(_hole(parts[i + 1]) if i % 2 else re.escape(p)
                              for i, p in enumerate(parts)), re.DOTALL)


class Catalogue:
    """The translations of one language, from gettext catalogues; ``translate`` puts text made
    from their English entries into that language."""

    def __init__(self, paths: list[Path]) -> None:
        import polib

        self.sentences: dict[str, str] = {}
        templates = []
        for path in paths:
            for entry in polib.pofile(str(path)).translated_entries():
                if "python-brace-format" in entry.flags:
                    templates.append(_Template(entry.msgid, entry.msgstr,
                                               split_template(entry.msgid)))
                else:
                    self.sentences[entry.msgid] = entry.msgstr
        # The longest literal text first: the most specific entry wins. An entry of
        # punctuation and holes alone would match anything, so it is left out.
        self.templates = sorted((t for t in templates if _has_words(t.parts[0::2])),
                                key=lambda t: -t.literal_length)
        # A sentence of one word is only ever a whole text (a label): as a piece it would
        # match inside other words and names.
        self.pieces: list[str | _Template] = sorted(
            [s for s in self.sentences if _has_words((s,)) and " " in s.strip()]
            + self.templates,
            key=lambda piece: -(len(piece) if isinstance(piece, str) else piece.literal_length))

    def translate(self, text: str) -> str:
        """``text`` in this catalogue's language, as far as its entries cover it."""
        core = text.strip()
        if not core:
            return text
        lead, trail = text[:len(text) - len(text.lstrip())], text[len(text.rstrip()):]
        return lead + self._whole(core) + trail

    def _whole(self, text: str) -> str:
        if text in self.sentences:
            return self.sentences[text]
        for template in self.templates:
            if _in_order(template.parts[0::2], text):
                found = template.pattern.fullmatch(text)
                if found is not None:
                    return self._fill(template, found)
        return self._pieces(text)

    def _fill(self, template: _Template, found: re.Match) -> str:
        values: dict[str, str] = {}
        for hole, value in zip(template.holes, found.groups(), strict=True):
            values.setdefault(hole, self.translate(value))
        return template.fill(values)

    def _pieces(self, text: str) -> str:
        """Translate the entries found inside ``text`` (a hint is often a few of them, one
        after the other), leaving the rest as it is."""
        segments: list[tuple[str, bool]] = [(text, False)]
        for piece in self.pieces:
            if isinstance(piece, str):
                segments = _split(segments, lambda s, e=piece: _find_sentence(s, e),
                                  lambda _match, e=piece: self.sentences[e])
            else:
                segments = _split(segments, lambda s, t=piece: _find_template(s, t),
                                  lambda match, t=piece: self._fill(t, match))
        return "".join(text for text, _ in segments)


def _split(segments: list[tuple[str, bool]], find, render) -> list[tuple[str, bool]]:
    """Replace, in the segments not yet translated, every match ``find`` gives by
    ``render(match)`` (marked translated)."""
    out = []
    for text, done in segments:
        while not done and text:
            match = find(text)
            if match is None:
                break
            start, end = match.span()
            if start:
                out.append((text[:start], False))
            out.append((render(match), True))
            text = text[end:]
        if text:
            out.append((text, done))
    return out


def _find_sentence(text: str, sentence: str) -> re.Match | None:
    """The sentence in ``text``, not as part of a longer word."""
    if sentence not in text:
        return None
    return re.search(r"(?<!\w)" * sentence[0].isalnum() + re.escape(sentence)
                     + r"(?!\w)" * sentence[-1].isalnum(), text)


def _find_template(text: str, template: _Template) -> re.Match | None:
    """A match of ``template`` inside ``text``: a hole at its start begins at the text's start,
    a hole at its end runs to the text's end (a hole has no edge of its own)."""
    if not _in_order(template.parts[0::2], text):
        return None
    pattern = template.pattern.pattern
    if template.parts[0] == "":
        pattern = "^" + pattern
    if template.parts[-1] == "":
        pattern += "$"
    return re.search(pattern, text, re.DOTALL)


def _in_order(literals: tuple[str, ...], text: str) -> bool:
    at = 0
    for literal in literals:
        at = text.find(literal, at)
        if at < 0:
            return False
        at += len(literal)
    return True


def _has_words(literals: tuple[str, ...]) -> bool:
    """Whether the literal text holds an English word (three letters or more)."""
    return any(re.search(r"[A-Za-z]{3,}", literal) for literal in literals)


@cache
def catalogue(package: Path, language: str) -> Catalogue | None:
    """Every catalogue of ``package`` (a folder holding ``locale/``) in ``language``; None for
    English, the source."""
    if language == ENGLISH:
        return None
    return Catalogue(sorted(locale_folder(package, language).glob("*.po")))


def tr(text: str) -> str:
    """``text`` (a sentence or text made from a template of the library) in the chosen
    language. The library marks what a learner reads with it; ``autograder.translation``
    collects what it marks."""
    book = catalogue(Path(__file__).resolve().parent, current())
    return text if book is None else book.translate(text)
