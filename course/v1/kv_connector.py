"""Chapter 11: the KV connector, the interface between an engine and KV cache kept outside its
own GPU pool (a CPU tier, another engine).

It is vLLM V1's ``KVConnectorBase_V1`` (``vllm/distributed/kv_transfer/kv_connector/v1/base.py``,
vLLM 0.34.0, commit 62d4bc3c7), whose concrete connectors split it in two, as here: a scheduler half
that decides what moves and holds no KV, and a worker half that moves KV and knows no policy.
The only things that pass between them are the metadata the scheduler half builds each step
and the output the worker half reports after it::

    scheduler half                                      worker half (owns the KV pool)
    ──────────────                                      ──────────────────────────────
    admitting a request:
      get_num_new_matched_tokens(request, hits)
        -> (tokens held elsewhere, load async?)
      update_state_after_alloc(request, blocks, n)
    after scheduling:
      build_connector_meta(schedule) ── metadata ──>    bind_connector_metadata(metadata)
                                                        start_load_kv()
                                                        per layer: wait_for_layer_load(layer)
                                                                   attention writes K/V
                                                                   save_kv_layer(layer)
                                                        wait_for_save()
      update_connector_output(output) <── output ──     get_finished(finished ids)
                                                        get_block_ids_with_load_errors()
    a request finishes:
      request_finished(request, blocks)
        -> (free its blocks later?, transfer params)

The engine's promises to a connector (``course.v1.connector_engine``):

- a request with ``n > 0`` tokens to load waits (vLLM's ``WAITING_FOR_REMOTE_KVS``), holding
  the blocks allocated for them, until ``get_finished`` names it among the received; other
  requests run meanwhile. A load's blocks never count as computed before then;
- ``get_block_ids_with_load_errors`` names blocks whose load failed, no later than the step
  that reports their request received: the request's computed tokens stop at the first failed
  block, and the engine computes the rest itself;
- when ``request_finished`` returns True the engine keeps the request's blocks until
  ``get_finished`` names the request among the sent.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from course.v0.paged_engine import KVPool
from course.v1.chunked_scheduler import ChunkedRequest, Schedule


@dataclass
class KVConnectorMetadata:
    """What the scheduler half tells the worker half for one step; each connector says what
    ``loads`` and ``saves`` hold (vLLM leaves the class abstract)."""

    loads: dict[int, Any] = field(default_factory=dict)  # request id -> what to load
    saves: dict[int, Any] = field(default_factory=dict)  # request id -> what to save


@dataclass
class KVConnectorOutput:
    """What the worker half reports after a step (vLLM's ``KVConnectorOutput``)."""

    finished_sending: set[int] = field(default_factory=set)  # may free their blocks now
    finished_recving: set[int] = field(default_factory=set)  # their loads are done
    invalid_block_ids: set[int] = field(default_factory=set)  # GPU blocks whose load failed
    worker_meta: Any = None  # anything else the scheduler half needs back (saves completed)


class KVConnectorScheduler:
    """The scheduler half. ``block_size`` is the engine's. Its methods raise
    ``NotImplementedError`` until a connector writes them (vLLM's are abstract; a notebook
    adds them to a class after it is made, which an abstract base would not see)."""

    block_size: int

    def get_num_new_matched_tokens(self, request: ChunkedRequest,
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        """How many tokens after the first ``num_computed_tokens`` (the GPU's prefix hit) can
        be loaded, and whether the load is asynchronous; ``(None, False)`` to be asked again
        at a later step. Never the last token: its logits are computed. No side effects: it
        may be asked again for the same request."""
        raise NotImplementedError

    def update_state_after_alloc(self, request: ChunkedRequest, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        """``request`` now holds ``block_ids`` (its whole block table); ``num_external_tokens``
        tokens from its GPU hit on, ``request.num_computed_tokens`` (which the engine sets to
        the hit before this call), are to be loaded (0: nothing to load)."""
        raise NotImplementedError

    def build_connector_meta(self, schedule: Schedule,
                             block_ids: dict[int, list[int]]) -> KVConnectorMetadata:
        """The worker's orders for the step ``schedule`` describes, whose requests hold the
        block tables ``block_ids`` (the part of vLLM's ``SchedulerOutput`` a connector reads):
        the loads decided since the last call, and the blocks this step's chunks complete that
        should be saved. Resets what it handed over."""
        raise NotImplementedError

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        """The worker's report for the step."""
        raise NotImplementedError

    def request_finished(self, request: ChunkedRequest,
                         block_ids: list[int]) -> tuple[bool, dict | None]:
        """``request`` finished holding ``block_ids``: True to keep them until ``get_finished``
        names it among the sent; and transfer parameters for whoever takes its KV next."""
        return False, None


class KVConnectorWorker(ABC):
    """The worker half: runs next to the model and owns the transfers."""

    metadata: KVConnectorMetadata | None = None

    @abstractmethod
    def register_kv_caches(self, pool: KVPool) -> None:
        """The engine's KV pool, which loads write and saves read."""

    def bind_connector_metadata(self, metadata: KVConnectorMetadata) -> None:
        self.metadata = metadata

    def clear_connector_metadata(self) -> None:
        self.metadata = None

    @abstractmethod
    def start_load_kv(self) -> None:
        """Start the loads the metadata orders; move every transfer in flight one step on."""

    @abstractmethod
    def wait_for_layer_load(self, layer: int) -> None:
        """Return when ``layer``'s loads for this step's requests are in the pool."""

    @abstractmethod
    def save_kv_layer(self, layer: int) -> None:
        """Start saving ``layer``'s blocks the metadata names; the attention that writes them
        has run."""

    @abstractmethod
    def wait_for_save(self) -> None:
        """Return when every save of this step is done: the pool may be overwritten after."""

    @abstractmethod
    def get_finished(self, finished_req_ids: set[int]) -> tuple[set[int], set[int]]:
        """``finished_req_ids`` finished since the last call; return the requests whose sends
        completed (among those named now or before) and those whose loads completed."""

    def get_block_ids_with_load_errors(self) -> set[int]:
        """GPU blocks whose load failed since the last call."""
        return set()

    def build_connector_worker_meta(self) -> Any:
        """Anything else the scheduler half needs to hear about this step."""
        return None


class LoadsInFlight:
    """Asynchronous loads, each landing ``steps`` steps after it starts (at least 1: a load
    started in a step lands at that step's end, and its request runs from the next)."""

    def __init__(self, steps: int) -> None:
        if steps < 1:
            raise ValueError(f"a load takes at least one step, got {steps}")
        self.steps = steps
        self.jobs: dict[int, tuple[Any, int]] = {}  # request id -> (job, steps left)

    def start(self, request_id: int, job: Any) -> None:
        self.jobs[request_id] = (job, self.steps)

    def advance(self) -> list[tuple[int, Any]]:
        """One step on: the (request id, job) pairs that land now."""
        landed = []
        for request_id, (job, left) in list(self.jobs.items()):
            if left > 1:
                self.jobs[request_id] = (job, left - 1)
            else:
                del self.jobs[request_id]
                landed.append((request_id, job))
        return landed


class LoadingWorker(KVConnectorWorker):
    """A worker whose loads land ``load_steps`` steps after they start (``in_flight``): it
    notes each request whose load landed in ``received`` and each block a load failed to fill
    in ``failed_blocks``, and reports each once."""

    def __init__(self, load_steps: int) -> None:
        self.in_flight = LoadsInFlight(load_steps)
        self.received: set[int] = set()
        self.failed_blocks: set[int] = set()

    def get_finished(self, finished_req_ids: set[int]) -> tuple[set[int], set[int]]:
        received, self.received = self.received, set()
        return set(), received

    def get_block_ids_with_load_errors(self) -> set[int]:
        failed, self.failed_blocks = self.failed_blocks, set()
        return failed


def poison_block(pool: KVPool, block: int) -> None:
    """Fill ``block`` with NaN in every layer: what a failed copy leaves is garbage, and NaN
    makes any read of it show in the output."""
    for layer in pool.k + pool.v:
        layer[block] = float("nan")
