"""Chapter 9's scheduling step beyond the checks: the course's answer and the hidden model (a
second reading of the rules) agree on every hypothesis-drawn scenario, and the step keeps its
promises (the budget, at least one token per admitted request, a reset on preemption, blocks
conserved, cached blocks only once computed)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from autograder.checks.ch09 import begin_step, make_scheduler, simulate
from autograder.hidden.ch09 import _scenarios, model_step
from course.v1.chunked_scheduler import ChunkedRequest, ChunkedScheduler, schedule_step


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(_scenarios())
def test_the_answer_and_the_model_agree_on_every_scenario(scenario):
    course, requests = make_scheduler(scenario)
    model, twins = make_scheduler(scenario)
    for step in range(400):
        if step > max(r.arrival for r in requests) and not course.busy():
            break
        begin_step(course, requests, scenario, step)
        begin_step(model, twins, scenario, step)
        plan, seen = simulate(course, step, schedule_step)
        assert seen == simulate(model, step, model_step)[1]
        assert plan.total_num_scheduled_tokens <= course.max_num_batched_tokens
        assert all(c.num_tokens >= 1 and c.end <= c.request.num_tokens + 1 for c in plan.chunks)
        assert all(r.num_computed_tokens == 0 for r in course.waiting)
        _check_the_pool(course)
    else:
        raise AssertionError("the scenario never finished")
    assert course.kv_cache.num_free() == scenario["num_blocks"] - 1
    assert course.kv_cache.num_held() == 0


def _check_the_pool(scheduler: ChunkedScheduler) -> None:
    """Every block is free or held, its holders counted; a request in the queues holds
    blocks only while it runs, as many as its computed tokens need; a cached block of a
    running request is a computed one."""
    kv = scheduler.kv_cache
    pool, size = kv.pool, kv.block_size
    holders = [0] * pool.num_blocks
    for manager in kv.managers:
        for table in manager.tables.values():
            for block in table:
                holders[block] += 1
    assert holders[0] == 0 and 0 not in pool.free_queue
    assert all(pool.ref_counts[b] == holders[b] for b in range(1, pool.num_blocks))
    assert set(pool.free_queue) == {b for b in range(1, pool.num_blocks) if holders[b] == 0}
    assert {r.id for r in scheduler.running} == set(kv.managers[0].tables)
    for r in scheduler.running:
        table = kv.block_table(r.id)
        assert len(table) == -(-r.num_computed_tokens // size)
        computed_blocks = r.num_computed_tokens // size
        assert all(b not in pool.key_of or i < computed_blocks for i, b in enumerate(table))


def test_a_hit_starts_a_request_with_its_computed_blocks_and_never_the_whole_prompt():
    scheduler = ChunkedScheduler(num_blocks=8, block_size=4, max_num_batched_tokens=100)
    first = ChunkedRequest(0, list(range(8)), output_len=2)
    scheduler.add(first)
    assert [c.num_tokens for c in scheduler.step().chunks] == [8]
    first.emit(8)
    second = ChunkedRequest(1, list(range(8)), output_len=1)
    scheduler.add(second)
    plan = scheduler.step()  # the hit stops short of the block that holds the last token
    assert [(c.request.id, c.start, c.num_tokens) for c in plan.chunks] == [(0, 8, 1), (1, 4, 4)]
    assert scheduler.kv_cache.block_table(1)[0] == scheduler.kv_cache.block_table(0)[0]


def test_a_refused_request_waits_with_nothing_computed_and_no_blocks():
    """A pool of 4 blocks of 2 (3 besides the null block): the second request's hit is the
    first one's 2 blocks, but its last token needs a third, and none is free."""
    import pytest

    scheduler = ChunkedScheduler(num_blocks=4, block_size=2, max_num_batched_tokens=8)
    first = ChunkedRequest(0, [1, 2, 3, 4], output_len=2)
    scheduler.add(first)
    scheduler.step()
    first.emit(5)
    second = ChunkedRequest(1, [1, 2, 3, 4, 9], output_len=1)
    scheduler.add(second)
    assert scheduler.kv_cache.get_computed_tokens(second) == 4
    plan = scheduler.step()
    assert [(c.request.id, c.start, c.num_tokens) for c in plan.chunks] == [(0, 4, 1)]
    assert plan.preempted == [] and list(scheduler.waiting) == [second]
    assert second.num_computed_tokens == 0 and scheduler.kv_cache.num_free() == 0
    with pytest.raises(KeyError):
        scheduler.kv_cache.block_table(second.id)


def test_a_block_still_being_filled_is_not_a_hit():
    scheduler = ChunkedScheduler(num_blocks=8, block_size=4, max_num_batched_tokens=2)
    scheduler.add(ChunkedRequest(0, list(range(5)), output_len=1))
    scheduler.step()  # 2 of the first block's 4 tokens computed
    scheduler.add(ChunkedRequest(1, list(range(9)), output_len=1))
    scheduler.max_num_batched_tokens = 4
    plan = scheduler.step()
    assert [(c.request.id, c.start) for c in plan.chunks] == [(0, 2), (1, 0)]


def test_the_budget_animation_shows_each_steps_chunks_and_unused_budget():
    from course.notebook.budget_animation import budget_animation, frame_html
    from course.v1.chunked_engine import ChunkRecord

    records = [ChunkRecord(0, [(0, 0, 3, "prefill")], [], 4),
               ChunkRecord(1, [(0, 3, 1, "decode"), (1, 0, 2, "prefill")], [2], 4)]
    first, second = frame_html(records, 0), frame_html(records, 1)
    assert 'data-tokens="3"' in first and "1 unused" in first
    assert 'data-kind="decode"' in second and 'data-preempted="1"' in second
    view = budget_animation(records).children[1]
    assert 'data-step="0"' in view.value


def test_a_step_that_raises_is_told_where_and_in_what_state():
    """A schedule_step that raises at its fourth step (a KeyError, as a dictionary lookup of
    a preempted request would): the hint names the scenario, the step, the state and what the
    rules give, as for a step that returns a wrong schedule."""
    import pytest

    from autograder.checks import ch09

    calls = []

    def raises_on_the_fourth_step(scheduler):
        calls.append(1)
        if len(calls) == 4:
            raise KeyError(1)
        return schedule_step(scheduler)

    raises_on_the_fourth_step.__name__ = "schedule_step"
    with pytest.raises(AssertionError) as failed:
        ch09.check_schedule_step(raises_on_the_fourth_step)
    hint = str(failed.value)
    assert "raised KeyError: 1" in hint and "step 3" in hint
    assert "running [" in hint and "waiting [" in hint and "the rules give" in hint
