"""The Chinese notebooks as a grader meets them: graded by the real nbgrader pipeline, each
solution gets full marks, its unfilled exercise zero with every hint and the report in
Chinese (every cell a learner is given to change edited, as they try things there); a
class's English and Chinese submissions of a chapter land in one gradebook.
"""

from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path

import pytest
from attacks import attacked, attacks_in, stopped_by_the_seal
from conftest import CHAPTERS, grade, graded_together, max_points, selected
from english import english_labels, english_sentences
from notebook_variants import given_cells_edited

from autograder.host.chapters import EXERCISES

ZH = "zh_CN"
CJK = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture(scope="module")
def every_chapter(request, tmp_path_factory):
    """Each chapter's Chinese solution (every cell a learner is given to change edited, as
    they try things there), unfilled exercise, and exercise whose every TODO reaches for what
    the checks know (``tests/attacks.py``, other kinds than the English one's), all graded by
    one `grade` command (the chapters this run selects): chapter name -> (the three results;
    what was printed for the solution)."""
    folder = tmp_path_factory.mktemp("chapters")
    three = {}
    for chapter in selected(request, "chapter"):
        solution = folder / chapter.name / f"{chapter.name}.ipynb"
        given_cells_edited(chapter.source_in(ZH), solution)
        exercise = EXERCISES / ZH / f"{chapter.name}.ipynb"
        three[chapter.name] = [solution, exercise, attacked(
            exercise, chapter.source_in(ZH), folder / "attacked" / f"{chapter.name}.ipynb",
            first=4 + 2 * CHAPTERS.index(chapter))]
    return graded_together(three, folder / "report.json")


@pytest.mark.pipeline
@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.name)
def test_a_chinese_solution_grades_full_marks_and_its_exercise_zero_in_chinese(chapter,
                                                                              every_chapter):
    (graded, unfilled, _), shown = every_chapter[chapter.name]
    full = max_points(chapter)
    assert (graded["chapter"], graded["language"]) == (chapter.name, ZH)
    assert (graded["score"], graded["max_score"]) == (full, full), [
        t["message"] for t in graded["tests"] if not t["passed"]]
    assert (unfilled["score"], unfilled["max_score"]) == (0, full)
    assert all("还没有实现" in t["message"] for t in unfilled["tests"]), [
        t["message"] for t in unfilled["tests"]]
    assert f"得分：{full:g} / {full:g}" in shown and "通过" in shown, shown
    assert english_sentences(shown) == english_labels(shown) == [], shown


@pytest.mark.pipeline
@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.name)
def test_every_todo_reaching_for_what_the_checks_know_scores_zero_in_chinese(chapter,
                                                                             every_chapter):
    attacker = every_chapter[chapter.name][0][2]
    stopped_by_the_seal(attacker, attacks_in(Path(attacker["notebook"])))
    assert all("本测试不计分" in t["message"] for t in attacker["tests"] if t["sealed"])


@pytest.mark.pipeline
def test_english_and_chinese_submissions_share_one_gradebook(tmp_path):
    chapter = CHAPTERS[0]
    class_dir = tmp_path / "class"
    for learner, notebook in [("ada", chapter.source), ("bo", chapter.source_in(ZH)),
                              ("cy", EXERCISES / ZH / f"{chapter.name}.ipynb"),
                              ("di", EXERCISES / f"{chapter.name}.ipynb")]:
        (class_dir / learner).mkdir(parents=True)
        shutil.copyfile(notebook, class_dir / learner / f"{chapter.name}.ipynb")
    database = tmp_path / "class.db"
    done = grade("grade-all", class_dir, "--db", f"sqlite:///{database}", "--csv", "scores.csv",
                 cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "scores.csv", newline="") as handle:
        rows = {row["student_id"]: row for row in csv.DictReader(handle)}
    full = max_points(chapter)
    assert {name: float(row["score"]) for name, row in rows.items()} == \
        {"ada": full, "bo": full, "cy": 0.0, "di": 0.0}

    def page(learner: str) -> str:
        return (tmp_path / "feedback" / learner / chapter.name / f"{chapter.name}.html"
                ).read_text(encoding="utf-8")

    assert "还没有实现" in page("cy") and "is not written yet" not in page("cy")
    assert "is not written yet" in page("di") and "还没有实现" not in page("di")
