"""How chapter 1's checks report what they find (the mutant and alternative runs are in
test_checks.py)."""

from __future__ import annotations

import pytest

from autograder.checks import ch01
from autograder.hidden import ch01 as hidden01
from course import kv_sizing as reference


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

    hidden01.check_requests_fit_paged_thoroughly(recording)
    first, seen[:] = list(seen), []
    hidden01.check_requests_fit_paged_thoroughly(recording)
    assert seen == first
