"""Chapter 11: a connector that keeps blocks in a CPU tier, as vLLM's ``OffloadingConnector``
(``vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py``) does.

Every full block an engine computes is saved to the tier (``CPUTier``, LRU or ARC) as the step
that completes it runs; a request admitted later whose prompt goes on past the GPU's prefix hit
into blocks the tier holds loads them into the fresh GPU blocks allocated for it, instead of
computing them::

    prompt's blocks    0  1  2  3  4  5 | 6 (its last token: always computed)
    GPU prefix cache   x  x                 hit: nothing moves
    CPU tier                 x  x  x        loaded: 3 blocks over PCIe, the request waits
    computed                          x  x  from the tier's first miss on

Loads are asynchronous: a request waits until its load is done, ``load_steps`` steps after it
starts, while the others run. A block whose copy fails (``failing_keys``, for tests) is filled
with NaN and reported; the engine computes its tokens again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course.v0.paged_engine import KVPool
from course.v0.prefix_cache import ROOT_KEY, block_key
from course.v1.chunked_scheduler import ChunkedRequest, Schedule
from course.v1.kv_connector import (
    KVConnectorMetadata,
    KVConnectorOutput,
    KVConnectorScheduler,
    LoadingWorker,
    poison_block,
)
from course.v1.offload_tier import CPUTier, Key


@dataclass(frozen=True)
class BlockCopy:
    """One block's copy between the GPU pool and the tier: which GPU block, which CPU block,
    and the block's prefix key."""

    gpu_block: int
    cpu_block: int
    key: Key


class OffloadingConnectorScheduler(KVConnectorScheduler):
    """Decides, from the tier's contents, what each request loads and which new blocks are
    saved. Holds no KV."""

    def __init__(self, tier: CPUTier, block_size: int) -> None:
        self.tier, self.block_size = tier, block_size
        self.keys: dict[int, list[Key]] = {}  # request id -> its full blocks' keys so far
        self.pending: dict[int, list[BlockCopy]] = {}  # loads decided, not handed over yet
        self.loading: dict[int, list[Key]] = {}  # loads handed over, not finished
        self.admissions: list[tuple[int, int, int, int]] = []  # id, tokens, GPU hit, loaded

    def block_keys(self, request: ChunkedRequest, num_blocks: int) -> list[Key]:
        """The prefix keys of the request's first ``num_blocks`` full blocks (chapter 4's)."""
        keys, size = self.keys.setdefault(request.id, []), self.block_size
        tokens = request.tokens
        while len(keys) < num_blocks:
            start = len(keys) * size
            keys.append(block_key(keys[-1] if keys else ROOT_KEY, tokens[start:start + size]))
        return keys[:num_blocks]

    def get_num_new_matched_tokens(self, request: ChunkedRequest,
                                   num_computed_tokens: int) -> tuple[int, bool]:
        """How many tokens after the GPU's hit of ``num_computed_tokens`` (whole blocks) the
        tier can load, and whether the load is asynchronous: ``(num_tokens, num_tokens > 0)``.

        The candidates are the request's blocks from the GPU hit's end, block
        ``num_computed_tokens // block_size``, up to but not including the block that holds
        its last token, block ``(request.num_tokens - 1) // block_size`` (that token is always
        computed, for its logits: chapter 4's rule). ``self.block_keys(request, n)`` gives the
        prefix keys of the first ``n`` blocks; ``self.tier.lookup(keys)`` says how many of
        ``keys``, from the first, the tier holds. Each block found is ``block_size`` tokens.
        """
        ### BEGIN SOLUTION
        first = num_computed_tokens // self.block_size
        last = (request.num_tokens - 1) // self.block_size
        found = self.tier.lookup(self.block_keys(request, last)[first:])
        return found * self.block_size, found > 0
        ### END SOLUTION

    def update_state_after_alloc(self, request: ChunkedRequest, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        self.admissions.append((request.id, request.num_tokens, request.num_computed_tokens,
                                num_external_tokens))
        if not num_external_tokens:
            return
        first = request.num_computed_tokens // self.block_size
        last = first + num_external_tokens // self.block_size
        keys = self.block_keys(request, last)[first:]
        cpu_blocks = self.tier.prepare_load(keys)  # protected from eviction until loaded
        self.tier.touch(keys)
        self.pending[request.id] = [BlockCopy(g, c, k) for g, c, k in
                                    zip(block_ids[first:last], cpu_blocks, keys, strict=True)]

    def build_connector_meta(self, schedule: Schedule,
                             block_ids: dict[int, list[int]]) -> KVConnectorMetadata:
        """What the worker does this step, as ``KVConnectorMetadata(loads, saves)``:

        * ``loads``: every load decided since the last step (``self.pending``: request id ->
          its ``BlockCopy`` list). Each is now in flight: record its keys in
          ``self.loading[request_id]`` (``update_connector_output`` completes them there),
          and empty ``self.pending``.
        * ``saves``: for each chunk of ``schedule.chunks`` (a request's tokens ``chunk.start``
          to ``chunk.end``), the full blocks the chunk completes, blocks ``chunk.start //
          block_size`` to ``chunk.end // block_size`` (not included): their keys
          (``self.block_keys``) go to ``self.tier.prepare_store(keys)``, which returns
          ``(stored, evicted)``, ``stored`` the ``(key, cpu_block)`` pairs to write (a key the
          tier holds already is not written again), or ``None`` when it has no room (the chunk
          saves nothing). Each pair becomes ``BlockCopy(gpu_block, cpu_block, key)``, the GPU
          block read from the request's table ``block_ids[request_id]`` at the block's index;
          ``saves[request_id]`` lists them, and a chunk with none adds no entry.
        """
        ### BEGIN SOLUTION
        metadata = KVConnectorMetadata(loads=self.pending)
        for request_id, copies in self.pending.items():
            self.loading[request_id] = [copy.key for copy in copies]
        self.pending = {}
        for chunk in schedule.chunks:  # the blocks this step fills, not in the tier yet
            first, last = chunk.start // self.block_size, chunk.end // self.block_size
            keys = self.block_keys(chunk.request, last)[first:]
            room = self.tier.prepare_store(keys)
            if room:  # None: every CPU block is being loaded or stored; skip these saves
                table = block_ids[chunk.request.id]
                where = {key: table[first + i] for i, key in enumerate(keys)}
                copies = [BlockCopy(where[key], cpu, key) for key, cpu in room[0]]
                if copies:
                    metadata.saves[chunk.request.id] = copies
        return metadata
        ### END SOLUTION

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        for request_id in output.finished_recving:
            self.tier.complete_load(self.loading.pop(request_id))
        self.tier.complete_store(output.worker_meta or [])

    def request_finished(self, request: ChunkedRequest,
                         block_ids: list[int]) -> tuple[bool, dict | None]:
        self.keys.pop(request.id, None)  # saves finish within their step: nothing to wait for
        return False, None


class OffloadingConnectorWorker(LoadingWorker):
    """Copies blocks between the engine's pool and ``num_cpu_blocks`` CPU blocks. A load takes
    ``load_steps`` steps (at least 1); a load of a key in ``failing_keys`` fails."""

    def __init__(self, num_cpu_blocks: int, load_steps: int = 1,
                 failing_keys: set[Key] | None = None) -> None:
        super().__init__(load_steps)
        self.num_cpu_blocks = num_cpu_blocks
        self.failing_keys = failing_keys or set()
        self.saved: list[Key] = []
        self.bytes_loaded = self.bytes_saved = 0

    def register_kv_caches(self, pool: KVPool) -> None:
        self.pool = pool
        shape = (self.num_cpu_blocks, *pool.k[0].shape[1:])
        self.cpu = KVPool([torch.zeros(shape) for _ in pool.k],
                          [torch.zeros(shape) for _ in pool.v])
        self.block_bytes = sum(t[0].numel() * t.element_size() for t in pool.k + pool.v)

    def start_load_kv(self) -> None:
        for request_id, copies in self.metadata.loads.items():
            self.in_flight.start(request_id, copies)
        for request_id, copies in self.in_flight.advance():
            for copy in copies:
                if copy.key in self.failing_keys:
                    self.failed_blocks.add(copy.gpu_block)
                    self.fail(copy)
                else:
                    self.load(copy)
                    self.bytes_loaded += self.block_bytes
            self.received.add(request_id)

    def load(self, copy: BlockCopy) -> None:
        """The copy of one block from the tier lands in the pool."""
        self.cpu.copy_blocks(self.pool, [(copy.cpu_block, copy.gpu_block)])

    def fail(self, copy: BlockCopy) -> None:
        """The copy of one block failed: the pool's block holds garbage."""
        poison_block(self.pool, copy.gpu_block)

    def wait_for_layer_load(self, layer: int) -> None:
        """Nothing to wait for: every load is asynchronous, and its request is not in the step
        until the load has landed."""

    def save_kv_layer(self, layer: int) -> None:
        for copies in self.metadata.saves.values():
            for copy in copies:
                self.cpu.k[layer][copy.cpu_block] = self.pool.k[layer][copy.gpu_block].cpu()
                self.cpu.v[layer][copy.cpu_block] = self.pool.v[layer][copy.gpu_block].cpu()

    def wait_for_save(self) -> None:
        for copies in self.metadata.saves.values():
            self.saved += [copy.key for copy in copies]
            self.bytes_saved += self.block_bytes * len(copies)

    def build_connector_worker_meta(self) -> list[Key]:
        saved, self.saved = self.saved, []
        return saved


def offloading_connector(num_cpu_blocks: int, block_size: int, policy: str = "lru",
                         load_steps: int = 1, failing_keys: set[Key] | None = None,
                         scheduler_half: type = OffloadingConnectorScheduler
                         ) -> tuple[OffloadingConnectorScheduler, OffloadingConnectorWorker]:
    """Both halves over one tier of ``num_cpu_blocks`` blocks evicted by ``policy``; the
    scheduler half of class ``scheduler_half`` (the notebook's, say)."""
    return (scheduler_half(CPUTier(num_cpu_blocks, policy), block_size),
            OffloadingConnectorWorker(num_cpu_blocks, load_steps, failing_keys))
