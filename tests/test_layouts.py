"""Who handed in what: every layout a class's files arrive in maps to the exact learner ids.

No nbgrader here: these tests read folders and zips the way ``grade-all`` does.
"""

from __future__ import annotations

import datetime as dt
import zipfile
from pathlib import Path

import pytest
from conftest import CHAPTERS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autograder.host.layouts import (
    NotHandIns,
    collect,
    course_directory,
    doubtful_ids,
    split_name,
    unpack,
)
from autograder.host.submission import Submission

SLUGS = [c.name for c in CHAPTERS]
FIRST, SECOND = SLUGS[0], SLUGS[1]

# Learner ids as platforms and universities issue them: digits, underscores, dots, hyphens.
# A leading dot would hide a folder (checkpoints), so ids start with a letter or digit.
learner_ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,11}", fullmatch=True)


def _collected(folder: Path, *args, **kwargs) -> tuple[list[Submission], list[Submission]]:
    """What ``collect`` found under ``folder``: the submissions to grade, and those it
    refused (each with its reason as its result's error)."""
    found = collect(folder, *args, **kwargs)
    return [s for s in found if s.result is None], [s for s in found if s.result is not None]


def _nbgrader_exchange(root: Path, learner: str, chapter: str) -> Path:
    return root / "submitted" / learner / chapter / f"{chapter}.ipynb"


LAYOUTS = {
    "nbgrader-submitted": lambda root, learner, chapter: (
        root / learner / chapter / f"{chapter}.ipynb"),
    "nbgrader-course-directory": _nbgrader_exchange,
    "folder-per-learner": lambda root, learner, chapter: root / learner / f"{chapter}.ipynb",
    "flat-underscore": lambda root, learner, chapter: root / f"{learner}_{chapter}.ipynb",
    "flat-hyphen": lambda root, learner, chapter: root / f"{learner}-{chapter}.ipynb",
    "flat-in-a-top-folder": lambda root, learner, chapter: (
        root / "class-2026" / f"{learner}_{chapter}.ipynb"),
    "folders-in-a-top-folder": lambda root, learner, chapter: (
        root / "uploads" / learner / f"{chapter}.ipynb"),
}


def _write(path: Path, text: str = "{}") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _layout_folder(root: Path, layout: str, learners: list[str]) -> Path:
    for index, learner in enumerate(learners):
        _write(LAYOUTS[layout](root, learner, SLUGS[index % len(SLUGS)]))
    if layout == "nbgrader-course-directory":  # what nbgrader keeps beside submitted/
        for folder in ("source", "release", "autograded", "feedback"):
            _write(root / folder / FIRST / f"{FIRST}.ipynb")
        _write(root / "nbgrader_config.py", "c = get_config()\n")
    return root


@pytest.mark.parametrize("layout", LAYOUTS)
@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(learners=st.lists(learner_ids, min_size=1, max_size=6, unique=True))
def test_every_layout_yields_exactly_the_learners_it_holds(layout, learners, tmp_path_factory):
    root = _layout_folder(tmp_path_factory.mktemp(layout), layout, learners)
    found, problems = _collected(root, SLUGS)
    assert problems == []
    assert sorted((s.learner, s.chapter) for s in found) == sorted(
        (learner, SLUGS[i % len(SLUGS)]) for i, learner in enumerate(learners))


@settings(max_examples=15, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(learners=st.lists(learner_ids, min_size=1, max_size=5, unique=True),
       wrapped=st.booleans())
def test_a_zip_with_or_without_a_top_folder_yields_the_same_learners(learners, wrapped,
                                                                     tmp_path_factory):
    folder = tmp_path_factory.mktemp("zip")
    top = "export-2026-12-01/" if wrapped else ""
    with zipfile.ZipFile(folder / "uploads.zip", "w") as archive:
        for index, learner in enumerate(learners):
            name = (f"{top}{learner}_{FIRST}.ipynb" if index % 2
                    else f"{top}{learner}/{SECOND}.ipynb")
            archive.writestr(zipfile.ZipInfo(name, (2026, 11, 30, 23, 59, 58)), "{}")
    origins, times = unpack(folder / "uploads.zip", folder / "unpacked")
    found, problems = _collected(folder / "unpacked", SLUGS, lambda p: origins[p.resolve()],
                              lambda p: times[p.resolve()])
    assert problems == []
    assert sorted(s.learner for s in found) == sorted(learners)
    assert all(s.origin.startswith(f"uploads.zip:{top}") for s in found)
    assert {s.timestamp for s in found} == {dt.datetime(2026, 11, 30, 23, 59, 58)}


@pytest.mark.parametrize(("name", "expected"), [
    (f"s1234567_{FIRST}.ipynb", ("s1234567", FIRST)),
    (f"s1234589_{FIRST}.ipynb", ("s1234589", FIRST)),
    (f"20231234_{SECOND}.ipynb", ("20231234", SECOND)),
    (f"ada_lovelace_{FIRST}.ipynb", ("ada_lovelace", FIRST)),
    (f"ada.l-99_{FIRST}.ipynb", ("ada.l-99", FIRST)),
    (f"ada__{FIRST}.ipynb", ("ada_", FIRST)),
    (f"{FIRST}.ipynb", ("", FIRST)),
    (f"_{FIRST}.ipynb", None),
    (f"ada_{FIRST}_v2.ipynb", None),
    ("ada_notes.ipynb", None),
], ids=["numeric-1", "numeric-2", "all-digits", "underscores", "dots-and-hyphens",
        "trailing-underscore", "slug-alone", "separator-alone", "suffix-after-slug", "no-slug"])
def test_a_file_name_splits_at_a_known_chapter_slug(name, expected):
    assert split_name(name, SLUGS) == expected


def test_two_files_for_one_learner_and_chapter_are_both_reported_and_neither_graded(tmp_path):
    first = _write(tmp_path / "ada" / f"{FIRST}.ipynb")
    second = _write(tmp_path / f"ada_{FIRST}.ipynb")
    _write(tmp_path / "bo" / f"{FIRST}.ipynb")
    found, problems = _collected(tmp_path, SLUGS)
    assert [(s.learner, s.chapter) for s in found] == [("bo", FIRST)]
    assert len(problems) == 2 and {p.origin for p in problems} == {str(first), str(second)}
    assert all(str(first) in p.result.error and str(second) in p.result.error for p in problems)
    assert all((p.learner, p.chapter) == ("ada", FIRST) for p in problems)


def test_a_path_that_names_no_learner_or_no_chapter_is_a_problem(tmp_path):
    _write(tmp_path / f"{FIRST}.ipynb")
    _write(tmp_path / "ada" / "homework.ipynb")
    _write(tmp_path / ".ipynb_checkpoints" / f"ada_{FIRST}-checkpoint.ipynb")
    found, problems = _collected(tmp_path, SLUGS)
    assert found == []
    assert sorted(p.origin for p in problems) == sorted(
        [str(tmp_path / f"{FIRST}.ipynb"), str(tmp_path / "ada" / "homework.ipynb")])
    assert any("names its chapter but no learner" in p.result.error for p in problems)
    assert any("names no chapter" in p.result.error for p in problems)


def test_nbgrader_timestamps_are_read_and_the_course_directory_is_found(tmp_path):
    course = _layout_folder(tmp_path / "course", "nbgrader-course-directory", ["ada", "bo"])
    (course / "submitted" / "ada" / FIRST / "timestamp.txt").write_text(
        "2026-12-01 09:30:00.000000 UTC")
    assert course_directory(course) == course.resolve()
    assert course_directory(course / "submitted") == course.resolve()
    with pytest.raises(NotHandIns, match="source/, which holds no hand-ins"):
        course_directory(course / "source")
    found, problems = _collected(course / "submitted", SLUGS)
    assert problems == [] and [s.learner for s in found] == ["ada", "bo"]
    assert found[0].timestamp == dt.datetime(2026, 12, 1, 9, 30)
    assert found[1].timestamp is not None  # no timestamp.txt: the file's modification time


def test_the_chapters_own_notebook_wins_in_a_hand_in_folder_and_a_stray_one_is_ignored(
        tmp_path):
    course = _layout_folder(tmp_path / "course", "nbgrader-course-directory", ["ada"])
    stray = _write(course / "submitted" / "ada" / FIRST / "Untitled.ipynb")
    found, problems = _collected(course, SLUGS)
    assert [(s.learner, s.chapter, s.path.name) for s in found] == \
        [("ada", FIRST, f"{FIRST}.ipynb")]
    assert [(p.origin, p.ignored) for p in problems] == [(str(stray), True)]
    assert f"{FIRST}.ipynb" in problems[0].result.error


def test_a_hand_in_folder_without_a_notebook_is_a_problem_not_a_silence(tmp_path):
    course = _layout_folder(tmp_path / "course", "nbgrader-course-directory", ["ada"])
    empty = course / "submitted" / "bo" / FIRST
    _write(empty / "timestamp.txt", "2026-12-01 09:30:00.000000 UTC")
    found, problems = _collected(course, SLUGS)
    assert [s.learner for s in found] == ["ada"]
    assert [(p.learner, p.chapter, p.ignored) for p in problems] == [("bo", FIRST, False)]
    assert "no notebook" in problems[0].result.error and "timestamp.txt" in problems[0].result.error
    assert problems[0].timestamp == dt.datetime(2026, 12, 1, 9, 30)


@pytest.mark.parametrize(("name", "near"), [
    (f"erin_{FIRST}-1.ipynb", FIRST), (f"erin_{FIRST[:-1]}.ipynb", FIRST),
    ("erin_homework.ipynb", None)], ids=["a-second-upload", "a-typo", "nothing-near"])
def test_a_near_miss_name_names_its_near_match(name, near, tmp_path):
    _write(tmp_path / name)
    _, problems = _collected(tmp_path, SLUGS)
    assert len(problems) == 1
    if near:
        assert f"did you mean {near}?" in problems[0].result.error
        assert not any(slug in problems[0].result.error for slug in SLUGS if slug != near)
    else:
        assert "did you mean" not in problems[0].result.error


def test_canvas_downloads_name_one_learner_by_their_user_id_late_or_renamed(tmp_path):
    first = tmp_path / "download-1"
    _write(first / f"lovelaceada_4242_901_{FIRST}.ipynb")
    _write(first / f"hopperg_5150_902_{SECOND}.ipynb")
    later = tmp_path / "download-2"
    _write(later / f"lovelaceada_LATE_4242_977_{FIRST}-1.ipynb")
    assert {(s.learner, s.chapter) for s in _collected(first, SLUGS)[0]} == \
        {("4242", FIRST), ("5150", SECOND)}
    assert [(s.learner, s.chapter) for s in _collected(later, SLUGS)[0]] == [("4242", FIRST)]
    # a class's own flat name beside them, not of Canvas's form, is not reread, nor does it
    # make Canvas's names be read whole; it is named in a warning, with the Canvas id
    _write(first / f"S_1234_5678_{FIRST}.ipynb")
    learners = {s.learner for s in _collected(first, SLUGS)[0]}
    assert learners == {"4242", "5150", "S_1234_5678"}
    assert [line for line in doubtful_ids(learners) if "'S_1234_5678'" in line and
            "'1234'" in line] == doubtful_ids(learners) != []


def test_a_canvas_download_with_one_emailed_file_beside_it_is_read_file_by_file(tmp_path):
    _write(tmp_path / f"lianna_12345_678901_{FIRST}.ipynb")
    _write(tmp_path / f"hopperg_LATE_5150_902_{SECOND}-1.ipynb")
    _write(tmp_path / f"carol_{FIRST}.ipynb")
    found, problems = _collected(tmp_path, SLUGS)
    assert problems == []
    assert sorted((s.learner, s.chapter) for s in found) == \
        [("12345", FIRST), ("5150", SECOND), ("carol", FIRST)]
    assert doubtful_ids(s.learner for s in found) == []


def test_a_name_that_differs_only_by_unicode_normalisation_is_named_in_a_warning(tmp_path):
    import unicodedata

    composed, decomposed = (unicodedata.normalize(form, "José") for form in ("NFC", "NFD"))
    _write(tmp_path / composed / f"{FIRST}.ipynb")
    _write(tmp_path / f"{decomposed}_{SECOND}.ipynb")
    found, _ = _collected(tmp_path, SLUGS)
    assert {s.learner for s in found} == {composed, decomposed}  # read as written: warned
    warnings = doubtful_ids(s.learner for s in found)
    assert len(warnings) == 1 and "(NFC)" in warnings[0] and "(NFD)" in warnings[0]
    assert repr(composed) in warnings[0] and repr(decomposed) in warnings[0]
    # one already in the class (its submitted/ folder) and one of this run: warned too
    assert len(doubtful_ids([decomposed], known=[composed, "ada"])) == 1
    assert doubtful_ids(["ada", composed], known=["bo"]) == []


def test_every_file_that_is_not_a_notebook_gets_an_ignored_row_saying_why(tmp_path):
    course = _layout_folder(tmp_path / "course", "nbgrader-course-directory", ["ada"])
    hand_in = course / "submitted" / "ada" / FIRST
    for name in ("answers.txt", "timestamp.txt", "submission_secret.txt", ".DS_Store"):
        _write(hand_in / name)
    _write(course / "submitted" / "bo" / FIRST / "notes.pdf")  # no notebook: one problem
    found, problems = _collected(course, SLUGS)
    assert [(s.learner, s.chapter) for s in found] == [("ada", FIRST)]
    ignored = [p for p in problems if p.ignored]
    assert [(p.origin, p.learner, p.chapter) for p in ignored] == \
        [(str(hand_in / "answers.txt"), "ada", FIRST)]
    assert ignored[0].result.error == f"not a notebook: nbgrader grades only {FIRST}.ipynb"
    assert [p.learner for p in problems if not p.ignored] == ["bo"]
    assert "notes.pdf" in next(p for p in problems if not p.ignored).result.error
    download = _write(tmp_path / "download" / "lianna_12345_678901_answers.py").parent
    _write(download / f"lianna_12345_678901_{FIRST}.ipynb")
    found, problems = _collected(download, SLUGS)
    assert [s.learner for s in found] == ["12345"]
    assert [(p.ignored, p.result.error) for p in problems] == \
        [(True, "not a notebook: nbgrader grades only NN_slug.ipynb")]


def test_a_folder_inside_a_course_directory_is_read_as_what_it_is_there(tmp_path):
    course = _layout_folder(tmp_path / "course", "nbgrader-course-directory", ["ada", "bo"])
    _write(course / "submitted" / "ada" / SECOND / f"{SECOND}.ipynb")
    submitted = course / "submitted"
    assert course_directory(submitted / "ada") == course_directory(
        submitted / "ada" / FIRST) == course.resolve()
    assert sorted((s.learner, s.chapter) for s in _collected(submitted / "ada", SLUGS)[0]) \
        == [("ada", FIRST), ("ada", SECOND)]
    assert [(s.learner, s.chapter) for s in _collected(submitted / "ada" / SECOND, SLUGS)[0]] \
        == [("ada", SECOND)]
    for folder in ("source", f"source/{FIRST}", "autograded", "feedback", "release"):
        with pytest.raises(NotHandIns, match="holds no hand-ins"):
            collect(course / folder, SLUGS)
    with pytest.raises(NotHandIns, match="inside a hand-in"):
        course_directory(_write(submitted / "ada" / FIRST / "deeper" / "x.txt").parent)
    # a folder of downloads kept in the course directory is just that
    downloads = _write(course / "downloads" / f"carol_{FIRST}.ipynb").parent
    assert course_directory(downloads) is None
    assert [s.learner for s in _collected(downloads, SLUGS)[0]] == ["carol"]


def test_a_learner_named_like_a_chapter_is_refused_never_graded(tmp_path):
    course = _layout_folder(tmp_path / "course", "nbgrader-course-directory", ["ada"])
    misfiled = _write(course / "submitted" / FIRST / FIRST / f"{FIRST}.ipynb")
    found, problems = _collected(course, SLUGS)
    assert [s.learner for s in found] == ["ada"]
    assert [(p.origin, p.learner) for p in problems] == [(str(misfiled), "")]
    assert "is a chapter's name" in problems[0].result.error
    _write(tmp_path / "loose" / FIRST / f"{SECOND}.ipynb")  # a folder per learner, misnamed
    found, problems = _collected(tmp_path / "loose", SLUGS)
    assert found == [] and "is a chapter's name" in problems[0].result.error


def test_a_moodle_download_names_the_learner_by_their_participant_id(tmp_path):
    _write(tmp_path / "Ada Lovelace_55555_assignsubmission_file_" / f"{FIRST}.ipynb")
    _write(tmp_path / "Grace Hopper_55556_assignsubmission_file_" / f"{FIRST}-1.ipynb")
    found, problems = _collected(tmp_path, SLUGS)
    assert problems == []
    assert [(s.learner, s.chapter) for s in found] == [("55555", FIRST), ("55556", FIRST)]


@pytest.mark.parametrize("columns", [("platform_id", "student_id"), ("ID", "SIS Login ID")],
                         ids=["course-roster", "canvas-gradebook-export"])
def test_a_roster_maps_ids_and_a_file_off_it_is_never_a_new_learner(columns, tmp_path):
    from autograder.host.layouts import read_roster

    roster = tmp_path / "roster.csv"
    roster.write_text(f"Student,{columns[0]},{columns[1]}\nAda,4242,ada.l\n")
    uploads = tmp_path / "uploads"
    _write(uploads / f"lovelaceada_4242_901_{FIRST}.ipynb")
    _write(uploads / f"hopperg_5150_902_{FIRST}.ipynb")
    found, problems = _collected(uploads, SLUGS, roster=read_roster(roster))
    assert [(s.learner, s.chapter) for s in found] == [("ada.l", FIRST)]
    assert len(problems) == 1 and "'5150' is not on the class's roster" in problems[0].result.error
    assert problems[0].learner == ""


def test_a_roster_without_the_columns_it_needs_says_which(tmp_path):
    from autograder.host.layouts import read_roster

    roster = tmp_path / "roster.csv"
    roster.write_text("name,email\nAda,a@x\n")
    with pytest.raises(ValueError, match="platform_id and student_id"):
        read_roster(roster)
