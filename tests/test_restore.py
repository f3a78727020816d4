"""A tampered or damaged submission is rebuilt around its chapter's own cells: the learner's
answers and extra cells are kept, the cells that grade it are the released ones."""

from __future__ import annotations

import copy

import nbformat
import pytest
from conftest import CHAPTERS

from autograder.builder import synthetic
from autograder.host.autograde import NOT_RUN, without_demonstrations
from autograder.host.chapters import EXERCISES
from autograder.host.restore import Unmatched, rebuild

FIRST, THIRD = CHAPTERS[0], CHAPTERS[2]


def released(chapter) -> nbformat.NotebookNode:
    return nbformat.read(EXERCISES / f"{chapter.name}.ipynb", as_version=4)


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _locked_or_graded(notebook) -> list:
    return [c for c in notebook.cells if _meta(c).get("locked") or _meta(c).get("grade")]


def _answers(notebook) -> dict[str, str]:
    return {_meta(c)["grade_id"]: c.source for c in notebook.cells
            if _meta(c).get("solution") and not _meta(c).get("locked")}


def _assert_graded_cells_are_released(rebuilt, chapter) -> None:
    expected = _locked_or_graded(released(chapter))
    got = _locked_or_graded(rebuilt)
    assert [(c.id, c.source, _meta(c)) for c in got] == \
        [(c.id, c.source, _meta(c)) for c in expected]


@pytest.fixture(params=[FIRST, THIRD], ids=lambda c: c.name)
def chapter(request):
    return request.param


def test_test_cells_marked_ungraded_and_unlocked_are_restored(chapter):
    learner = synthetic.solved(chapter)
    for cell in learner.cells:
        if _meta(cell).get("grade"):
            cell.metadata["nbgrader"].update(grade=False, locked=False, points=0)
            cell.source = "pass"
    rebuilt = rebuild(learner, released(chapter))
    _assert_graded_cells_are_released(rebuilt.notebook, chapter)
    assert _answers(rebuilt.notebook) == _answers(synthetic.solved(chapter))
    assert rebuilt.unanswered == [] and rebuilt.restored == []


def test_cells_moved_deleted_and_given_new_ids_come_back_in_released_order(chapter):
    learner = synthetic.solved(chapter)
    tests = [c for c in learner.cells if _meta(c).get("grade")]
    learner.cells = [c for c in learner.cells if c not in tests] + tests[1:]  # first deleted
    for number, cell in enumerate(learner.cells):
        cell["id"] = f"renumbered-{number}"
    helper = nbformat.v4.new_code_cell("def my_helper():\n    return 1\n")
    first_answer = next(i for i, c in enumerate(learner.cells) if _meta(c).get("solution")
                        and not _meta(c).get("locked"))
    learner.cells.insert(first_answer + 1, helper)
    rebuilt = rebuild(learner, released(chapter))
    _assert_graded_cells_are_released(rebuilt.notebook, chapter)
    assert rebuilt.restored == [_meta(tests[0])["grade_id"]]
    sources = [c.source for c in rebuilt.notebook.cells]
    first_id = next(iter(_answers(rebuilt.notebook)))
    answer_at = next(i for i, c in enumerate(rebuilt.notebook.cells)
                     if _meta(c).get("grade_id") == first_id)
    assert sources[answer_at + 1] == helper.source  # kept right after the answer it followed
    assert len({c.id for c in rebuilt.notebook.cells}) == len(rebuilt.notebook.cells)


def test_answers_are_found_by_cell_id_and_then_by_what_they_define(chapter):
    by_id = synthetic.solved(chapter)
    for cell in by_id.cells:
        cell.metadata.pop("nbgrader", None)
    assert _answers(rebuild(by_id, released(chapter)).notebook) == _answers(
        synthetic.solved(chapter))

    by_name = copy.deepcopy(by_id)
    for number, cell in enumerate(by_name.cells):
        cell["id"] = f"lost-{number}"
    rebuilt = rebuild(by_name, released(chapter))
    assert _answers(rebuilt.notebook) == _answers(synthetic.solved(chapter))
    _assert_graded_cells_are_released(rebuilt.notebook, chapter)


def test_a_second_copy_of_an_answer_is_kept_as_plain_code_after_the_first():
    learner = synthetic.solved(FIRST)
    answer = next(c for c in learner.cells if _meta(c).get("solution"))
    learner.cells.insert(learner.cells.index(answer) + 1, copy.deepcopy(answer))
    cells = rebuild(learner, released(FIRST)).notebook.cells
    at = next(i for i, c in enumerate(cells) if _meta(c).get("grade_id") == _meta(answer)
              ["grade_id"])
    assert cells[at + 1].source == answer.source and "nbgrader" not in cells[at + 1].metadata


def test_a_notebook_with_nothing_to_match_is_not_graded():
    stranger = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"),
                                               nbformat.v4.new_markdown_cell("notes")])
    with pytest.raises(Unmatched, match="could be matched"):
        rebuild(stranger, released(FIRST))


def test_a_deleted_answer_cell_leaves_its_stub_and_outputs_are_dropped():
    learner = synthetic.solved(FIRST)
    deleted = [c for c in learner.cells if _meta(c).get("solution")][-1]
    learner.cells.remove(deleted)
    for cell in learner.cells:
        if cell.cell_type == "code":
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="passes\n")]
    rebuilt = rebuild(learner, released(FIRST))
    assert rebuilt.unanswered == [_meta(deleted)["grade_id"]]
    assert _answers(rebuilt.notebook)[_meta(deleted)["grade_id"]] == \
        _answers(released(FIRST))[_meta(deleted)["grade_id"]]
    assert all(c.outputs == [] for c in rebuilt.notebook.cells if c.cell_type == "code")


def test_only_the_released_demonstrations_are_left_out_of_a_graded_run():
    released = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("serve(workload)", metadata={"tags": ["demo"]}),
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_code_cell("animate(pool)", metadata={"tags": ["demo"]})])
    learner = copy.deepcopy(released)
    learner.cells[2].source = "animate(pool)\nprint('mine')"  # edited: the learner's own now
    learner.cells.append(nbformat.v4.new_code_cell("serve(workload)"))  # a copy, untagged
    graded = without_demonstrations(learner, released)
    assert [c.source for c in graded.cells] == [
        NOT_RUN, "x = 1", "animate(pool)\nprint('mine')", NOT_RUN]
    assert learner.cells[0].source == "serve(workload)"  # the submission itself is untouched
