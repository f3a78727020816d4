"""English prose in what a learner reads: how tests/test_zh_notebooks.py tells that a Chinese
notebook's outputs speak Chinese.

An English word is letters alone, with an apostrophe or a hyphen between them ("course's",
"copy-on-write"), and not CamelCase ("BlockManager"): a token holding ``_ . ( )``, a digit, a
slash, a Chinese character, or letters in CamelCase is a name, a number or code, not a word.
A sentence is a run of ``SENTENCE`` English words or more with only spaces and punctuation
between them (a line break too: a sentence may wrap). Code in backticks, a format's holes
(``{n}``, ``%{y:.2f}``: braces with no space inside) and a page's scripts and styles are code,
and end a sentence; HTML tags are markup, and do not.
"""

from __future__ import annotations

import html
import re

SENTENCE = 4  # English words in a row that make a sentence

_CODE = re.compile(r"``.*?``|`[^`\n]*`|%\{[^{}]*\}|\{[^{}\s]*\}|<(script|style)\b.*?</\1>",
                   re.S)
_TAG = re.compile(r"<[^<>]*>")
_WORD = re.compile(r"[A-Za-z]+(?:['’-][A-Za-z]+)*")
_CAMEL = re.compile(r"[a-z][A-Z]")
_PUNCTUATION = "\"'“”‘’()[]{}<>,.;:!?…*|/=+-–—~#&"  # around a word, or a token of its own


def english_sentences(text: str) -> list[str]:
    """Each English sentence in ``text``, its words joined by single spaces."""
    found, run = [], []
    for token in html.unescape(_TAG.sub(" ", _CODE.sub(" `` ", text))).split():
        word = token.strip(_PUNCTUATION)
        if _WORD.fullmatch(word) and not _CAMEL.search(word):
            run.append(word)
        elif word or token == "``":  # a name, a number, code, Chinese: the sentence ends
            found += [" ".join(run)] if len(run) >= SENTENCE else []
            run = []
    return found + ([" ".join(run)] if len(run) >= SENTENCE else [])
