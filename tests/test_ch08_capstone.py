"""Chapter 8 beyond its checks: sixteen concurrent requests really are preempted and still
equal their contiguous runs; the reservation baseline is counted right; the debugging table
names what the checks report; and one wrong TODO costs that TODO alone."""

from __future__ import annotations

import pytest
from mutants.ch08 import MUTANTS, _abort_keeps_gpu_blocks
from one_wrong_todo import FunctionTodos

from autograder.checks import ch08
from autograder.hidden import ch08 as hidden08
from autograder.table import parts_of
from course.notebook.capstone import equality_report, reservation_trace, workload
from course.tiny_model import TinyModel
from course.v0 import paged_engine as reference
from course.v0.paged_engine import PagedEngine, make_request, serve

TODOS = FunctionTodos(reference, MUTANTS, ch08, hidden08, "08")


def test_sixteen_concurrent_requests_are_preempted_and_equal_their_contiguous_runs():
    model = TinyModel()
    engine = PagedEngine(model, 30, 4, "recompute")
    finished = serve(engine, workload(16, seed=6, spread=0))
    report = equality_report(model, finished)
    preemptions = sum(r.event.count("preempted") for r in engine.records)
    assert report["finished"] == report["identical"] == 16
    assert report["largest_logit_difference"] < 1e-4
    assert preemptions >= 5 and max(r.running for r in engine.records) >= 6
    assert engine.blocks.num_free_blocks() == 30 and not any(engine.blocks.ref_counts)


def test_swap_returns_every_cpu_block_and_branches_share_then_copy():
    model = TinyModel()
    engine = PagedEngine(model, 40, 4, "swap", cpu_blocks=160)
    finished = serve(engine, workload(16, seed=5, branches_every=4))
    events = " ".join(r.event for r in engine.records)
    assert "preempted" in events and "swapped in" in events and "copy-on-write" in events
    report = equality_report(model, finished)
    assert report["identical"] == report["finished"] == 24 and report["branches"] == 8
    assert engine.scheduler.cpu.num_free_blocks() == 160


def test_reservation_holds_max_len_per_request_until_its_last_token():
    # capacity for two reservations of 10: requests 0 and 1 start at step 0; request 2 waits
    # for request 0 (3 output tokens, emitted at steps 0, 1, 2), whose slots free at step 2
    requests = [make_request(0, [1, 2], 3), make_request(1, [1, 2, 3], 5),
                make_request(2, [4], 2)]
    resident, stored = reservation_trace(requests, capacity_tokens=20, max_len=10)
    assert resident == [2, 2, 2, 1, 0]
    # step 0: prompts 2 + 3; step 1: one more each; step 2: request 0 left, request 2 in
    assert stored == [5, 7, 5 + 1, 6, 0]


# The notebook's symptom -> cause table, row by row (by its symptom's first words): the
# mistakes it names, as mutants, and what the check it names reports for each of them.
DEBUGGING_ROWS = {
    "wrong tokens only in requests preempted by recompute": [
        (8, "serve", "_recompute_from_the_prompt", "preempted by recompute")],
    "wrong tokens after a swap": [(8, "serve", "_no_block_copies", "was not called in it"),
                                  (8, "serve", "_copies_after_the_model", "ran after the model")],
    "one branch goes wrong right after a fork": [
        (8, "build_decode_batch", "_stale_tables", "stale")],
    "NaN logits": [(8, "paged_decode_step", "_attends_before_writing", "NaN"),
                   (6, "paged_decode_attention", "_tail_not_masked", "NaN")],
    "every decoded token's logits a little off": [
        (8, "paged_decode_step", "_rope_at_seq_len", "RoPE")],
    "another sequence's K/V overwritten": [(6, "write_kv", "_writes_padding", "slot -1"),
                                           (6, "write_kv", "_skips_only_minus_one", "padding")],
    "free blocks shrink run after run": [
        (8, "serve", "_leaks_finished_blocks", "never went back"),
        (8, "abort", "_abort_keeps_gpu_blocks", "never went back"),
        (8, "abort", "_abort_keeps_cpu_blocks", "never went back")],
    "a request's tokens go wrong after another request is cancelled": [
        (8, "abort", "_abort_frees_shared_blocks", "one reference")],
    "one bad request takes the engine down": [
        (8, "decode_surviving_faults", "_fault_escapes", "escaped"),
        (8, "decode_surviving_faults", "_fault_aborts_the_batch", "its own decode works")],
    "a run returns with requests missing": [
        (8, "serve", "_returns_quietly", "returned, with requests unfinished"),
        (8, "serve", "_stops_when_idle", "missing")],
}


def _debugging_table() -> dict[str, tuple[str, str]]:
    import nbformat
    from conftest import CHAPTERS

    chapter = next(c for c in CHAPTERS if c.number == "08")
    source = next(c.source for c in nbformat.read(chapter.source, as_version=4).cells
                  if c.source.startswith("## ") and "symptom to cause" in c.source)
    rows = [line.strip("| ").split(" | ") for line in source.splitlines()
            if line.startswith("| ") and not line.startswith(("| symptom", "| ---"))]
    return {row[0]: (row[2], row[1]) for row in rows}


def test_debugging_table_rows_are_the_mistakes_the_named_checks_report():
    """Each mutant fails the named TODO's visible check, else its hidden one, with a
    message that shows the row's symptom or cause."""
    import importlib

    table = _debugging_table()
    assert len(table) == len(DEBUGGING_ROWS)
    for start, cases in DEBUGGING_ROWS.items():
        symptom = next(s for s in table if s.startswith(start))
        reported_by = table[symptom][0]
        for number, name, mutant_name, fragment in cases:
            assert f"check_{name}`" in reported_by, (symptom, name)
            mutants = dict((m.__name__, m) for m, _ in
                           importlib.import_module(parts_of(number).mutants).MUTANTS[name])
            first = None
            for module_name, suffix in ((parts_of(number).checks, ""),
                                        (parts_of(number).hidden, "_thoroughly")):
                module = importlib.import_module(module_name)
                try:
                    getattr(module, f"check_{name}{suffix}")(mutants[mutant_name])
                except AssertionError as failure:
                    first = str(failure)
                    break
            assert first is not None, f"{mutant_name} passes check_{name} ({symptom})"
            assert fragment in first, (symptom, mutant_name, first)


def test_right_fault_handling_beside_a_wrong_abort_is_sent_to_fix_abort_first():
    """Its visible test says to fix abort first, in both languages; its hidden test passes
    (the course's abort lent)."""
    TODOS.sent_to_fix_first("decode_surviving_faults", "abort", _abort_keeps_gpu_blocks,
                            "If abort fails its own test, fix that first")


def test_the_todos_that_build_on_earlier_ones():
    assert TODOS.building_on_others() == {
        "abort": ["decode_surviving_faults"]}


@pytest.mark.one_wrong_todo
@pytest.mark.parametrize(("todo", "mutant"), TODOS.one_wrong_cases())
def test_one_wrong_todo_costs_that_todo_alone(todo, mutant):
    TODOS.costs_that_todo_alone(todo, mutant)
