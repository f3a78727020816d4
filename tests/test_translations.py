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
import shutil
from functools import reduce
from pathlib import Path

import nbformat
import polib
import pytest
from conftest import CHAPTERS, REPO

from autograder.builder.translation import (
    CJK_BREAK,
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
from autograder.hints import in_language
from autograder.host.autograde import (
    Grader,
    Grading,
    Job,
    _neutralise,
    flag,
    grader_failed,
    without_demonstrations,
)
from autograder.host.chapters import EXERCISES
from autograder.host.feedback import HideHiddenTests
from autograder.host.report import failure_message
from autograder.host.submission import Submission, read
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
            # a longer term holding this one speaks for it there ("draft model", not "draft")
            alone = reduce(lambda text, longer: re.sub(rf"(?i)\b{re.escape(longer)}", "", text),
                           [t for t in TERMS if english in t and t != english], prose)
            if re.search(rf"(?i)\b{re.escape(english)}(s|es)?\b", alone) and \
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
def test_no_space_falls_between_two_chinese_characters(chapter):
    """Markdown renders a source line break as a space, which Chinese never puts between two
    characters: the translated prose joins such lines (a diagram's fenced lines stay; the
    exercise notebooks' Markdown is the solution's)."""
    translated = nbformat.read(chapter.source_in(TRANSLATED[0]), as_version=4)
    for cell in translated.cells:
        if cell.cell_type == "markdown":
            prose = re.sub(r"```.*?```", "", cell.source, flags=re.S)
            found = [prose[max(0, m.start() - 8):m.end() + 8] for m in CJK_BREAK.finditer(prose)]
            assert not found, (cell.get("id"), found)


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


# --- what the grader's host tells a learner ----------------------------------------------------
# The host says much that only an instructor reads, and marks what a learner reads
# (``autograder.builder.translation.grader_texts``): each message below is made by the host's
# own code for a Chinese notebook and must reach the learner in Chinese.

ZH = "zh_CN"
CJK = re.compile(r"[\u4e00-\u9fff]")


def _code_cell(source: str, cell_id: str, **nbgrader) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source, id=cell_id)
    if nbgrader:
        cell.metadata["nbgrader"] = {"schema_version": 3, "grade_id": cell_id, **nbgrader}
    return cell


def _notebook(*cells: nbformat.NotebookNode) -> nbformat.NotebookNode:
    notebook = nbformat.v4.new_notebook(cells=list(cells))
    notebook.metadata["course"] = {"language": ZH}
    return notebook


@pytest.mark.parametrize("outputs", [
    None,
    [nbformat.v4.new_output("error", ename="CellTimeoutError", evalue="", traceback=[])],
    [nbformat.v4.new_output("stream", name="stderr", text="careful\n")],
    [],
], ids=["test cell missing", "cell timed out", "wrote to stderr", "no message"])
def test_a_test_cells_failure_the_host_reads_is_told_in_chinese(outputs):
    english = failure_message(outputs, 120)
    said = in_language(english, ZH)
    assert said != english and CJK.search(said), said


def test_a_grader_failure_is_told_in_chinese():
    refused = Submission("nb.ipynb", "ada", "01_kv_cache_sizing", None,
                         notebook=_notebook())
    refused.refuse(str(grader_failed(ValueError("boom"))))
    assert CJK.search(refused.result.error) and "ValueError: boom" in refused.result.error


def test_a_notebook_handed_in_under_another_chapters_name_is_refused_in_chinese(tmp_path):
    first, second = CHAPTERS[0], CHAPTERS[1]
    handed_in = tmp_path / f"{second.name}.ipynb"
    shutil.copy(EXERCISES / ZH / f"{first.name}.ipynb", handed_in)
    stranger = tmp_path / "stranger.ipynb"
    nbformat.write(_notebook(_code_cell("x = 1", "mine")), stranger)
    wrong, unknown = (Submission(str(path), "ada", second.name if path == handed_in else "",
                                 None, path) for path in (handed_in, stranger))
    read([wrong, unknown], {c.name: c for c in CHAPTERS})
    for refused in (wrong, unknown):
        assert refused.result is not None and CJK.search(refused.result.error), \
            refused.result.error
    assert first.name in wrong.result.error and second.name in wrong.result.error


def test_a_notebook_that_reaches_for_the_grader_gets_zero_in_chinese():
    released = _notebook(_code_cell("answer = None", "todo", solution=True, grade=False))
    learner = _notebook(_code_cell("import autograder.hidden", "todo", solution=True,
                                   grade=False))
    job = Job(CHAPTERS[0].name, "", "ada", "nb.ipynb", learner, ZH)
    grading = Grading(job, [("test_a", 1.0)], released, Path("unused"), notebook=learner)
    outcome = flag(Grader(), grading)
    message = outcome.result.tests[0].message
    assert outcome.result.score == 0 and CJK.search(message) and "autograder.hidden" in message


def test_an_unchanged_demonstration_not_run_says_so_in_chinese():
    shown = _code_cell("animate(pool)", "demo")
    shown.metadata["tags"] = ["demo"]
    stripped = without_demonstrations(_notebook(shown), _notebook(shown), ZH)
    assert CJK.search(stripped.cells[0].source) and stripped.cells[0].source.startswith("#")


def test_the_feedback_page_says_where_hidden_tests_were_in_chinese():
    test = _code_cell("check(x)\n### BEGIN HIDDEN TESTS\nsecret(x)\n### END HIDDEN TESTS\n",
                      "test_x", grade=True, points=1)
    page, _ = HideHiddenTests().preprocess(_notebook(test), {})
    assert "secret" not in page.cells[0].source and CJK.search(page.cells[0].source)


def test_what_replaces_a_crashing_cell_is_chinese_python(tmp_path):
    """A learner's cell that crashed the kernel is replaced by one that raises, and an answer
    whose test crashed it ends with a stand-in that raises when used: both in Chinese, both
    still Python that says so when run."""
    answer = _code_cell("def size(n):\n    return n", "size", solution=True, grade=False)
    mine = _code_cell("import os; os._exit(1)", "mine")
    test = _code_cell("check_size(size)", "test_size", grade=True, points=1)
    source = nbformat.writes(_notebook(answer, mine, test))
    for crashed, replaced in ((1, 1), (2, 0)):  # the learner's cell; the test of an answer
        path = tmp_path / f"crash-{crashed}.ipynb"
        path.write_text(source)
        assert _neutralise(path, crashed, source, ZH)
        changed = nbformat.read(path, as_version=4).cells[replaced]
        namespace: dict = {}
        with pytest.raises(RuntimeError) as raised:
            exec(changed.source, namespace)
            namespace["size"](4)
        assert CJK.search(str(raised.value)) and CJK.search(changed.source), changed.source
