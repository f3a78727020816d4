"""How chapter 1's checks report what they find, and what one wrong TODO costs (the mutant and
alternative runs are in test_checks.py)."""

from __future__ import annotations

import pytest
from mutants.ch01 import MUTANTS, _without_factor_two
from one_wrong_todo import FunctionTodos, unwritten

from autograder.checks import ch01
from autograder.hidden import ch01 as hidden01
from course.experiments import kv_sizing as reference

TODOS = FunctionTodos(reference, MUTANTS, ch01, hidden01, "01")


def test_an_unwritten_function_is_reported_as_not_written():
    def kv_bytes_per_token(num_layers, num_kv_heads, head_dim, bytes_per_element):
        raise NotImplementedError()

    with pytest.raises(AssertionError, match="kv_bytes_per_token is not written yet"):
        ch01.check_kv_bytes_per_token(kv_bytes_per_token)


def test_a_crash_is_reported_with_the_call_that_crashed():
    def requests_fit_paged(lengths, capacity_tokens, block_size):
        return lengths[10]

    with pytest.raises(AssertionError, match=r"requests_fit_paged\(lengths=\[10, 20, 0\].*"
                                             r"raised IndexError"):
        ch01.check_requests_fit_paged(requests_fit_paged)


def test_a_value_of_the_wrong_type_fails():
    with pytest.raises(AssertionError, match="returned '65536'"):
        ch01.check_kv_bytes_per_token(lambda **kw: str(reference.kv_bytes_per_token(**kw)))


def test_numpy_integers_are_accepted():
    np = pytest.importorskip("numpy")
    ch01.check_requests_fit_paged(lambda **kw: np.int64(reference.requests_fit_paged(**kw)))


def test_random_cases_are_seeded():
    seen = []

    def recording(lengths, capacity_tokens, block_size):
        seen.append((tuple(lengths), capacity_tokens, block_size))
        return reference.requests_fit_paged(lengths, capacity_tokens, block_size)

    hidden01.check_requests_fit_paged_thoroughly(recording)
    first, seen[:] = list(seen), []
    hidden01.check_requests_fit_paged_thoroughly(recording)
    assert seen == first


@pytest.mark.parametrize("level", [ch01.check_num_gpu_blocks,
                                   hidden01.check_num_gpu_blocks_thoroughly])
def test_a_count_returned_as_a_float_fails_visible_and_hidden(level):
    def num_gpu_blocks(**kw):
        return float(reference.num_gpu_blocks(**kw))

    with pytest.raises(AssertionError, match=r"returned 7168\.0, a float; it promises an int"
                       if level is ch01.check_num_gpu_blocks else "a float; it promises an int"):
        level(num_gpu_blocks)


def test_a_request_longer_than_max_model_len_is_refused_before_counting():
    with pytest.raises(ValueError, match="longer than max_model_len"):
        reference.requests_fit_contiguous([100, 300, 2049], 4096, 2048)
    assert reference.requests_fit_contiguous([2048, 2048], 4096, 2048) == 2


def test_an_unwritten_function_is_told_so_before_an_unwritten_earlier_todo():
    def kv_bytes_per_token(**kw):
        raise NotImplementedError()

    def kv_bytes_per_sequence(config, num_tokens, bytes_per_element=2):
        raise NotImplementedError()

    kv_bytes_per_sequence.__globals__["kv_bytes_per_token"] = kv_bytes_per_token
    try:
        with pytest.raises(AssertionError, match="kv_bytes_per_sequence is not written yet"):
            ch01.check_kv_bytes_per_sequence(kv_bytes_per_sequence)
    finally:
        del kv_bytes_per_sequence.__globals__["kv_bytes_per_token"]


@pytest.mark.parametrize(("earlier", "wrong", "hint"), [
    ("kv_bytes_per_token", _without_factor_two, "Fix kv_bytes_per_token first"),
    ("mla_kv_bytes_per_token", unwritten, "Write mla_kv_bytes_per_token first")])
def test_a_right_sequence_beside_a_wrong_per_token_todo_is_sent_to_fix_that_first(
        earlier, wrong, hint):
    """Its visible test says which earlier TODO to fix, in both languages; its hidden test
    passes (the course's per-token function lent)."""
    TODOS.sent_to_fix_first("kv_bytes_per_sequence", earlier, wrong, hint)


def test_the_sequence_builds_on_both_per_token_todos():
    assert TODOS.building_on_others() == {
        "kv_bytes_per_token": ["kv_bytes_per_sequence"],
        "mla_kv_bytes_per_token": ["kv_bytes_per_sequence"]}


@pytest.mark.one_wrong_todo
@pytest.mark.parametrize(("todo", "mutant"), TODOS.one_wrong_cases())
def test_one_wrong_todo_costs_that_todo_alone(todo, mutant):
    TODOS.costs_that_todo_alone(todo, mutant)
