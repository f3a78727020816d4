"""A check's time limit (``autograder.private.out_of_time``): a learner's function that never
returns fails the check that called it, named in the hint, after one short limit; every later
check given it fails at once, without calling it again."""

from __future__ import annotations

import threading

import pytest

from autograder import private
from autograder.checks import ch01, ch03
from autograder.checks._helpers import CheckFailed
from autograder.hidden import ch01 as hidden01
from course.experiments import kv_sizing as reference
from course.v0 import block_manager

pytestmark = pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                                reason="the limit is a signal, delivered to the main thread")


@pytest.fixture(autouse=True)
def one_second(monkeypatch):
    monkeypatch.setenv(private.SECONDS_SETTING, "1")
    monkeypatch.setattr(private, "_HUNG", {})


def _endless(calls: list[str]):
    def kv_bytes_per_token(*args, **kwargs):
        calls.append("called")
        while True:
            pass

    return kv_bytes_per_token


def test_an_endless_function_fails_its_check_with_its_name_and_is_not_called_again():
    calls: list[str] = []
    endless = _endless(calls)
    with pytest.raises(CheckFailed) as stopped:
        ch01.check_kv_bytes_per_token(endless)
    assert "kv_bytes_per_token did not return within 1 s, so this test stopped it" in \
        str(stopped.value)
    assert stopped.value.test == "The visible test of kv_bytes_per_token"
    assert calls == ["called"]
    with pytest.raises(CheckFailed) as again:
        hidden01.check_kv_bytes_per_token_thoroughly(endless)
    assert "did not return within 1 s in an earlier test, so this test did not run it again" \
        in str(again.value)
    assert calls == ["called"]  # not run again: the limit was paid once


def test_catching_the_stop_once_does_not_escape_it():
    calls: list[str] = []

    def kv_bytes_per_token(*args, **kwargs):
        calls.append("called")
        try:
            while True:
                pass
        except BaseException:  # the learner's code swallows the first stop...
            while True:  # ...and loops on: it is stopped again a second later
                pass

    with pytest.raises(CheckFailed, match="did not return within 1 s"):
        ch01.check_kv_bytes_per_token(kv_bytes_per_token)
    assert calls == ["called"]


def test_a_method_that_never_returns_marks_its_class():
    class BlockManager(block_manager.BlockManager):
        def allocate(self, *args, **kwargs):
            while True:
                pass

    with pytest.raises(CheckFailed, match="allocate did not return within 1 s"):
        ch03.check_allocate(BlockManager)
    with pytest.raises(CheckFailed, match="allocate did not return within 1 s in an earlier"):
        ch03.check_free(BlockManager)


def test_a_right_answer_and_a_different_function_are_not_held_back():
    with pytest.raises(CheckFailed):
        ch01.check_kv_bytes_per_token(_endless([]))
    def kv_bytes_per_token(**kwargs):  # another function, a right one: it runs, and passes
        return reference.kv_bytes_per_token(**kwargs)

    ch01.check_kv_bytes_per_token(kv_bytes_per_token)
    hidden01.check_kv_bytes_per_token_thoroughly(kv_bytes_per_token)
