"""Each answer written once: the measure (``autograder.builder.copies``) finds an answer's code
wherever it stands outside its own region; the course holds none outside the answer regions,
and inside them only the ones ``tests/known_copies.py`` names (a later TODO that writes an
earlier one's code again)."""

from __future__ import annotations

import textwrap

import pytest
from known_copies import SHARED

from autograder.answers import BEGIN, END, definition
from autograder.builder.copies import (
    Copy,
    answer_lines,
    copies_in,
    copies_in_answers,
    copies_in_library,
    normalised,
    split_regions,
)

ANSWER = ("course.v0.block_manager", "BlockManager.allocate")


def _region(module: str, qualname: str) -> str:
    regions, _ = split_regions(definition(module, qualname))
    return "\n".join(regions)


def test_the_course_holds_no_copy_of_an_answer_outside_the_answers():
    found = {(copy.answer, copy.place) for copy in copies_in_library()}
    assert found == set(), "answers written again outside their regions"


def test_the_answers_write_no_other_chapters_answer_but_the_known_ones():
    found = {(copy.answer, copy.place) for copy in copies_in_answers()}
    assert found - SHARED == set(), "an answer region writes another chapter's answer again"
    assert SHARED - found == set(), "copies gone: take them out of SHARED"


def test_most_answers_are_long_enough_to_measure():
    assert len(answer_lines()) >= 40


def test_a_pasted_answer_is_found_however_it_is_indented_or_commented():
    lines = _region(*ANSWER).splitlines()
    pasted = "\n".join("        " + line.strip() + "  # mine" for line in lines)
    found = copies_in("paste.py", f"def mine():\n{pasted}\n")
    assert [copy.answer for copy in found] == [".".join(ANSWER)]
    assert found[0].found == found[0].lines == len(answer_lines()[ANSWER])


def test_half_of_an_answer_is_a_copy_and_less_is_not():
    lines = list(answer_lines()[ANSWER])
    half = (len(lines) + 1) // 2
    assert copies_in("half.py", "\n".join(lines[:half]))
    assert not copies_in("less.py", "\n".join(lines[:half - 1]))


def test_an_answer_inside_an_answer_region_is_not_a_copy_unless_an_edition_ships_it():
    text = textwrap.indent(f"{BEGIN}\n{_region(*ANSWER)}\n{END}", "    ")
    assert copies_in("region.py", f"def mine():\n{text}\n") == []
    assert copies_in("region.py", f"def mine():\n{text}\n", regions=True)


def test_short_lines_and_comments_do_not_count():
    assert normalised("x = 1\n# a long comment that says nothing at all\n") == []
    assert normalised("value = compute(a,   b)  # why\n") == ["value = compute(a, b)"]


@pytest.mark.parametrize("copy", [Copy("m.f", 3, "p.py", 4, 8)], ids=["message"])
def test_a_copy_says_what_and_where(copy):
    assert str(copy) == "chapter 3's m.f in p.py (4 of its 8 lines)"
