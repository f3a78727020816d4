"""English prose in what a learner reads: how tests/test_wheel.py tells that a Chinese
notebook's outputs speak Chinese (``shown`` lists every text an executed notebook shows).

An English word is letters alone, with an apostrophe or a hyphen between them ("course's",
"copy-on-write"), and not CamelCase ("BlockManager"): a token holding ``_ . ( )``, a digit, a
slash, a Chinese character, or letters in CamelCase is a name, a number or code, not a word.
A run of nothing but the Latin words the glossary's Chinese terms keep (null 块, KV 缓存, token
预算: a chapter's null slots, "null null null null") is Chinese text, not a sentence.
A sentence is a run of ``SENTENCE`` English words or more with only spaces and punctuation
between them (a line break too: a sentence may wrap). Code in backticks, a format's holes
(``{n}``, ``%{y:.2f}``: braces with no space inside) and a page's scripts and styles are code,
and end a sentence; HTML tags are markup, and do not.
"""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Iterator

import nbformat

SENTENCE = 4  # English words in a row that make a sentence

_CODE = re.compile(r"``.*?``|`[^`\n]*`|%\{[^{}]*\}|\{[^{}\s]*\}|<(script|style)\b.*?</\1>",
                   re.S)
_TAG = re.compile(r"<[^<>]*>")
_WORD = re.compile(r"[A-Za-z]+(?:['’-][A-Za-z]+)*")
_CAMEL = re.compile(r"[a-z][A-Z]")
_PUNCTUATION = "\"'“”‘’()[]{}<>,.;:!?…*|/=+-–—~#&"  # around a word, or a token of its own


@functools.cache
def _chinese_terms_latin() -> frozenset[str]:
    """The Latin words the glossary's Chinese terms keep (null 块, KV 缓存, token 预算): Chinese
    text, not English, where a Chinese page shows them."""
    from autograder.builder.translation import glossary

    return frozenset(word for chinese in glossary().values()
                     for word in _WORD.findall(chinese))


def english_sentences(text: str) -> list[str]:
    """Each English sentence in ``text``, its words joined by single spaces."""
    found, run = [], []
    kept = _chinese_terms_latin()

    def sentence(words: list[str]) -> list[str]:
        """The run, where it is one: enough words, not all of them a Chinese term's."""
        return [" ".join(words)] if len(words) >= SENTENCE and set(words) - kept else []

    for token in html.unescape(_TAG.sub(" ", _CODE.sub(" `` ", text))).split():
        word = token.strip(_PUNCTUATION)
        if _WORD.fullmatch(word) and not _CAMEL.search(word):
            run.append(word)
        elif word or token == "``":  # a name, a number, code, Chinese: the sentence ends
            found += sentence(run)
            run = []
    return found + sentence(run)


# Lower-case words a Chinese page keeps as they are: the glossary's Latin words aside, those
# the Chinese text itself uses (每个 token, 各 notebook, 每个 rank), units and a citation's.
KEPT_IN_CHINESE = frozenset({"token", "tokens", "notebook", "prompt", "logit", "logits", "rank",
                             "ms", "us", "et", "al"})
# Values a learner's code passes as they are spelled (``PagedEngine(..., preemption="swap")``)
# and the Python names a chapter measures (``deque``): code, not labels.
CODE_VALUES = frozenset({"swap", "recompute", "deque", "list"})


@functools.cache
def _todo_names() -> frozenset[str]:
    """Every TODO's name: a check says "allocate 通过了可见测试" of the code it ran."""
    from autograder.table import PARTS

    return frozenset(name for parts in PARTS.values() for name in parts.answers)
_LABEL = re.compile(r"[a-z]{2,}(?:-[a-z]+)*")


def english_labels(text: str) -> list[str]:
    """Each English word that labels something in ``text`` ("2 of 3", "load: True", "chat, all
    full"): a lower-case word outside code, a line citing a web address, the glossary's Latin
    words, ``KEPT_IN_CHINESE``, ``CODE_VALUES`` and the TODOs' names. A Chinese page shows
    none."""
    kept = _chinese_terms_latin() | KEPT_IN_CHINESE | CODE_VALUES | _todo_names()
    found = []
    for line in html.unescape(_TAG.sub(" ", _CODE.sub(" ", text))).splitlines():
        if "://" in line:  # a source cited: quoted as it is
            continue
        found += [word for token in re.split(r"[\s，。；：（）、]+", line)
                  if _LABEL.fullmatch(word := token.strip(_PUNCTUATION)) and word not in kept]
    return found


PLOTLY = "application/vnd.plotly.v1+json"
WIDGETS = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# What a plotly figure shows a reader: titles (axes', legends' and annotations' too), trace
# names, hover templates and texts drawn beside the marks. Its theme (``template``) is not
# text.
FIGURE_TEXTS = ("title", "text", "name", "hovertemplate", "hovertext", "texttemplate",
                "ticktext")


def _figure_texts(value: object, where: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key != "template":
                yield from _figure_texts(item, f"{where}.{key}" if where else key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _figure_texts(item, f"{where}[{index}]")
    elif isinstance(value, str) and where.rsplit(".", 1)[-1].split("[")[0] in FIGURE_TEXTS:
        yield where, value


def shown(notebook: nbformat.NotebookNode) -> Iterator[tuple[str, str, str]]:
    """(cell, output, text) for every text an executed notebook shows: streams, text data,
    errors, a plotly figure's texts, and the widgets' state (a widget's first view)."""
    for index, cell in enumerate(notebook.cells):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        name = f"cell {index}" + (f" ({grade_id})" if grade_id else "")
        for number, output in enumerate(cell.get("outputs", [])):
            if output.output_type == "stream":
                yield name, f"output {number} ({output.name})", output.text
            elif output.output_type == "error":
                yield name, f"output {number} (error)", f"{output.ename}: {output.evalue}"
            for kind, data in output.get("data", {}).items():
                if kind == "text/plain" and WIDGET_VIEW in output.get("data", {}):
                    continue  # a widget's repr, for a front end without widgets: code
                if kind == PLOTLY:
                    for where, text in _figure_texts(data):
                        yield name, f"output {number} (plotly {where})", text
                elif kind.startswith("text/"):
                    yield name, f"output {number} ({kind})", data
    state = notebook.metadata.get("widgets", {}).get(WIDGETS, {}).get("state", {})
    for model_id, model in state.items():
        for key in ("value", "description", "tooltip", "placeholder"):
            if isinstance(model["state"].get(key), str):
                yield "widgets", f"{model['model_name']} {model_id} ({key})", model["state"][key]
