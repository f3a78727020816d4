"""A class whose learners answer every TODO by reaching for what the checks know
(``tests/attacks.py``), graded with `grade-all`: every test of every hand-in scores zero, in
English and Chinese, and the instructor's summary names each hand-in. Every chapter's attacks
through `grade`: tests/test_grading.py and tests/test_zh_grading.py; the seal's routes one by
one: tests/test_seal.py.

Before the seal, the attacked notebooks of tests/test_grading.py scored 18/18 on chapter 1,
15/21 on chapter 2, 9/18 on chapter 10 and 3/9 on chapter 11 (CONTRIBUTING, "What a
learner's code cannot reach").
"""

from __future__ import annotations

import json

import pytest
from attacks import attacked, attacks_in, stopped_by_the_seal
from conftest import CHAPTERS, grade

pytestmark = pytest.mark.pipeline


# function TODOs, a stateful class, kernels, an engine, a connector: in each language
HANDED_IN = {"mallory": ("en", (1, 7, 9)), "mei": ("zh_CN", (3, 8, 11))}


def test_a_class_reaching_for_what_the_checks_know_scores_zero_through_grade_all(repo,
                                                                                 tmp_path):
    hand_ins, attacks = tmp_path / "hand_ins", {}
    for learner, (language, numbers) in HANDED_IN.items():
        sub = "" if language == "en" else language
        for number in numbers:
            chapter = CHAPTERS[number - 1]
            path = attacked(repo / "exercises" / sub / f"{chapter.name}.ipynb",
                            chapter.source_in(language),
                            hand_ins / learner / f"{chapter.name}.ipynb", first=number + 1)
            attacks[learner, chapter.name] = attacks_in(path)
    report = tmp_path / "class.json"
    done = grade("grade-all", hand_ins, "--course-dir", tmp_path / "class", "--json", report)
    assert done.returncode == 0, done.stderr
    results = json.loads(report.read_text())
    assert len(results) == len(attacks)
    stopped = {(r["learner"], r["chapter"]) for r in results
               if stopped_by_the_seal(r, attacks[r["learner"], r["chapter"]])}
    assert {learner for learner, _ in stopped} == set(HANDED_IN)
    warning = next(line for line in done.stderr.splitlines()
                   if "reached for what the checks know" in line)
    assert all(f"{learner} {chapter}" in warning for learner, chapter in stopped), warning
