"""The translated editions: what a translator translates, and the notebooks made from it.

English is the source. ``update`` collects every text a learner reads and writes it into
gettext catalogues (``*.po``, one per notebook, chapter of checks, grader and library), keeping
each translation whose English is unchanged; ``build`` writes a translated notebook from an
English one and its catalogue. What is collected::

    solutions/NN_slug.ipynb     markdown, block by block (a fenced block whole);
                                in code cells, comments, docstrings (paragraph by paragraph)
                                and the strings a cell prints
        -> solutions/locale/<language>/LC_MESSAGES/NN_slug.po
    autograder/checks/chNN*.py  every string that reads as prose (not docstrings): hints,
    autograder/hidden/chNN*.py  ideas, the pieces they are made of
        -> autograder/locale/<language>/LC_MESSAGES/chNN.po
    autograder/checks/_*.py     the same, of the checks' shared helpers      -> .../grader.po
    autograder/*.py, host/*.py  what the grader marks (``tr_later``, ``in_language``): its
                                messages and reports to a learner             -> .../grader.po
    course/*.py                 what the library marks with ``tr(...)`` -> course/locale/...

An f-string becomes a template (flag ``python-brace-format``): its holes are written as their
expressions, and a translation keeps them (``course.language`` fills them back in).

A changed English text is a new entry: its old translation is kept beside it as fuzzy (with
the old English as ``previous msgid``), and ``stale`` names it until a translator confirms it.
"""

from __future__ import annotations

import ast
import difflib
import io
import itertools
import re
import tokenize
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nbformat

from autograder import kernel_side
from autograder.host.chapters import REPO, SOLUTIONS, chapters
from course.language import locale_folder, split_template

TRANSLATED = ("zh_CN",)  # the languages the course is translated into
BRACE = "python-brace-format"
# What marks a string for translation: a call of one of these functions, by its own name
# (``tr_later``: a text translated where it is shown).
MARKS = ("tr", "tr_later", "in_language")
# The keyword arguments whose strings a reader sees: chart titles and legends, widget labels
# (of a dict, its keys: a chart's series or ceilings by name).
LABELS = ("title", "xaxis_title", "yaxis_title", "title_text", "x_title", "y_title", "name",
          "subplot_titles", "description", "series", "ceilings")
GLOSSARY = REPO / "docs" / "glossary.zh_CN.md"

_DIRECTIVE = re.compile(r"^#+\s*(BEGIN|END) (SOLUTION|HIDDEN TESTS)|^#!|^#\s*type:")


@dataclass(frozen=True)
class Text:
    """One text to translate: its English, where it is, and whether it is a template."""

    english: str
    where: str
    template: bool = False


# --- collecting ------------------------------------------------------------------------------


def module_texts(path: Path, marked_only: bool = False, labels: bool = False) -> list[Text]:
    """The strings of a Python module a learner reads: those marked for translation (the
    first argument of a call of one of ``MARKS``), with ``labels`` those given as a chart's or
    widget's text, and unless ``marked_only`` every other one that reads as prose (docstrings
    left out)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    marked = {call.args[0] for call in ast.walk(tree)
              if isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
              and call.func.id in MARKS and call.args}
    if labels:
        marked |= set(_labels(tree))
    docstrings = set(_first_expressions(tree))
    inner = {v for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    strings = [node for node in ast.walk(tree)
               if (isinstance(node, ast.JoinedStr)
                   or isinstance(node, ast.Constant) and isinstance(node.value, str))
               and node not in inner and node not in docstrings
               and (node in marked or not marked_only)]
    found = []
    for node in strings:
        template = isinstance(node, ast.JoinedStr)
        text = _template(node) if template else node.value
        if (node in marked or _is_prose(text, template)) and text.strip():
            found.append(Text(text.strip(), f"{path.relative_to(REPO)}:{node.lineno}",
                              template))
    return found


def _first_expressions(tree: ast.AST) -> list[ast.expr]:
    """The expression that each module, class and function opens with, where one does: its
    docstring, when that is a string."""
    return [node.body[0].value for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and node.body and isinstance(node.body[0], ast.Expr)]


def _labels(tree: ast.AST) -> list[ast.expr]:
    """The strings given as a chart's or widget's text (``title=``, ``name=`` ...)."""
    found = []
    for call in ast.walk(tree):
        if isinstance(call, ast.Call):
            for keyword in call.keywords:
                if keyword.arg in LABELS:
                    value = keyword.value
                    values = value.elts if isinstance(value, ast.Tuple | ast.List) else \
                        value.keys if isinstance(value, ast.Dict) else [value]
                    found += [v for v in values if isinstance(v, ast.Constant | ast.JoinedStr)]
    return found


def _template(node: ast.JoinedStr) -> str:
    """An f-string's source as a template: literal braces doubled, holes as expressions."""
    out = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            out.append(value.value.replace("{", "{{").replace("}", "}}"))
        else:
            hole = ast.unparse(value.value)
            if value.conversion != -1:
                hole += "!" + chr(value.conversion)
            if value.format_spec is not None:
                hole += ":" + _template(value.format_spec)
            out.append("{" + hole + "}")
    return "".join(out)


def _is_prose(text: str, template: bool, label: bool = False) -> bool:
    """Whether a string reads as words to a learner, not as a name, a path or a format: two
    English words or more, or for a template (which glues pieces of a hint together) one; a
    chart's or widget's label (``y_title="requests"``) is read as words even when it is one."""
    literal = "".join(split_template(text)[0::2]) if template else text
    literal = re.sub(r"<[^<>]*>", "", literal)  # HTML tags are not words
    words = re.findall(r"(?<![\w.])[A-Za-z][a-z]+(?![\w(.])", literal)
    return len(words) >= (1 if template or label else 2) and (label or " " in literal.strip())


def notebook_texts(path: Path) -> list[Text]:
    """What a reader reads in a notebook, in order."""
    notebook = nbformat.read(path, as_version=4)
    found = [Text(notebook.metadata["course"]["title"], "metadata.course.title")]
    for index, cell in enumerate(notebook.cells):
        found += [Text(piece.english, f"{path.name}:cell {index}", piece.template)
                  for piece in _pieces(cell)]
    return found


def _pieces(cell: nbformat.NotebookNode) -> list[Piece]:
    return (markdown_pieces(cell.source) if cell.cell_type == "markdown"
            else code_pieces(cell.source))


# Between two Chinese characters (or their punctuation), a source line break that Markdown
# would render as a space; the next line's indent (a list item's continuation) goes with it.
_CJK = "\u3000-\u303f\u4e00-\u9fff\uff00-\uffef"
CJK_BREAK = re.compile(f"(?<=[{_CJK}])\n[ \t]*(?=[{_CJK}])")


@dataclass(frozen=True)
class Piece:
    """A span of a cell's source holding one text, and how a translation is written there."""

    start: int
    end: int
    english: str
    kind: str  # "block" (Markdown prose), "fenced", "comment", "docstring", "string"
    indent: str = ""
    template: bool = False

    def written(self, translation: str) -> str:
        if self.kind == "comment":
            return ("\n" + self.indent).join(
                "#" + (" " + line if line else "") for line in translation.split("\n"))
        if self.kind == "docstring":
            return ("\n" + self.indent).join(translation.split("\n"))
        if self.kind == "block":  # Markdown prose: a line break is a space, none in Chinese
            return CJK_BREAK.sub("", translation)
        return translation


def markdown_pieces(source: str) -> list[Piece]:
    """Blocks between blank lines; a fenced block (a diagram, a signature) is one piece when
    it holds words, its fences left as they are."""
    pieces, fenced, start, inside = [], False, None, 0
    at = 0
    for line in source.splitlines(keepends=True):
        stripped = line.strip()
        if stripped.startswith("```"):
            if start is not None and not fenced:
                pieces.append(_block(source, start, at))
                start = None
            if fenced and _is_prose(source[inside:at], False):
                pieces.append(_block(source, inside, at, "fenced"))
            fenced, inside = not fenced, at + len(line)
        elif not fenced:
            if stripped and start is None:
                start = at
            elif not stripped and start is not None:
                pieces.append(_block(source, start, at))
                start = None
        at += len(line)
    if start is not None and not fenced:
        pieces.append(_block(source, start, at))
    return [p for p in pieces if re.search(r"[A-Za-z]{2,}", p.english)]


def _block(source: str, start: int, end: int, kind: str = "block") -> Piece:
    text = source[start:end].rstrip()
    return Piece(start, start + len(text), text, kind)


def code_pieces(source: str) -> list[Piece]:
    """Comments (a run of whole-line comments is one piece), docstring paragraphs and the
    string literals a cell prints."""
    sanitized = "\n".join(" " * len(line) if line.lstrip().startswith(("%", "!")) else line
                          for line in source.split("\n"))
    pieces = _comments(sanitized)
    try:
        tree = ast.parse(sanitized)
    except SyntaxError:
        return pieces
    pieces += _docstrings(tree, source) + _printed(tree, sanitized)
    return sorted(pieces, key=lambda p: p.start)


def _index(source: str) -> Callable[[tuple[int, int]], int]:
    """From a (line, column) position in ``source``, as ``tokenize`` gives it, to its index."""
    offsets = [0, *itertools.accumulate(len(line) + 1 for line in source.split("\n"))]
    return lambda position: offsets[position[0] - 1] + position[1]


def _comments(source: str) -> list[Piece]:
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
                  if t.type == tokenize.COMMENT]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []
    lines, at = source.split("\n"), _index(source)
    pieces: list[Piece] = []
    run: list[tokenize.TokenInfo] = []

    def close() -> None:
        if run:
            text = "\n".join(t.string[1:].removeprefix(" ") for t in run)
            if re.search(r"[A-Za-z]{2,}", text):
                pieces.append(Piece(at(run[0].start), at(run[-1].end), text, "comment",
                                    " " * run[0].start[1]))
            run.clear()

    for token in tokens:
        row, col = token.start
        whole_line = not lines[row - 1][:col].strip()
        if _DIRECTIVE.search(token.string) or token.string.startswith("#@") \
                or "noqa" in token.string:
            close()
            if token.string.startswith("#@title "):
                title = token.string.removeprefix("#@title ")
                start = at(token.start) + len("#@title ")
                pieces.append(Piece(start, start + len(title), title, "block"))
            continue
        follows = run and whole_line and row == run[-1].start[0] + 1 \
            and col == run[-1].start[1]
        if not follows:
            close()
        run.append(token)
        if not whole_line:
            close()
    close()
    return pieces


def _docstrings(tree: ast.AST, source: str) -> list[Piece]:
    pieces = []
    for literal in _first_expressions(tree):
        if not (isinstance(literal, ast.Constant) and isinstance(literal.value, str)):
            continue
        start, end = _span(literal, source)
        if source[start:start + 3] not in ('"""', "'''"):
            continue
        inside, at = source[start + 3:end - 3], start + 3
        indent = " " * (start - source.rfind("\n", 0, start) - 1)
        for match in re.finditer(r"(?:[^\n]*\S[^\n]*(?:\n|$))+", inside):
            lead = len(match.group()) - len(match.group().lstrip())
            lines = match.group()[lead:].rstrip().split("\n")
            text = "\n".join([lines[0], *(line.removeprefix(indent) for line in lines[1:])])
            if re.search(r"[A-Za-z]{2,}", text):
                pieces.append(Piece(at + match.start() + lead,
                                    at + match.start() + len(match.group().rstrip()),
                                    text, "docstring", indent))
    return pieces


def _span(node: ast.expr, source: str) -> tuple[int, int]:
    """Where ``node`` is in ``source``, in characters (``ast`` counts a line's UTF-8 bytes)."""
    lines, index = source.split("\n"), _index(source)

    def at(line: int, byte: int) -> int:
        return index((line, len(lines[line - 1].encode()[:byte].decode())))

    return at(node.lineno, node.col_offset), at(node.end_lineno, node.end_col_offset)


def _printed(tree: ast.AST, source: str) -> list[Piece]:
    """Each string literal an argument of ``print(...)`` (or either branch of one: ``print(a if
    same else b)``), or a chart's or widget's text (``title=`` ...), is made of: its text
    between the quotes, holes as written."""
    printed = [branch for call in ast.walk(tree)
               if isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
               and call.func.id == "print" for argument in call.args
               for branch in _branches(argument)]
    labels = _labels(tree)
    pieces = []
    for argument in printed + labels:
        if not isinstance(argument, ast.Constant | ast.JoinedStr):
            continue
        start, end = _span(argument, source)
        for token_start, token_end in _string_tokens(source[start:end]):
            literal = source[start + token_start:start + token_end]
            prefix = re.match(r"[A-Za-z]*", literal).group()
            quote = 3 if literal[len(prefix):len(prefix) + 3] in ('"""', "'''") else 1
            inner_start = start + token_start + len(prefix) + quote
            inner = source[inner_start:start + token_end - quote]
            template = "f" in prefix.lower()
            if _is_prose(inner, template, argument in labels):
                pieces.append(Piece(inner_start, inner_start + len(inner), inner, "string",
                                    template=template))
    return pieces


def _branches(node: ast.expr) -> list[ast.expr]:
    """``node``, or for a conditional expression the branches it may be."""
    if isinstance(node, ast.IfExp):
        return _branches(node.body) + _branches(node.orelse)
    return [node]


def _string_tokens(code: str) -> list[tuple[int, int]]:
    """The (start, end) of each string literal in ``code`` (an expression)."""
    at, spans, opened = _index(code), [], None
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        name = tokenize.tok_name[token.type]
        if name == "STRING":
            spans.append((at(token.start), at(token.end)))
        elif name == "FSTRING_START":  # Python 3.12 and later
            opened = at(token.start)
        elif name == "FSTRING_END" and opened is not None:
            spans.append((opened, at(token.end)))
            opened = None
    return spans


def domains() -> dict[Path, list[Text]]:
    """Every catalogue's English texts, by its path in the first translated language (the
    other languages' catalogues sit at the same place under their own name)."""
    grader = REPO / "autograder"
    language = TRANSLATED[0]
    found: dict[Path, list[Text]] = {}
    for chapter in chapters().values():
        found[notebook_catalogue(chapter, language)] = notebook_texts(chapter.source)
        number = chapter.number
        modules = [*sorted((grader / "checks").glob(f"ch{number}*.py")),
                   *sorted((grader / "hidden").glob(f"ch{number}*.py"))]
        found[locale_folder(grader, language) / f"ch{number}.po"] = [
            t for m in modules for t in module_texts(m)]
    found[locale_folder(grader, language) / "grader.po"] = grader_texts()
    library = REPO / "course"
    found[locale_folder(library, language) / "course.po"] = [
        t for module in sorted(library.rglob("*.py"))
        for t in module_texts(module, marked_only=True, labels=True)]
    return found


def grader_texts() -> list[Text]:
    """What the grader says to a learner besides its chapters' checks, by where it is: the
    checks' shared helpers (``checks/_*.py``) say nothing but hints, so all their prose; the
    kernel side's other modules and the host also say what an instructor alone reads (a broken
    build, a check's mistake, a class run's progress, a status in the CSV), so only what they
    mark."""
    grader = REPO / "autograder"
    helpers = sorted((grader / "checks").glob("_*.py"))
    marking = [*kernel_side(), *sorted((grader / "host").glob("*.py"))]
    return [*(t for m in helpers for t in module_texts(m)),
            *(t for m in marking for t in module_texts(m, marked_only=True))]


def notebook_catalogue(chapter, language: str) -> Path:
    """The catalogue of ``chapter``'s notebook in ``language``."""
    return locale_folder(SOLUTIONS, language) / f"{chapter.name}.po"


def catalogue_path(path: Path, language: str) -> Path:
    """A catalogue's path (as ``domains`` gives it) for ``language``."""
    return Path(str(path).replace(f"/{TRANSLATED[0]}/", f"/{language}/"))


# --- catalogues ------------------------------------------------------------------------------


def update(path: Path, texts: list[Text], language: str,
           compendium: dict[str, str] | None = None) -> list[str]:
    """Write the catalogue at ``path`` for ``texts``: a translation whose English is unchanged
    is kept, or taken from ``compendium`` (the other catalogues' translations: a text that
    moved from one module to another keeps its translation); one whose English changed is kept
    as fuzzy beside its new English (the nearest old one, as ``previous msgid``); texts gone
    are dropped. Return the English of every entry without a current translation."""
    import polib

    known = _entries(path)
    catalogue = polib.POFile(wrapwidth=100)
    catalogue.metadata = {"Project-Id-Version": "paged-kv-course",
                          "Language": language, "MIME-Version": "1.0",
                          "Content-Type": "text/plain; charset=UTF-8",
                          "Content-Transfer-Encoding": "8bit"}
    merged: dict[str, polib.POEntry] = {}
    english = {t.english for t in texts}
    gone = {msgid: e for msgid, e in known.items() if msgid not in english}
    for text in texts:
        entry = merged.get(text.english)
        if entry is None:
            entry = _entry(text, known.get(text.english), gone, compendium or {})
            merged[text.english] = entry
            catalogue.append(entry)
        entry.occurrences.append((text.where, ""))
    path.parent.mkdir(parents=True, exist_ok=True)
    catalogue.save(str(path))
    return [e.msgid for e in catalogue if not e.msgstr or "fuzzy" in e.flags]


def _entry(text: Text, before, gone: dict, compendium: dict[str, str]):
    import polib

    flags = [BRACE] if text.template else []
    if before is not None:
        return polib.POEntry(msgid=text.english, msgstr=before.msgstr,
                             flags=sorted(set(flags) | set(before.flags)),
                             previous_msgid=before.previous_msgid)
    if compendium.get(text.english):
        return polib.POEntry(msgid=text.english, msgstr=compendium[text.english], flags=flags)
    nearest = difflib.get_close_matches(text.english, gone, n=1, cutoff=0.6)
    if nearest:
        was = gone[nearest[0]]
        return polib.POEntry(msgid=text.english, msgstr=was.msgstr, flags=[*flags, "fuzzy"],
                             previous_msgid=was.msgid)
    return polib.POEntry(msgid=text.english, msgstr="", flags=flags)


def stale(path: Path, texts: list[Text]) -> list[str]:
    """What ``path``'s catalogue lacks for ``texts``: one line per text with no translation,
    a fuzzy one (its English changed), a template not flagged as one, or a translation that
    lost or added a hole."""
    entries = _entries(path)
    problems = []
    for text in {t.english: t for t in texts}.values():
        entry = entries.get(text.english)
        where = text.where
        if entry is None or not entry.msgstr:
            problems.append(f"{where}: no translation of {text.english!r}")
        elif "fuzzy" in entry.flags:
            problems.append(f"{where}: the English changed, the translation did not "
                            f"(was {entry.previous_msgid!r}, now {text.english!r})")
        elif text.template and BRACE not in entry.flags:
            problems.append(f"{where}: {text.english!r} is a template, and its entry lacks "
                            "the python-brace-format flag (without it, its holes are read as "
                            "words and the hint is never translated)")
        elif text.template and sorted(split_template(entry.msgstr)[1::2]) != \
                sorted(split_template(text.english)[1::2]):
            problems.append(f"{where}: the translation of {text.english!r} must keep its "
                            f"holes {sorted(set(split_template(text.english)[1::2]))}")
    return problems


def _entries(path: Path) -> dict:
    """A catalogue's entries (not obsolete ones) by English: none where it is not written yet."""
    import polib

    if not path.exists():
        return {}
    return {e.msgid: e for e in polib.pofile(str(path)) if not e.obsolete}


def compendium(language: str) -> dict[str, str]:
    """Every current translation into ``language``, from all its catalogues."""
    return {english: chinese for path in domains()
            for english, chinese in translations(catalogue_path(path, language)).items()}


def translations(path: Path) -> dict[str, str]:
    """A catalogue's current translations, by English."""
    import polib

    if not path.exists():
        return {}
    return {e.msgid: e.msgstr for e in polib.pofile(str(path)).translated_entries()}


# --- translated notebooks --------------------------------------------------------------------


def build(source: Path, catalogue: Path, language: str) -> nbformat.NotebookNode:
    """The notebook ``source`` in ``language``: its texts replaced by their translations (an
    untranslated one stays English), the same code, cells, ids and grades; its set-up cell
    chooses the language, and each glossary term's first use carries its English."""
    words = translations(catalogue)
    notebook = nbformat.read(source, as_version=4)
    course = notebook.metadata["course"]
    course["title"] = words.get(course["title"], course["title"])
    course["language"] = language
    for cell in notebook.cells:
        text = cell.source
        for piece in reversed(_pieces(cell)):
            if piece.english in words:
                text = text[:piece.start] + piece.written(words[piece.english]) + \
                    text[piece.end:]
        cell.source = text
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "setup":
            cell.source = cell.source.replace("course.setup()",
                                              f'course.setup(language="{language}")')
    _mark_first_uses(notebook, glossary())
    return notebook


def glossary() -> dict[str, str]:
    """The glossary's terms: English -> Chinese."""
    rows = re.findall(r"^\| ([^|]+?) \| ([^|]+?) \|$", GLOSSARY.read_text(encoding="utf-8"),
                      re.MULTILINE)
    return {english: chinese for english, chinese in rows if english not in ("English", "---")}


def _mark_first_uses(notebook: nbformat.NotebookNode, terms: dict[str, str]) -> None:
    """Put each term's English beside its first use in the notebook's markdown: the first in
    running text not already followed by a bracket, else the first at all (a heading's, or
    one whose bracket then opens with the English). It goes after the emphasis the term may
    close: ``**调度器**（scheduler）`` (CommonMark does not close ``**`` between ``）`` and a
    letter)."""
    cells = [c for c in notebook.cells if c.cell_type == "markdown"]
    for english, chinese in terms.items():
        uses = [(rank, index, at) for index, cell in enumerate(cells)
                for rank, at in _uses(cell.source, chinese)]
        if not uses:
            continue
        _, index, at = min(uses)
        text = cells[index].source
        end = at + len(chinese)
        end += len(re.match(r"\**", text[end:]).group())
        if text[end:end + 1] in ("（", "("):
            cells[index].source = text[:end + 1] + f"{english}；" + text[end + 1:]
        else:
            cells[index].source = text[:end] + f"（{english}）" + text[end:]


def _uses(text: str, term: str) -> list[tuple[int, int]]:
    """(rank, where) of each use of ``term`` in ``text`` outside code (backticks, fences):
    rank 0 in running text with no bracket after it, 1 otherwise."""
    found = []
    for match in re.finditer(re.escape(term), text):
        before = text[:match.start()]
        if before.count("`") % 2 or before.count("```") % 2:
            continue
        line = before[before.rfind("\n") + 1:]
        after = text[match.end():].lstrip("*")
        plain = not line.startswith("#") and not after.startswith(("（", "("))
        found.append((0 if plain else 1, match.start()))
    return found
