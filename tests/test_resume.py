"""What a grade depends on besides the hand-in, so that ``grade-all`` grades again exactly the
hand-ins whose grade could change. No nbgrader here (``test_nbgrader_parity.py`` edits a
test and grades the class again)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import CHAPTERS

from autograder.host.chapters import Chapter
from autograder.host.classroom import checks_of, graded_by
from autograder.host.submission import Submission


def _entry(source) -> Submission:
    entry = Submission("ada.ipynb", "ada", CHAPTERS[0].name, None)
    entry.target = Chapter(CHAPTERS[0].name, source)
    return entry


def test_the_same_source_gives_the_same_key_and_an_edited_test_another(tmp_path):
    source = tmp_path / f"{CHAPTERS[0].name}.ipynb"
    shutil.copyfile(CHAPTERS[0].source, source)
    before = graded_by(_entry(source))
    assert graded_by(_entry(source)) == before
    text = source.read_text()
    source.write_text(text.replace("### BEGIN HIDDEN TESTS", "### BEGIN HIDDEN TESTS  # edited", 1))
    assert graded_by(_entry(source)) != before


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.name for c in CHAPTERS])
def test_a_chapters_grade_depends_on_its_own_checks_and_the_shared_ones_only(chapter):
    package = Path(checks_of(chapter.number)[-1]).parent
    names = {str(path.relative_to(package)) for path in checks_of(chapter.number)}
    own = f"ch{chapter.number}.py"
    assert {f"checks/{own}", f"hidden/{own}", "checks/_helpers.py", "guard.py",
            "arming.py"} <= names
    others = {f"ch{c.number}" for c in CHAPTERS if c is not chapter}
    assert not any(name.split("/")[-1].startswith(tuple(others)) for name in names)
