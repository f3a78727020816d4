"""The Chinese edition keeps step with the English one: every text a learner reads has a current
translation (a changed English sentence fails here, named, until its translation is updated),
the glossary's terms are used, the translated notebooks are the English ones with only their
words changed, and the run-time translation of hints fills a template's holes back in.

The translated notebooks run top to bottom in tests/test_wheel.py and grade full marks in
tests/test_grading.py; every mutant's hint in Chinese is checked in tests/test_checks.py.
"""

from __future__ import annotations

import ast
import re

import nbformat
import polib
import pytest
from conftest import CHAPTERS, REPO

from autograder.builder.translation import (
    TRANSLATED,
    Text,
    build,
    catalogue_path,
    domains,
    glossary,
    notebook_catalogue,
    stale,
    update,
)
from course.language import Catalogue, split_template

CATALOGUES = [(catalogue_path(path, language), texts) for path, texts in domains().items()
              for language in TRANSLATED]


@pytest.mark.parametrize(("path", "texts"), CATALOGUES,
                         ids=[str(p.relative_to(REPO)) for p, _ in CATALOGUES])
def test_every_text_has_a_current_translation(path, texts):
    problems = stale(path, texts)
    assert not problems, (f"{len(problems)} texts of {path.relative_to(REPO)} lack a current "
                          "translation (run `python -m autograder translations`, translate, "
                          "then `make exercises`):\n" + "\n".join(problems[:20]))


def test_changing_one_english_sentence_makes_exactly_its_translation_stale(tmp_path):
    path, texts = CATALOGUES[0]
    catalogue = tmp_path / "chapter.po"
    catalogue.write_bytes(path.read_bytes())
    assert stale(catalogue, texts) == []
    changed = next(t for t in texts if len(t.english) > 80)
    edited = Text(changed.english.replace(" ", "  ", 1), changed.where)
    after = [edited if t.english == changed.english else t for t in texts]
    update(catalogue, after, TRANSLATED[0])
    problems = stale(catalogue, after)
    assert len(problems) == 1 and repr(edited.english) in problems[0]
    entry = polib.pofile(str(catalogue)).find(edited.english)
    assert "fuzzy" in entry.flags and entry.previous_msgid == changed.english
    assert entry.msgstr  # the old translation is kept beside it for the translator


def _prose(english: str) -> str:
    """English without its code (backticks) and holes: where a glossary term must be
    translated."""
    return re.sub(r"``.*?``|`[^`]*`|\{[^{}]*\}", " ", english)


TERMS = glossary()


@pytest.mark.parametrize(("path", "texts"), CATALOGUES,
                         ids=[str(p.relative_to(REPO)) for p, _ in CATALOGUES])
def test_translations_use_the_glossary(path, texts):
    missing = []
    for entry in polib.pofile(str(path)).translated_entries():
        prose = _prose(entry.msgid)
        for english, chinese in TERMS.items():
            if re.search(rf"(?i)\b{re.escape(english)}(s|es)?\b", prose) and \
                    chinese not in entry.msgstr:
                missing.append(f"{english!r} -> {chinese!r} in {entry.msgid[:80]!r}")
    assert not missing, f"{len(missing)} translations miss a glossary term:\n" + \
        "\n".join(missing[:20])


# A Chinese character, or a Chinese mark (the emphasis it closes aside), then an ASCII mark
# that Chinese writes full width: "并跳过计时." for "并跳过计时。". Code in backticks and holes
# are left out (``_prose``); a number's point follows a digit, never a Chinese character.
ASCII_MARK = re.compile(r"[\u3000-\u303f\u3400-\u9fff\uff00-\uffef]\**[.,;:?!]")


@pytest.mark.parametrize(("path", "texts"), CATALOGUES,
                         ids=[str(p.relative_to(REPO)) for p, _ in CATALOGUES])
def test_chinese_text_takes_chinese_punctuation(path, texts):
    found = [f"{entry.msgid[:60]!r}: {prose[max(mark.start() - 20, 0):mark.end() + 10]!r}"
             for entry in polib.pofile(str(path)).translated_entries()
             for prose in [_prose(entry.msgstr)] for mark in ASCII_MARK.finditer(prose)]
    assert not found, (f"{len(found)} translations in {path.relative_to(REPO)} put an ASCII "
                       "mark after Chinese text (write it full width: 。，；：？！):\n"
                       + "\n".join(found[:20]))


def test_one_english_text_has_one_translation():
    """The same English reads the same in every catalogue (spaces that align a table aside)."""
    chinese: dict[str, dict[str, str]] = {}  # English -> {translation: where it is first}
    for path, _ in CATALOGUES:
        for entry in polib.pofile(str(path)).translated_entries():
            chinese.setdefault(entry.msgid, {}).setdefault(entry.msgstr.strip(),
                                                           str(path.relative_to(REPO)))
    differing = [f"{english[:80]!r}: " + "; ".join(f"{where}: {said[:80]!r}"
                                                     for said, where in found.items())
                 for english, found in chinese.items() if len(found) > 1]
    assert not differing, (f"{len(differing)} English texts are translated two ways; choose "
                           "one:\n" + "\n".join(differing[:20]))


def _code(source: str) -> str:
    """A code cell's code, with every string and comment left out (what translation may
    change)."""
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return source
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            node.values = []
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = ""
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "setup":
            node.keywords = []  # a translated notebook's set-up chooses its language
    return ast.dump(tree)


@pytest.mark.parametrize("language", TRANSLATED)
@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.name)
def test_a_translated_notebook_is_the_english_one_in_other_words(chapter, language):
    english = nbformat.read(chapter.source, as_version=4)
    translated = nbformat.read(chapter.source_in(language), as_version=4)
    assert translated.metadata.course["language"] == language
    assert len(translated.cells) == len(english.cells)
    for ours, theirs in zip(english.cells, translated.cells, strict=True):
        assert (theirs.cell_type, theirs.get("id"), theirs.metadata.get("nbgrader")) == \
            (ours.cell_type, ours.get("id"), ours.metadata.get("nbgrader"))
        if ours.cell_type == "code":
            assert _code(theirs.source) == _code(ours.source), theirs.get("id")
    # what it says is the catalogue's: the committed notebook is what `make exercises` builds
    built = build(chapter.source, notebook_catalogue(chapter, language), language)
    assert [c.source for c in built.cells] == [c.source for c in translated.cells], (
        f"{chapter.source_in(language).relative_to(REPO)} is stale: run `make exercises`")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.name)
def test_a_translated_notebook_names_each_glossary_term_in_english_once(chapter):
    translated = nbformat.read(chapter.source_in(TRANSLATED[0]), as_version=4)
    text = "\n".join(c.source for c in translated.cells if c.cell_type == "markdown")
    for english, chinese in TERMS.items():
        if chinese in text:  # after the term, or after the emphasis the term closes
            marked = re.findall(rf"{re.escape(chinese)}\**（{re.escape(english)}[）；]", text)
            assert len(marked) == 1, (english, chinese)


@pytest.fixture(scope="module")
def catalogue(tmp_path_factory) -> Catalogue:
    path = tmp_path_factory.mktemp("po") / "hints.po"
    entries = polib.POFile()
    template = ["python-brace-format"]
    for english, chinese, flags in [
        ("After {more}{steps}: {problem}", "执行 {more}{steps} 之后：{problem}", template),
        ("seq_len({seq}) is {got}, expected {length}.",
         "seq_len({seq}) 为 {got}，应为 {length}。", template),
        ("A block's count is the number of tables that hold it.",
         "块的引用计数等于持有它的块表数。", []),
        ("{name} is not written yet: replace it.", "{name} 还没有写：替换它。", template),
        ("step", "步", []),
        ("{name} is off by up to {error:.3g}.", "{name} 的误差最大达 {error:.3g}。", template),
    ]:
        entries.append(polib.POEntry(msgid=english, msgstr=chinese, flags=flags))
    entries.save(str(path))
    return Catalogue([path])


@pytest.mark.parametrize(("english", "chinese"), [
    ("seq_len(2) is 3, expected 4.", "seq_len(2) 为 3，应为 4。"),
    ("After bm.allocate(0, 4): seq_len(0) is 3, expected 4. A block's count is the number of "
     "tables that hold it.",
     "执行 bm.allocate(0, 4) 之后：seq_len(0) 为 3，应为 4。 块的引用计数等于持有它的块表数。"),
    ("allocate is not written yet: replace it.", "allocate 还没有写：替换它。"),
    ("step", "步"),
    ("stepping on step_size stays", "stepping on step_size stays"),  # a word is not a piece
    ("  x = 1, nothing known  ", "  x = 1, nothing known  "),
    ("out is off by up to 2.79. A block's count is the number of tables that hold it.",
     "out 的误差最大达 2.79。 块的引用计数等于持有它的块表数。"),
], ids=["template", "nested and glued", "hole first", "label", "no partial word", "unknown",
        "a number before a full stop"])
def test_a_hint_is_translated_from_its_templates(catalogue, english, chinese):
    assert catalogue.translate(english) == chinese


def test_a_template_is_cut_into_literals_and_holes():
    assert split_template("a {x} b {y!r:>{w}} {{c}}") == ("a ", "x", " b ", "y!r:>{w}", " {c}")
