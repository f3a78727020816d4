"""What a grade depends on besides the hand-in, so that ``grade-all`` grades again exactly the
hand-ins whose grade could change. No nbgrader here (``test_nbgrader_parity.py`` edits a
test and grades the class again)."""

from __future__ import annotations

import shutil

import pytest
from conftest import CHAPTERS, REPO

from autograder.host.freshness import checks_of, digest


def test_the_same_source_gives_the_same_key_and_an_edited_test_another(tmp_path):
    source = tmp_path / f"{CHAPTERS[0].name}.ipynb"
    shutil.copyfile(CHAPTERS[0].source, source)
    before = digest([source])
    assert digest([source]) == before
    text = source.read_text()
    source.write_text(text.replace("### BEGIN HIDDEN TESTS", "### BEGIN HIDDEN TESTS  # edited", 1))
    assert digest([source]) != before


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.name for c in CHAPTERS])
def test_a_chapters_grade_depends_on_its_own_checks_and_what_they_import(chapter):
    files = checks_of(chapter.name, chapter.source)
    package = REPO / "autograder"
    names = {str(path.relative_to(package)) for path in files if path.is_relative_to(package)}
    own = f"ch{chapter.number}.py"
    assert {f"checks/{own}", f"hidden/{own}", "guard.py", "arming.py"} <= names
    # another chapter's module only where another file of this chapter's imports it (chapter
    # 9's and 10's checks use chapter 7's audit)
    others = tuple(f"ch{c.number}" for c in CHAPTERS if c is not chapter)
    for path in files:
        if path.name.startswith(others):
            module = path.stem
            assert any(module in other.read_text() for other in files if other != path), path
