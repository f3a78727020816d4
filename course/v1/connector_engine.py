"""Chapter 11: chapter 9's engine with a KV connector plugged in (``course.v1.kv_connector``).

Each step::

    schedule:  running requests first (chapter 9's rules), then admission with the connector:
               a request waiting for its load is skipped until the load is reported done;
               a new request gets its blocks and GPU hit, then asks the connector how many
               more tokens it can load; with some to load it waits (WAITING_FOR_REMOTE_KVS)
    connector: build_connector_meta -> the worker: start_load_kv, per layer (in the
               engine's attend, where vLLM's Attention layer has them) wait_for_layer_load /
               attention / save_kv_layer, wait_for_save, get_finished
    output:    loads done let their requests in at the next step; a failed block sets its
               request's computed tokens back to the block's first token; a finished request
               whose connector still sends keeps its blocks until the send is reported

A request's tokens are computed, loaded or hit, and whichever it was, the tokens it generates
are the ones chapter 9's engine generates: the connector only changes where K/V come from.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import torch

from course.tiny_model import TinyModel
from course.v1.chunked_engine import ChunkedEngine, VarlenBatch
from course.v1.chunked_scheduler import (
    Chunk,
    ChunkedRequest,
    ChunkedScheduler,
    Schedule,
    schedule_step,
)
from course.v1.kv_connector import KVConnectorOutput, KVConnectorScheduler, KVConnectorWorker


class ConnectorScheduler(ChunkedScheduler):
    """Chapter 9's scheduler with a connector's scheduler half: ``loading`` holds the ids of
    the waiting requests whose load is in flight, ``received`` those whose load is done,
    ``sending`` the finished requests whose blocks the connector still needs."""

    def __init__(self, num_blocks: int, block_size: int, max_num_batched_tokens: int,
                 connector: KVConnectorScheduler, max_num_seqs: int = 64) -> None:
        super().__init__(num_blocks, block_size, max_num_batched_tokens, max_num_seqs)
        self.connector = connector
        self.loading: set[int] = set()
        self.received: set[int] = set()
        self.sending: dict[int, ChunkedRequest] = {}
        self.finished_ids: set[int] = set()  # finished since the worker last heard
        self.transfer_params: dict[int, dict] = {}  # request id -> request_finished's params
        self.recomputed_tokens = 0  # tokens computed again because their load failed

    def busy(self) -> bool:
        return bool(self.running or self.waiting or self.sending)

    def finish(self, request: ChunkedRequest) -> None:
        """A done request leaves; its blocks go back to the pool now, or once the connector
        reports them sent."""
        self.running.remove(request)
        self.finished_ids.add(request.id)
        keep, params = self.connector.request_finished(request,
                                                       self.kv_cache.block_table(request.id))
        if params is not None:
            self.transfer_params[request.id] = params
        if keep:
            self.sending[request.id] = request
        else:
            self.kv_cache.free(request)

    def update_from_output(self, output: KVConnectorOutput) -> None:
        """The worker's report: failed blocks cut their loading request's computed tokens
        short; loads done are noted; sends done free their blocks."""
        size = self.block_size
        for request in self.waiting:
            if request.id in self.loading:
                table = self.kv_cache.block_table(request.id)
                failed = [i for i, block in enumerate(table) if block in output.invalid_block_ids]
                if failed and failed[0] * size < request.num_computed_tokens:
                    self.recomputed_tokens += request.num_computed_tokens - failed[0] * size
                    request.num_computed_tokens = failed[0] * size
        self.received |= output.finished_recving & self.loading
        for request_id in output.finished_sending & set(self.sending):
            self.kv_cache.free(self.sending.pop(request_id))
        self.connector.update_connector_output(output)


def admit_with_connector(scheduler: ConnectorScheduler, plan: Schedule) -> None:
    """Admit waiting requests into ``plan`` after the running ones, first come first served,
    while ``plan`` preempted nothing, budget is left (``max_num_batched_tokens`` minus what
    ``plan`` schedules) and fewer than ``max_num_seqs`` requests run. ``kv`` is
    ``scheduler.kv_cache``. For each, from the front of ``scheduler.waiting``:

    1. In ``scheduler.loading`` and not in ``scheduler.received``: its load is in flight;
       skip it (it keeps its place and its blocks) and look at the next.
    2. In ``scheduler.received``: its load is done; it leaves both sets, its computed tokens
       (hits and loaded tokens, less what failed) are cached (``kv.cache_blocks(request)``),
       and it runs: its blocks, taken when it was admitted, hold every token it knows.
    3. Otherwise it is new: ``num_computed_tokens`` becomes its GPU hit
       (``kv.get_computed_tokens(request)``); ask
       ``connector.get_num_new_matched_tokens(request, hits)`` for ``(n, async)``: ``None``
       means ask again later (``num_computed_tokens`` back to 0, skip it). Then room, with
       ``kv.allocate_slots``: with ``n > 0``, for every token it knows after its hit
       (``num_tokens - hits``: the loaded ones arrive while it waits, and once they have it
       runs without asking for more), else for the ``num_new`` tokens it runs now.
       ``False``: its ``num_computed_tokens`` goes back to 0, and it and every new request
       after it are skipped this step (requests whose load is done still run: they hold
       their blocks, and waiting behind a request that cannot fit while holding them would
       never end). Then ``connector.update_state_after_alloc(request, kv.block_table(id),
       n)``. With ``n > 0`` its ``num_computed_tokens`` grows by ``n`` and it waits for its
       load: into ``scheduler.loading``, skipped. With ``n == 0`` it runs.

    ``num_new`` is ``min(num_tokens - num_computed_tokens, budget)``. A request that runs
    leaves ``waiting``, joins the end of ``running`` and is scheduled ``num_new`` tokens as
    chapter 9's step does (``plan.chunks.append(Chunk(request, start, num_new))``, then
    ``num_computed_tokens`` grows by ``num_new``). The requests skipped keep their order at
    the front of ``waiting``.
    """
    ### BEGIN SOLUTION
    kv, connector = scheduler.kv_cache, scheduler.connector
    budget = scheduler.max_num_batched_tokens - plan.total_num_scheduled_tokens
    skipped: list[ChunkedRequest] = []
    pool_full = False
    while (not plan.preempted and scheduler.waiting and budget > 0
           and len(scheduler.running) < scheduler.max_num_seqs):
        request = scheduler.waiting.popleft()
        if request.id in scheduler.loading:
            if request.id not in scheduler.received:
                skipped.append(request)
                continue
            scheduler.loading.remove(request.id)
            scheduler.received.remove(request.id)
            kv.cache_blocks(request)
        else:
            if pool_full:  # no new request now; a loaded one holds its blocks
                skipped.append(request)
                continue
            request.num_computed_tokens = hits = kv.get_computed_tokens(request)
            num_external, _ = connector.get_num_new_matched_tokens(request, hits)
            if num_external is None:
                request.num_computed_tokens = 0
                skipped.append(request)
                continue
            room = request.num_tokens - hits if num_external else \
                min(request.num_tokens - hits, budget)
            if not kv.allocate_slots(request, room):
                request.num_computed_tokens = 0
                pool_full = True
                skipped.append(request)
                continue
            connector.update_state_after_alloc(request, kv.block_table(request.id),
                                               num_external)
            if num_external:
                request.num_computed_tokens += num_external
                scheduler.loading.add(request.id)
                skipped.append(request)
                continue
        scheduler.running.append(request)
        num_new = min(request.num_tokens - request.num_computed_tokens, budget)
        plan.chunks.append(Chunk(request, request.num_computed_tokens, num_new))
        request.num_computed_tokens += num_new
        budget -= num_new
    scheduler.waiting.extendleft(reversed(skipped))
    ### END SOLUTION


def connector_schedule_step(scheduler: ConnectorScheduler,
                            schedule_running: Callable = schedule_step,
                            admit: Callable = admit_with_connector) -> Schedule:
    """Chapter 9's step for the running requests (``schedule_running`` with nothing waiting:
    its admission pass has nothing to do), then ``admit`` (``admit_with_connector``)."""
    waiting, scheduler.waiting = scheduler.waiting, deque()
    try:
        plan = schedule_running(scheduler)
    finally:  # requests it preempted are at the front, before those that were waiting
        scheduler.waiting.extend(waiting)
    admit(scheduler, plan)
    return plan


class ConnectorEngine(ChunkedEngine):
    """Chapter 9's engine with ``connector``, a (scheduler half, worker half) pair. The worker
    takes the engine's KV pool. ``schedule`` is chapter 9's scheduling step for the running
    requests, ``admit`` its admission with the connector; ``step`` the model step (chapter 9's
    ``engine_step``), whose every layer's attention waits for that layer's loads and saves
    what it wrote (``attend``)."""

    def __init__(self, model: TinyModel, num_blocks: int, block_size: int,
                 max_num_batched_tokens: int,
                 connector: tuple[KVConnectorScheduler, KVConnectorWorker],
                 max_num_seqs: int = 64, attention: Callable | None = None,
                 schedule: Callable = schedule_step, step: Callable | None = None,
                 admit: Callable = admit_with_connector) -> None:
        super().__init__(model, num_blocks, block_size, max_num_batched_tokens, max_num_seqs,
                         attention, lambda s: connector_schedule_step(s, schedule, admit),
                         step)
        self.connector, self.worker = connector
        self.scheduler = ConnectorScheduler(num_blocks, block_size, max_num_batched_tokens,
                                            self.connector, max_num_seqs)
        self.worker.register_kv_caches(self.pool)

    def execute(self, plan: Schedule) -> None:
        connector_round(self.scheduler, self.worker, plan,
                        lambda: self.model_step(self, plan) if plan.chunks else None)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               batch: VarlenBatch) -> torch.Tensor:
        """As vLLM's ``Attention`` layer does with a connector: wait for the layer's loads
        before its attention reads the pool, save its blocks once the attention has written
        them."""
        self.worker.wait_for_layer_load(layer)
        out = super().attend(layer, q, k, v, batch)
        self.worker.save_kv_layer(layer)
        return out


def connector_round(scheduler: ConnectorScheduler, worker: KVConnectorWorker, plan: Schedule,
                    run_model: Callable[[], None]) -> None:
    """The connector's part of a step around the model's (``run_model``): loads start before,
    saves end after, and the worker's report goes back to the scheduler. It runs also when
    the step computes nothing: loads in flight still land."""
    tables = {c.request.id: scheduler.kv_cache.block_table(c.request.id) for c in plan.chunks}
    worker.bind_connector_metadata(scheduler.connector.build_connector_meta(plan, tables))
    worker.start_load_kv()
    run_model()
    worker.wait_for_save()
    finished, scheduler.finished_ids = scheduler.finished_ids, set()
    sent, received = worker.get_finished(finished)
    output = KVConnectorOutput(sent, received, worker.get_block_ids_with_load_errors(),
                               worker.build_connector_worker_meta())
    worker.clear_connector_metadata()
    scheduler.update_from_output(output)
