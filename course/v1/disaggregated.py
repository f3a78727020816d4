"""Chapter 11: prefill and decode on separate engines, joined by a connector.

A prefill engine only prefills: each request runs there with one output token, and when it
finishes its connector keeps its blocks (``request_finished`` returns True) and hands their ids
on. The decode engine admits the request with those ids (``kv_transfer_params``), reads the
blocks out of the prefill engine's pool into its own (an asynchronous load), computes the
prompt's last token again for its logits, and decodes::

    prefill engine   [prompt's blocks 0 1 2 3]  kept until the decode engine has read them
                            │ remote_block_ids        (or until the lease runs out)
                            v
    decode engine    [blocks 0 1 2 3 loaded] -> last prompt token computed -> decode ...

This is vLLM's disaggregated prefill
(https://docs.vllm.ai/en/latest/features/disagg_prefill.html) with the transport
(NIXL, Mooncake, P2P) reduced to ``KVHandoff``, one process's view of the prefill engine's
pool: the decode engine reads it, tells it when it is done, and finds it gone when the prefill
engine stopped waiting (after ``lease_steps`` of its steps; vLLM's NIXL connector calls this
the abort timeout). A read of blocks no longer held fails, and the decode engine computes the
prompt itself: nothing leaks and no output changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from course.tiny_model import TinyModel
from course.v0.paged_engine import KVPool
from course.v1.chunked_engine import ChunkedEngine
from course.v1.chunked_scheduler import ChunkedRequest, Schedule
from course.v1.connector_engine import ConnectorEngine
from course.v1.kv_connector import (
    KVConnectorMetadata,
    KVConnectorOutput,
    KVConnectorScheduler,
    KVConnectorWorker,
    LoadingWorker,
    poison_block,
)


@dataclass(eq=False)
class HandoffRequest(ChunkedRequest):
    """A request that arrives with another engine's KV: ``kv_transfer_params`` as the prefill
    engine's ``request_finished`` returned them, until the decode engine uses them."""

    kv_transfer_params: dict | None = None


class KVHandoff:
    """What the transport knows: the prefill engine's pool, the requests the decode engine
    has read, and those whose blocks the prefill engine no longer holds."""

    def __init__(self) -> None:
        self.pool: KVPool | None = None
        self.taken: set[int] = set()
        self.released: set[int] = set()


class PrefillConnectorScheduler(KVConnectorScheduler):
    """Loads nothing; keeps each finished request's blocks for the decode engine."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.to_send: dict[int, list[int]] = {}

    def get_num_new_matched_tokens(self, request: ChunkedRequest,
                                   num_computed_tokens: int) -> tuple[int, bool]:
        return 0, False

    def update_state_after_alloc(self, request: ChunkedRequest, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        pass

    def build_connector_meta(self, schedule: Schedule,
                             block_ids: dict[int, list[int]]) -> KVConnectorMetadata:
        metadata, self.to_send = KVConnectorMetadata(saves=self.to_send), {}
        return metadata

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        pass

    def request_finished(self, request: ChunkedRequest,
                         block_ids: list[int]) -> tuple[bool, dict | None]:
        self.to_send[request.id] = list(block_ids)
        return True, {"remote_request_id": request.id, "remote_block_ids": list(block_ids),
                      "num_prompt_tokens": len(request.prompt)}


class PrefillConnectorWorker(KVConnectorWorker):
    """Reports a request sent once the decode engine has read it, or ``lease_steps`` steps
    after it was handed over, whichever comes first; then its blocks are no longer held."""

    def __init__(self, handoff: KVHandoff, lease_steps: int = 64) -> None:
        self.handoff, self.lease_steps = handoff, lease_steps
        self.leases: dict[int, int] = {}  # request id -> steps left
        self.clock = 0

    def register_kv_caches(self, pool: KVPool) -> None:
        self.handoff.pool = pool

    def start_load_kv(self) -> None:
        for request_id in self.metadata.saves:
            self.leases[request_id] = self.lease_steps

    def wait_for_layer_load(self, layer: int) -> None:
        pass

    def save_kv_layer(self, layer: int) -> None:
        pass  # the KV stays where it is: the decode engine reads it from this pool

    def wait_for_save(self) -> None:
        pass

    def get_finished(self, finished_req_ids: set[int]) -> tuple[set[int], set[int]]:
        sent = set()
        for request_id in list(self.leases):
            self.leases[request_id] -= 1
            if request_id in self.handoff.taken or not self.leases[request_id]:
                del self.leases[request_id]
                self.handoff.taken.discard(request_id)
                self.handoff.released.add(request_id)
                sent.add(request_id)
        return sent, set()


class DecodeConnectorScheduler(KVConnectorScheduler):
    """Loads a handed-off request's prompt, all but its last token, from the prefill engine."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.pending: dict[int, tuple[int, list[tuple[int, int]]]] = {}

    def get_num_new_matched_tokens(self, request: ChunkedRequest,
                                   num_computed_tokens: int) -> tuple[int, bool]:
        params = getattr(request, "kv_transfer_params", None)
        if params is None:
            return 0, False
        count = max(params["num_prompt_tokens"] - 1 - num_computed_tokens, 0)
        return count, count > 0

    def update_state_after_alloc(self, request: ChunkedRequest, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        params, request.kv_transfer_params = request.kv_transfer_params, None  # used once
        if not num_external_tokens:
            return
        first = request.num_computed_tokens // self.block_size
        last = -(-(request.num_computed_tokens + num_external_tokens) // self.block_size)
        remote = params["remote_block_ids"][first:last]
        self.pending[request.id] = (params["remote_request_id"],
                                    list(zip(remote, block_ids[first:last], strict=True)))

    def build_connector_meta(self, schedule: Schedule,
                             block_ids: dict[int, list[int]]) -> KVConnectorMetadata:
        metadata, self.pending = KVConnectorMetadata(loads=self.pending), {}
        return metadata

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        pass


class DecodeConnectorWorker(LoadingWorker):
    """Reads the prefill engine's blocks into this engine's pool, ``load_steps`` steps after
    a load starts; a read of blocks the prefill engine released fails."""

    def __init__(self, handoff: KVHandoff, load_steps: int = 1) -> None:
        super().__init__(load_steps)
        self.handoff = handoff
        self.bytes_loaded = 0

    def register_kv_caches(self, pool: KVPool) -> None:
        self.pool = pool
        self.block_bytes = sum(t[0].numel() * t.element_size() for t in pool.k + pool.v)

    def start_load_kv(self) -> None:
        for request_id, job in self.metadata.loads.items():
            self.in_flight.start(request_id, job)
        for request_id, (remote_id, pairs) in self.in_flight.advance():
            if remote_id in self.handoff.released:
                self.failed_blocks |= {block for _, block in pairs}
                self.fail(pairs)
            else:
                self.load(pairs)
                self.handoff.taken.add(remote_id)
                self.bytes_loaded += self.block_bytes * len(pairs)
            self.received.add(request_id)

    def load(self, pairs: list[tuple[int, int]]) -> None:
        """Copy (prefill engine's block, this engine's block) for each pair."""
        self.handoff.pool.copy_blocks(self.pool, pairs)

    def fail(self, pairs: list[tuple[int, int]]) -> None:
        """The prefill engine no longer holds the blocks: this engine's hold garbage."""
        for _, block in pairs:
            poison_block(self.pool, block)

    def wait_for_layer_load(self, layer: int) -> None:
        pass  # every load is asynchronous: its request is not in the step

    def save_kv_layer(self, layer: int) -> None:
        pass

    def wait_for_save(self) -> None:
        pass

@dataclass
class Disaggregated:
    """A prefill engine and a decode engine sharing one ``KVHandoff``."""

    prefill: ConnectorEngine
    decode: ConnectorEngine
    handoff: KVHandoff


def disaggregated_pair(model: TinyModel, prefill_blocks: int, decode_blocks: int, block_size: int,
                       max_num_batched_tokens: int, load_steps: int = 1,
                       lease_steps: int = 64, **engine_args) -> Disaggregated:
    """Two engines over ``model``, joined through their connectors (``engine_args``: the
    engines' own, ``admit`` say)."""
    handoff = KVHandoff()
    prefill = ConnectorEngine(model, prefill_blocks, block_size, max_num_batched_tokens,
                              (PrefillConnectorScheduler(block_size),
                               PrefillConnectorWorker(handoff, lease_steps)), **engine_args)
    decode = ConnectorEngine(model, decode_blocks, block_size, max_num_batched_tokens,
                             (DecodeConnectorScheduler(block_size),
                              DecodeConnectorWorker(handoff, load_steps)), **engine_args)
    return Disaggregated(prefill, decode, handoff)


def finish_done(engine: ChunkedEngine) -> list[ChunkedRequest]:
    """Finish the engine's done requests; return them."""
    done = [request for request in engine.scheduler.running if request.done]
    for request in done:
        engine.scheduler.finish(request)
    return done


def serve_disaggregated(pair: Disaggregated, requests: list[ChunkedRequest],
                        max_steps: int = 10_000) -> list[HandoffRequest]:
    """Run ``requests`` (each joining the prefill engine at step ``arrival``) through both
    engines, a step of each per step, to completion; the decode engine's requests, in
    finishing order. A request's first token is computed on both engines (the decode engine
    recomputes the last prompt token); its output is the decode engine's."""
    pending = sorted(requests, key=lambda r: (r.arrival, r.id))
    originals = {request.id: request for request in requests}
    finished: list[HandoffRequest] = []
    for step in range(max_steps):
        if not pending and not pair.prefill.scheduler.busy() and \
                not pair.decode.scheduler.busy():
            return finished
        while pending and pending[0].arrival <= step:
            request = pending.pop(0)
            pair.prefill.scheduler.add(ChunkedRequest(request.id, list(request.prompt), 1,
                                                      request.arrival))
        pair.prefill.step()
        for prefilled in finish_done(pair.prefill):
            original = originals[prefilled.id]
            pair.decode.scheduler.add(HandoffRequest(
                original.id, list(original.prompt), original.output_len, step,
                kv_transfer_params=pair.prefill.scheduler.transfer_params.pop(prefilled.id)))
        pair.decode.step()
        finished += finish_done(pair.decode)
    raise RuntimeError(f"requests still unfinished after {max_steps} steps")
