"""Chapter 1's checks, run directly (no notebook): right answers pass, wrong ones get hints."""

from __future__ import annotations

import pytest
from alternatives import ch01 as alternative
from mutants.ch01 import MUTANTS

from autograder.checks import ch01
from course import kv_sizing as reference

FUNCTIONS = list(MUTANTS)
LEVELS = ["visible", "hidden"]


def _check(name: str, level: str):
    return getattr(ch01, f"check_{name}" + ("_thoroughly" if level == "hidden" else ""))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("solution", [reference, alternative], ids=["reference", "alternative"])
def test_correct_solutions_pass(solution, name, level):
    _check(name, level)(getattr(solution, name))


MUTANT_CASES = [
    pytest.param(name, mutant, hint, level, id=f"{name}-{mutant.__name__.strip('_')}-{level}")
    for name, mutants in MUTANTS.items()
    for mutant, hint in mutants
    for level in LEVELS
]


@pytest.mark.parametrize(("name", "mutant", "hint", "level"), MUTANT_CASES)
def test_wrong_solutions_fail_with_the_right_hint(name, mutant, hint, level):
    with pytest.raises(AssertionError) as failure:
        _check(name, level)(mutant)
    message = str(failure.value)
    assert hint in message
    # the hint names the call, what was expected, and what came back
    assert f"{mutant.__name__}(" in message
    assert " returned " in message and ", expected " in message


def test_every_check_has_a_mutant_and_an_exercise():
    checks = {n for n in dir(ch01) if n.startswith("check_")}
    covered = {f"check_{name}{level}" for name in MUTANTS for level in ("", "_thoroughly")}
    assert checks == covered


def test_an_unwritten_function_is_reported_as_not_written():
    def kv_bytes_per_token(num_layers, num_kv_heads, head_dim, bytes_per_element):
        raise NotImplementedError()

    with pytest.raises(AssertionError, match="kv_bytes_per_token is not written yet"):
        ch01.check_kv_bytes_per_token(kv_bytes_per_token)


def test_a_crash_is_reported_with_the_call_that_crashed():
    def requests_fit_paged(lengths, capacity_tokens, block_size):
        return lengths[10]

    with pytest.raises(AssertionError, match=r"requests_fit_paged\(lengths=\[10, 16, 17, 1\].*"
                                             r"raised IndexError"):
        ch01.check_requests_fit_paged(requests_fit_paged)


def test_a_value_of_the_wrong_type_fails():
    with pytest.raises(AssertionError, match="returned '524288'"):
        ch01.check_kv_bytes_per_token(lambda **kw: str(reference.kv_bytes_per_token(**kw)))


def test_numpy_integers_are_accepted():
    np = pytest.importorskip("numpy")
    ch01.check_requests_fit_paged(lambda **kw: np.int64(reference.requests_fit_paged(**kw)))


def test_random_cases_are_seeded():
    seen = []

    def recording(lengths, capacity_tokens, block_size):
        seen.append((tuple(lengths), capacity_tokens, block_size))
        return reference.requests_fit_paged(lengths, capacity_tokens, block_size)

    ch01.check_requests_fit_paged_thoroughly(recording)
    first, seen[:] = list(seen), []
    ch01.check_requests_fit_paged_thoroughly(recording)
    assert seen == first
