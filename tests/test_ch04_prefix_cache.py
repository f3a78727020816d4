"""Chapter 4's workloads, serving loop, tree picture and key counterexample: on the course's own
manager, and on a learner's class where the notebook runs the learner's."""

from __future__ import annotations

import re

import pytest
from alternatives.ch04 import ALTERNATIVES
from mutants.ch04 import MUTANTS, UNSEEN_BY_THE_PROBE
from one_wrong_todo import looked_up, reaches

from course.experiments import prefix_sim
from course.notebook import NotReady, learner_or_course_class, needs
from course.notebook.prefix_tree import prefix_tree_player, record_tree
from course.v0.prefix_cache import PrefixCachingBlockManager, block_key, prefix_keys


def test_three_requests_with_a_500_token_system_prompt():
    user = 225
    three = prefix_sim.chat(3, system_prompt=500, mean_user=user, seed=7, sigma=0)
    exact = prefix_sim.serve(three, 1, 4096, max_running=1)
    assert exact.hit_tokens == 2 * 500 and exact.prompt_tokens == 3 * (500 + user)
    assert exact.hit_rate == pytest.approx(0.46, abs=0.005)
    blocks = prefix_sim.serve(three, 16, 4096, max_running=1)
    assert blocks.hit_tokens == 2 * 496  # 31 full blocks of the 500-token prompt


def test_a_shared_prefix_shorter_than_a_block_never_hits():
    mix = prefix_sim.chat(20, system_prompt=12, mean_user=30, mean_output=10, seed=3)
    assert prefix_sim.serve(mix, 16, 4096).hit_tokens == 0
    assert prefix_sim.serve(mix, 4, 16384).hit_tokens > 0


def test_multi_turn_saves_prefill_but_not_memory():
    report = prefix_sim.serve(prefix_sim.multi_turn(6), 16, 2048)
    assert report.hit_rate > 0.5
    assert report.memory_saved == pytest.approx(0)


def test_concurrent_shared_prefixes_save_memory():
    report = prefix_sim.serve(prefix_sim.chat(30), 16, 2048)
    assert report.memory_saved > 0.3 and report.hit_rate > 0.5


def test_hashing_a_block_alone_confuses_prefixes_that_chaining_tells_apart():
    a, b = [11, 12, 13, 14, 50, 51, 52, 53], [21, 22, 23, 24, 50, 51, 52, 53]
    assert block_key("root", a[4:]) == block_key("root", b[4:])
    assert prefix_keys(a, 4)[1] != prefix_keys(b, 4)[1]


def test_the_tree_player_shows_shared_and_evictable_blocks():
    requests = prefix_sim.chat(4, system_prompt=20, mean_user=6, mean_output=5, seed=1)
    script = [("arrive", 0), ("arrive", 1), ("leave", 0), ("arrive", 2), ("leave", 1),
              ("arrive", 3), ("leave", 2), ("leave", 3)]
    frames = record_tree(PrefixCachingBlockManager(14, 4), requests, script)
    assert len(frames) == len(script) + 1
    assert max(frame.refs[b] for frame in frames for b in frame.refs) >= 2  # shared prefix
    assert frames[-1].evictable and all(r == 0 for r in frames[-1].refs.values())
    widget = prefix_tree_player(frames)
    slider, view = widget.children[0].children[3], widget.children[1]
    slider.value = 3
    root = re.search(r'<div class="kv-prefix-tree"([^>]*)>', view.value).group(1)
    assert 'data-step="3"' in root and f'data-evictable="{len(frames[3].evictable)}"' in root


class _Unfinished(PrefixCachingBlockManager):
    def append_slot(self, seq_id, token):
        raise NotImplementedError()


def test_the_probe_tells_correct_managers_from_wrong_ones():
    expected = prefix_sim.probe(PrefixCachingBlockManager)
    assert all(prefix_sim.probe(cls) == expected for cls in ALTERNATIVES)
    for wrong in [m for found in MUTANTS.values() for m, _ in found
                  if isinstance(m, type) and m not in UNSEEN_BY_THE_PROBE]:
        try:
            assert prefix_sim.probe(wrong) != expected, wrong.__name__
        except (KeyError, ValueError):  # learner_or_course_class falls back on a raise too
            pass


def test_the_notebook_serves_through_a_correct_class_and_stands_in_for_an_unfinished_one(
        capsys):
    mine = ALTERNATIVES[0]
    assert learner_or_course_class(mine, PrefixCachingBlockManager, prefix_sim.probe) is mine
    assert "Using your PrefixCachingBlockManager." in capsys.readouterr().out
    assert learner_or_course_class(_Unfinished, PrefixCachingBlockManager,
                                   prefix_sim.probe) is PrefixCachingBlockManager
    assert "the course's own version" in capsys.readouterr().out
    with pytest.raises(NotReady, match="Finish"):
        needs(learner_or_course_class(_Unfinished, _Unfinished, prefix_sim.probe))
    mix = prefix_sim.chat(20, system_prompt=40, mean_user=30, mean_output=10, seed=3)
    assert prefix_sim.serve(mix, 8, 400, manager_class=mine) == prefix_sim.serve(mix, 8, 400)


def _mutant(name: str):
    return next(m for found in MUTANTS.values() for m, _ in found if m.__name__ == name)


def test_the_note_blames_an_earlier_todo_only_where_it_is_due():
    """_take_block wrong (an evicted block keeps its key) and allocate wrong (its hits cover the
    last token): test_allocate's scenario fails on the hits before any block is evicted, and
    still fails with the course's _take_block lent, so the learner reads that failure and its
    idea, with no note sending them to _take_block. With allocate right, the same _take_block
    is what breaks the scenario's evictions: then the note is due."""
    from autograder.checks import ch04

    keeps_key = _mutant("EvictedKeepsKey")
    both = type("Both", (_mutant("HitsLastToken"),), {"_take_block": keeps_key._take_block})
    with pytest.raises(AssertionError) as failed:
        ch04.check_allocate(both)
    assert "fix _take_block first" not in str(failed.value)
    assert "the last token is always computed" in str(failed.value)
    with pytest.raises(AssertionError, match="fix _take_block first"):
        ch04.check_allocate(keeps_key)


def test_a_wrong_method_still_fails_with_the_courses_take_block_lent():
    from autograder.hidden import ch04 as hidden

    class Learners(PrefixCachingBlockManager):
        def free(self, seq_id: int) -> None:
            self.tables.pop(seq_id)  # drops the table, returns no block

    with pytest.raises(AssertionError):
        hidden.check_free_thoroughly(Learners)


def _answer_cells() -> dict[str, str]:
    """The solution notebook's cells by grade id."""
    import nbformat

    from autograder.host.chapters import chapters

    source = nbformat.read(chapters()["04_prefix_caching"].source, as_version=4)
    return {c.metadata.get("nbgrader", {}).get("grade_id"): c.source for c in source.cells}


def _namespace() -> dict:
    """A notebook's namespace before its first answer cell: what the cell above it imports."""
    notebook: dict = {}
    exec("import hashlib\nimport json\nfrom course.v0.prefix_cache import ROOT_KEY\n", notebook)
    return notebook


_ANSWER_CELLS = ("block_key", "prefix_keys", "skeleton", "take_block", "allocate",
                 "append_slot", "free")
_FUNCTIONS = ("block_key", "prefix_keys")


def _learners(todo: str, mutant) -> dict:
    """What each hidden test is given in a notebook right but for ``todo``: a wrong method is
    the course's class with that method changed; a wrong function stands in the notebook in
    place of the course's, where the notebook's other answers find it by name."""
    if todo not in _FUNCTIONS:  # the functions' tests never see the class
        return {other: mutant for other in MUTANTS if other not in _FUNCTIONS}
    cells, notebook = _answer_cells(), _namespace()
    for step in _ANSWER_CELLS:
        exec(cells[step], notebook)
    notebook[todo] = mutant
    return {other: notebook[other] if other in _FUNCTIONS
            else notebook["PrefixCachingBlockManager"] for other in MUTANTS}


_ONE_WRONG_TODO = [(todo, mutant) for todo, found in MUTANTS.items() for mutant, _ in found]


@pytest.mark.one_wrong_todo
@pytest.mark.parametrize(("todo", "mutant"), _ONE_WRONG_TODO,
                         ids=[f"{todo}-{m.__name__.strip('_')}" for todo, m in _ONE_WRONG_TODO])
def test_one_wrong_todo_costs_that_todo_alone(todo, mutant, once_per_run):
    """A notebook right but for one TODO: every other TODO's hidden test passes (what they
    build on lent from the course where the learner's fails them). A method's hidden test
    that never looks up what a wrong method changes runs on it as on the course's class,
    which passes it (``one_wrong_todo.reaches``): it is not run again."""
    from autograder.hidden import ch04 as hidden

    looked = once_per_run("ch04-hidden-lookups", lambda: {
        other: sorted(looked_up(getattr(hidden, f"check_{other}_thoroughly"),
                                PrefixCachingBlockManager))
        for other in MUTANTS if other not in _FUNCTIONS})
    for other, subject in _learners(todo, mutant).items():
        if other != todo and (subject is not mutant or reaches(
                set(looked[other]), mutant, PrefixCachingBlockManager)):
            getattr(hidden, f"check_{other}_thoroughly")(subject)


_SORTED_JSON_KEY = '''
def block_key(parent_key, tokens, extra_keys=()):
    """Another canonical encoding the text allows: a JSON object with sorted keys."""
    record = {"parent": parent_key, "tokens": [int(t) for t in tokens],
              "extra": [str(e) for e in extra_keys]}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()
'''


def test_hidden_tests_in_notebook_order_keep_every_point_for_another_canonical_encoding():
    """The class as the notebook holds it when each hidden test runs (no append_slot or
    free yet at allocate's, no free at append_slot's), keyed by another canonical encoding
    than the course's: every hidden test passes. A TODO defined later is no one's bug, and
    the course's methods lent beside the learner's key with one encoding."""
    from autograder.hidden import ch04 as hidden

    cells, notebook = _answer_cells(), _namespace()
    exec(_SORTED_JSON_KEY, notebook)
    for step, check in (("prefix_keys", None), ("skeleton", None), ("take_block", None),
                        ("allocate", hidden.check_allocate_thoroughly),
                        ("append_slot", hidden.check_append_slot_thoroughly),
                        ("free", hidden.check_free_thoroughly)):
        exec(cells[step], notebook)
        if check is not None:
            check(notebook["PrefixCachingBlockManager"])
    assert notebook["block_key"]("0", [1]) != block_key("0", [1])  # another encoding indeed


def test_a_wrong_allocate_with_another_encoding_costs_allocate_alone():
    """With ``allocate`` wrong (its hits may cover the last token) and keys in another
    encoding, append_slot's and free's hidden tests lend the course's allocate: the course's
    keying comes with it, so the learner's right methods keep their points."""
    from autograder.hidden import ch04 as hidden

    cells, notebook = _answer_cells(), _namespace()
    exec(_SORTED_JSON_KEY, notebook)
    for step in _ANSWER_CELLS[1:]:
        exec(cells[step], notebook)
    learners = notebook["PrefixCachingBlockManager"]
    right = learners.allocate

    def allocate(self, seq_id, tokens, extra_keys=()):  # hits may cover the last token
        size, self.block_size = self.block_size, self.block_size
        keys = notebook["prefix_keys"](tokens, size, extra_keys)
        if keys and keys[-1] in self.cache and len(tokens) % size == 0:
            tokens = list(tokens) + [0]  # pretends one more token, so the last block hits
            hit = right(self, seq_id, tokens, extra_keys)
            self.tokens[seq_id].pop()
            return hit
        return right(self, seq_id, tokens, extra_keys)

    learners.allocate = allocate
    from autograder.checks._helpers import verdict_only

    with pytest.raises(AssertionError), verdict_only():
        hidden.check_allocate_thoroughly(learners)
    hidden.check_append_slot_thoroughly(learners)
    hidden.check_free_thoroughly(learners)
