"""One bug costs one TODO in chapter 14. Its function TODOs: ``request_block_hashes`` calls
``hash_block_tokens``: its hidden check lends the course's hash where the learner's fails it,
and its visible check sends the learner to fix the hash first; ``choose_engine`` takes plain
dicts and calls no TODO. Its class TODOs, ``KVIndexer.apply_batch`` and ``overlap_blocks``,
are checked apart: the batches' checks never look up the lookup, and the lookup's checks ask
an index restored from a snapshot (the class's given ``restore``), never the batches' method,
so a wrong method costs its own TODO alone, in the notebook's order too (the lookup not yet
written when the batches' hidden test runs)."""

from __future__ import annotations

import types

import pytest
from mutants.ch14 import MUTANTS
from one_wrong_todo import FunctionTodos, looked_up, reaches, unwritten

from autograder.checks import ch14 as visible
from autograder.checks._lending import with_globals
from autograder.hidden import ch14 as hidden
from course.v1 import block_hash, kv_router
from course.v1.kv_indexer import KVIndexer

FUNCTIONS = {"hash_block_tokens": block_hash, "request_block_hashes": block_hash,
             "choose_engine": kv_router}
METHODS = ("apply_batch", "overlap_blocks")

_reference = types.ModuleType("chapter_14_functions")
for _name, _module in FUNCTIONS.items():
    setattr(_reference, _name, getattr(_module, _name))
TODOS = FunctionTodos(_reference, {name: MUTANTS[name] for name in FUNCTIONS}, visible, hidden,
                      "14")
_WRONG = {m.__name__: m for found in MUTANTS.values() for m, _ in found}


def test_only_request_block_hashes_builds_on_another_todo():
    assert set(MUTANTS) == {*FUNCTIONS, *METHODS}
    assert TODOS.building_on_others() == {"hash_block_tokens": ["request_block_hashes"]}


# What a wrong hash cannot show through the course's request_block_hashes: it hands the hash a
# list of Python ints, and the chain's one pair of extra keys (a LoRA name, then a salt) is
# already in sorted order.
_UNSEEN_BY_THE_CHAIN = {"_numpy_ints_kept", "_extra_keys_sorted"}
_SENT_FIRST = [pytest.param(m, id=m.__name__.strip("_"))
               for m, _ in MUTANTS["hash_block_tokens"] if m.__name__ not in _UNSEEN_BY_THE_CHAIN]


@pytest.mark.parametrize("wrong", _SENT_FIRST)
def test_a_right_request_block_hashes_beside_a_wrong_hash_is_sent_to_fix_that_first(wrong):
    """Its visible test says to fix hash_block_tokens, in both languages; its hidden test
    passes (the course's hash lent)."""
    TODOS.sent_to_fix_first("request_block_hashes", "hash_block_tokens", wrong,
                            "fix hash_block_tokens first")


def test_a_right_request_block_hashes_beside_an_unwritten_hash_is_sent_to_write_it_first():
    """An unwritten hash_block_tokens is not an unwritten request_block_hashes: the learner
    is sent to the hash, and the hidden test passes with the course's hash lent."""
    TODOS.sent_to_fix_first("request_block_hashes", "hash_block_tokens", unwritten,
                            "hash_block_tokens first")


@pytest.mark.one_wrong_todo
@pytest.mark.parametrize(("todo", "mutant"), TODOS.one_wrong_cases())
def test_one_wrong_function_costs_that_todo_alone(todo, mutant):
    TODOS.costs_that_todo_alone(todo, mutant)


def test_without_the_lending_a_wrong_hash_reaches_request_block_hashes():
    """Else the lending above would be proved on mutants whose bug never reaches the chain's
    cases: every wrong hash but those the chain cannot show fails the visible chain cases of
    the course's request_block_hashes, which lend nothing."""
    reached = []
    for mutant, _ in MUTANTS["hash_block_tokens"]:
        chain = with_globals(block_hash.request_block_hashes, {"hash_block_tokens": mutant})
        try:
            visible.check_request_block_hashes(chain)
        except AssertionError:
            reached.append(mutant.__name__)
    assert set(reached) == {m.__name__ for m, _ in MUTANTS["hash_block_tokens"]
                            } - _UNSEEN_BY_THE_CHAIN, reached


# --- the index's two methods ------------------------------------------------------------------

_HIDDEN_OF = {todo: getattr(hidden, f"check_{todo}_thoroughly") for todo in METHODS}
_VISIBLE_OF = {todo: getattr(visible, f"check_{todo}") for todo in METHODS}


def _lookups(once_per_run) -> dict[str, set[str]]:
    """``"hidden-apply_batch"`` and the like -> the KVIndexer methods that check looks up on the
    course's class."""
    return {key: set(names) for key, names in once_per_run("ch14-method-lookups", lambda: {
        f"{kind}-{todo}": sorted(looked_up(checks[todo], KVIndexer))
        for kind, checks in (("hidden", _HIDDEN_OF), ("visible", _VISIBLE_OF))
        for todo in METHODS}).items()}


def test_neither_methods_checks_look_up_the_other_method(once_per_run):
    """What the sweep below relies on to skip every check: the batches' checks never look up
    overlap_blocks, the lookup's never apply_batch (its index is restored from a snapshot);
    and, run anyway on a mutant of the other method, each hidden check passes."""
    looked = _lookups(once_per_run)
    for todo in METHODS:
        (other,) = set(METHODS) - {todo}
        for kind in ("hidden", "visible"):
            assert todo in looked[f"{kind}-{todo}"], (kind, todo)
            assert other not in looked[f"{kind}-{todo}"], (kind, todo)
    assert "restore" in looked["visible-overlap_blocks"]
    assert not reaches(looked["hidden-overlap_blocks"], _WRONG["AppliesPastAGap"], KVIndexer)
    hidden.check_overlap_blocks_thoroughly(_WRONG["AppliesPastAGap"])
    assert not reaches(looked["hidden-apply_batch"], _WRONG["CountsEveryBlockHeld"], KVIndexer)
    hidden.check_apply_batch_thoroughly(_WRONG["CountsEveryBlockHeld"])


_ONE_WRONG_METHOD = [(todo, mutant) for todo in METHODS for mutant, _ in MUTANTS[todo]]


@pytest.mark.one_wrong_todo
@pytest.mark.parametrize(("todo", "mutant"), _ONE_WRONG_METHOD,
                         ids=[f"{todo}-{m.__name__}" for todo, m in _ONE_WRONG_METHOD])
def test_one_wrong_method_costs_that_todo_alone(todo, mutant, once_per_run):
    """A KVIndexer right but for one method: the other method's tests pass. A test that never
    looks up what the mutant changes runs on it as on the course's class, which passes it
    (``one_wrong_todo.reaches``): it is not run again."""
    assert set(vars(mutant)) - {"__module__", "__doc__", "__qualname__"} == {todo}
    looked = _lookups(once_per_run)
    for kind, checks in (("hidden", _HIDDEN_OF), ("visible", _VISIBLE_OF)):
        for other in METHODS:
            if other != todo and reaches(looked[f"{kind}-{other}"], mutant, KVIndexer):
                checks[other](mutant)


class _ApplyBatchUnwritten(KVIndexer):
    def apply_batch(self, engine, seq, batch):
        raise NotImplementedError()


class _OverlapUnwritten(KVIndexer):
    def overlap_blocks(self, block_hashes):
        raise NotImplementedError()


def test_an_unwritten_method_costs_the_other_nothing():
    """Run anyway, not skipped: a learner who writes one method and not the other keeps the
    one's visible point (its hidden test never looks up the other method, as above)."""
    visible.check_overlap_blocks(_ApplyBatchUnwritten)
    visible.check_apply_batch(_OverlapUnwritten)
    with pytest.raises(AssertionError, match="not written"):
        visible.check_apply_batch(_ApplyBatchUnwritten)
    with pytest.raises(AssertionError, match="not written"):
        visible.check_overlap_blocks(_OverlapUnwritten)


def _answer_cells() -> dict[str, str]:
    """The solution notebook's cells by grade id."""
    import nbformat

    from autograder.host.chapters import chapters

    source = nbformat.read(chapters()["14_fleet_of_engines"].source, as_version=4)
    return {c.metadata.get("nbgrader", {}).get("grade_id"): c.source for c in source.cells}


def test_the_methods_hidden_tests_in_notebook_order_keep_every_point():
    """The class as the notebook holds it when each test runs: no overlap_blocks at all when
    apply_batch's tests run (the skeleton has neither method), then both."""
    cells = _answer_cells()
    notebook: dict = {}
    exec("from collections.abc import Sequence\n"
         "from course.v1.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, "
         "KVEventBatch\n", notebook)
    exec(cells["skeleton"], notebook)
    learners = notebook["KVIndexer"]
    assert not hasattr(learners, "apply_batch") and not hasattr(learners, "overlap_blocks")
    exec(cells["apply_batch"], notebook)
    assert not hasattr(learners, "overlap_blocks")
    visible.check_apply_batch(learners)
    hidden.check_apply_batch_thoroughly(learners)
    exec(cells["overlap_blocks"], notebook)
    visible.check_overlap_blocks(learners)
    hidden.check_overlap_blocks_thoroughly(learners)
