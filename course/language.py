"""The language the course speaks to a learner, and its translations (gettext catalogues).

English is the source: every sentence is written in English in the code or the notebook, and
a translation lives in a gettext catalogue (``<package>/locale/<language>/LC_MESSAGES/*.po``),
keyed by that English sentence. Change the sentence and its translation is out of date: the
suite says which.

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
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, lru_cache
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
    def literal_length(self) -> int:
        return sum(len(p) for p in self.parts[0::2])

    @property
    def pattern(self) -> re.Pattern:
        return _layout(self.parts).pattern

    def fill(self, found: re.Match, parse: Callable[[str], tuple[str, int]]
             ) -> tuple[str, int]:
        """The translation, its holes filled with what ``found`` captured, translated too
        (``parse``: a text's translation and how much of it the catalogue knew); and how much
        of the text matched this accounts for.

        Holes side by side in the English ("{why} {idea}") are captured as one text, since
        nothing tells where one ends and the next begins: where the translation keeps them side
        by side, that text is translated whole; elsewhere it is cut at the English separators."""
        tokens = [(i % 2 == 1, part) for i, part in enumerate(split_template(self.translation))]
        values: dict[str, str] = {}
        known = self.literal_length
        layout = _layout(self.parts)
        for holes, separators, text in zip(layout.runs, layout.separators, found.groups(),
                                           strict=True):
            at = _find_run(tokens, holes)
            if at is not None:
                said, inside = parse(text)
                tokens[at:at + 2 * len(holes) - 1] = [(False, said)]
                known += inside
                continue
            for hole, value in zip(holes, _cut(text, separators), strict=True):
                said, inside = parse(value)
                values.setdefault(hole, said)
                known += inside
        return "".join(values.get(text, "{" + text + "}") if hole else text
                       for hole, text in tokens), known


@dataclass(frozen=True)
class _Layout:
    pattern: re.Pattern
    runs: tuple[tuple[str, ...], ...]  # the holes each group of the pattern captures
    separators: tuple[tuple[str, ...], ...]  # the literal text between a run's holes


def _joins(literal: str) -> bool:
    """Whether holes either side of ``literal`` are captured together: it is blank, so
    nothing tells where one ends."""
    return not literal.strip()


@cache
def _layout(parts: tuple[str, ...], greedy: bool = False) -> _Layout:
    pattern, runs, separators = [re.escape(parts[0])], [], []
    i = 1
    while i < len(parts):
        j = i
        while j + 2 < len(parts) and _joins(parts[j + 1]):
            j += 2
        runs.append(parts[i:j + 1:2])
        separators.append(parts[i + 1:j:2])
        quoted = parts[i - 1].endswith("`") and parts[j + 1].startswith("`")
        numeric = i == j and re.search(r":[^{}]*[defgn%]$", parts[i])
        hole = _QUOTED if quoted else _NUMBER if numeric else _hole(parts[j + 1], greedy)
        pattern += [hole, re.escape(parts[j + 1])]
        i = j + 2
    return _Layout(re.compile("".join(pattern), re.DOTALL), tuple(runs), tuple(separators))


def _find_run(tokens: list[tuple[bool, str]], holes: tuple[str, ...]) -> int | None:
    """Where ``holes`` stand side by side, in order, in a translation's tokens."""
    for at in range(len(tokens) - 2 * len(holes) + 2):
        if all(tokens[at + 2 * k] == (True, hole) for k, hole in enumerate(holes)) and all(
                not tokens[at + 2 * k + 1][0] and _joins(tokens[at + 2 * k + 1][1])
                for k in range(len(holes) - 1)):
            return at
    return None


def _cut(text: str, separators: tuple[str, ...]) -> list[str]:
    """``text`` cut at ``separators`` (each after the one before) into a value per hole."""
    pattern = "".join(_hole(sep) + re.escape(sep) for sep in separators) + _hole("")
    found = re.fullmatch(pattern, text, re.DOTALL)
    return list(found.groups()) if found else [text, *[""] * len(separators)]


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


# Code a hint quotes in backticks is read whole: its brackets need not balance (a line of a
# kernel cut at its end). A backtick with no partner is plain text.
_PLAIN = r"[^()\[\]{}`]|`(?![^`]*`)"
_CODE = r"`[^`]*`"
_QUOTED = r"([^`]*)"  # a hole between backticks holds code
# a hole formatted as a number ({error:.3g}) holds one whole: "2.79." is 2.79 and a full stop;
# padded to a width ({ms:7.1f}), its spaces with it
_NUMBER = r"( *[-+]?(?:inf|nan|\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?%?))"


def _group(depth: int) -> str:
    """A bracketed group whose brackets balance, nested up to ``depth`` deep (``re`` has no
    recursion)."""
    inner = f"{_PLAIN}|{_CODE}"
    for _ in range(depth):
        inner = f"{_PLAIN}|{_CODE}|\\((?:{inner})*\\)|\\[(?:{inner})*\\]|\\{{(?:{inner})*\\}}"
    return f"\\((?:{inner})*\\)|\\[(?:{inner})*\\]|\\{{(?:{inner})*\\}}"


_GROUP = _group(3)


def _hole(following: str, greedy: bool = False) -> str:
    """A hole holds a value: its brackets balance (code in backticks aside). Read shortest
    first, it never holds the literal text that follows it outside its brackets, so
    "0 (10 tokens), 1 (4 tokens)" is two matches of "{id} ({n} tokens)", not one whose first
    hole is "0 (10 tokens), 1"."""
    if greedy:
        return f"((?:{_PLAIN}|{_CODE}|{_GROUP})*)"
    stop = f"(?!{re.escape(following)})" if following else ""
    return f"((?:{stop}(?:{_PLAIN})|{_CODE}|{_GROUP})*?)"


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
        # The most specific entry wins: one that begins with its own words, then the one with
        # the most literal text. An entry of punctuation and holes alone would match
        # anything, so it is left out.
        self.templates = sorted((t for t in templates if _has_words(t.parts[0::2])),
                                key=lambda t: (t.parts[0] == "", -t.literal_length))
        # A sentence of one word is only ever a whole text (a label): as a piece it would
        # match inside other words and names.
        self.pieces: list[str | _Template] = sorted(
            [s for s in self.sentences if _has_words((s,)) and " " in s.strip()]
            + self.templates,
            key=lambda piece: -(len(piece) if isinstance(piece, str) else piece.literal_length))

        self._parse = lru_cache(maxsize=4096)(self._parse_text)

    def translate(self, text: str) -> str:
        """``text`` in this catalogue's language, as far as its entries cover it."""
        return self._parse(text)[0]

    def _parse_text(self, text: str) -> tuple[str, int]:
        """``text`` translated, and how many of its characters the entries used account for.

        Of every entry found in the text, the one whose reading accounts for most of it (its
        own words, what its holes hold, and what is before and after it, read the same way)
        wins. So a template whose hole would swallow the next sentence ("it raised {e}") loses
        to the one that knows the sentence ("it raised {e}; this token needs ...")."""
        core = text.strip()
        if not core:
            return text, 0
        lead, trail = text[:len(text) - len(text.lstrip())], text[len(text.rstrip()):]
        if core in self.sentences:
            return lead + self.sentences[core] + trail, len(core)
        found = []
        for piece in self.pieces:
            if isinstance(piece, str):
                match = _find_sentence(core, piece)
                found += [(piece, match)] if match else []
            else:
                found += [(piece, match) for match in _find_template(core, piece)]
        best = (core, 0)
        for piece, match in sorted(found, key=lambda item: item[1].start()):
            if isinstance(piece, str):
                said, known = self.sentences[piece], len(piece)
            else:
                said, known = piece.fill(match, self._parse)
            before, known_before = self._parse(core[:match.start()])
            after, known_after = self._parse(core[match.end():])
            if known_before + known + known_after > best[1]:
                best = (before + said + after, known_before + known + known_after)
        return lead + best[0] + trail, best[1]


def _find_sentence(text: str, sentence: str) -> re.Match | None:
    """The sentence in ``text``, not as part of a longer word."""
    if sentence not in text:
        return None
    return re.search(r"(?<!\w)" * sentence[0].isalnum() + re.escape(sentence)
                     + r"(?!\w)" * sentence[-1].isalnum(), text)


def _find_template(text: str, template: _Template) -> list[re.Match]:
    """The matches of ``template`` inside ``text``, its holes read shortest first and longest
    first (the two readings may differ: "{at}: {label} is wrong" on "f on x: seq 0: acc is
    wrong"). A hole at its start begins at the text's start, a hole at its end runs to the
    text's end (a hole has no edge of its own)."""
    if not _in_order(template.parts[0::2], text):
        return []
    found = []
    for pattern in (template.pattern, _layout(template.parts, greedy=True).pattern):
        match = _anchored(pattern.pattern, template.parts[0] == "",
                          template.parts[-1] == "").search(text)
        if match and match.end() > match.start() and all(
                match.span() != other.span() or match.groups() != other.groups()
                for other in found):
            found.append(match)
    return found


@cache
def _anchored(pattern: str, start: bool, end: bool) -> re.Pattern:
    return re.compile("^" * start + pattern + "$" * end, re.DOTALL)


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
def catalogue(package: Path, language: str, domains: tuple[str, ...] = ()
              ) -> Catalogue | None:
    """The catalogues of ``package`` (a folder holding ``locale/``) in ``language``: those
    named in ``domains`` (``"ch03"`` for ``ch03.po``), else all; None for English, the
    source."""
    if language == ENGLISH:
        return None
    folder = locale_folder(package, language)
    return Catalogue([folder / f"{name}.po" for name in domains] if domains
                     else sorted(folder.glob("*.po")))


def columns(text: str) -> int:
    """How many columns of a terminal ``text`` takes: two for a wide character (Chinese, East
    Asian Width W or F), one for any other."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def aligned(text: str, width: int) -> str:
    """``text`` in ``abs(width)`` columns of a terminal (where a Chinese character takes two),
    right-aligned, or left-aligned for a negative ``width``: a table's heading in any
    language."""
    pad = " " * max(abs(width) - columns(text), 0)
    return text + pad if width < 0 else pad + text


def tr(text: str) -> str:
    """``text`` (a sentence or text made from a template of the library) in the chosen
    language. The library marks what a learner reads with it; ``autograder.builder.translation``
    collects what it marks."""
    return tr_in(text, current())


def tr_in(text: str, language: str) -> str:
    """``tr`` in ``language``, whichever language is chosen: a report for another reader."""
    book = catalogue(Path(__file__).resolve().parent, language)
    return text if book is None else book.translate(text)


def tr_later(text: str) -> str:
    """``text`` as it is: marks a text kept in English (a name the library also reads, an
    event it counts, a reason the grader gives) and translated where it is shown (``tr(name)``,
    the grader's ``in_language``), for the catalogue."""
    return text
