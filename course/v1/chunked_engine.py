"""Chapter 9: the tiny model served by an engine with chunked prefill and prefix hits, every
token through one variable-length paged attention.

    requests --> ChunkedScheduler.step (schedule_step) --> Schedule: chunks
                 build_varlen_batch: the chunks' tokens packed, their positions, slots,
                                     query_start_loc, seq_lens, block tables
                 engine_step: at every layer engine.attend (vLLM's Attention layer: write the
                              new K/V through the slot mapping, then varlen_paged_attention
                              or the Triton kernel), sample where a request's known tokens
                              are all computed
                 finish done requests (their blocks return to the pool, cached ones stay hits)

Chapter 8's engine ran a prefill as contiguous attention over its own fresh K/V and only
decodes read the paged cache; here prefill chunks and decodes are one batch, and every query
reads all of its keys from the paged cache, the ones it has just written included, which is
what lets a prefix-cache hit skip its tokens' compute.

Answers are the bodies between ``### BEGIN SOLUTION`` and ``### END SOLUTION``: chapter 9's
notebook renders its cells from them, and a learner edition replaces them with stubs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from course.tiny_model import TinyModel
from course.v0.paged_engine import KVPool
from course.v1.chunked_scheduler import (
    Chunk,
    ChunkedRequest,
    ChunkedScheduler,
    Schedule,
    schedule_step,
)
from course.v1.kv_coordinator import KVCacheCoordinator
from kernels.paged_attention_ref import write_kv
from kernels.varlen_attention_ref import varlen_paged_attention


@dataclass
class VarlenBatch:
    """The tensors one step needs: its chunks' tokens packed, one row per token, and per
    request where its tokens start and what it attends over (vLLM's attention metadata).
    ``slot_mapping`` and ``block_tables`` are the first KV-cache group's; the engine's batch
    has every group's in ``group_slots`` and ``group_tables`` (``ChunkedEngine.build_batch``)."""

    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64: each token's position in its request
    slot_mapping: torch.Tensor  # [num_tokens] int64: where its K/V go in the pool
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32: request r's tokens start here
    seq_lens: torch.Tensor  # [num_seqs] int32: context after this step (cached + new)
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, padded with 0
    group_slots: list[torch.Tensor] = field(default_factory=list)  # per group, as slot_mapping
    group_tables: list[torch.Tensor] = field(default_factory=list)  # per group, as block_tables

    def to(self, device: torch.device | str) -> VarlenBatch:
        return VarlenBatch(*(t.to(device) for t in (
            self.input_ids, self.positions, self.slot_mapping, self.query_start_loc,
            self.seq_lens, self.block_tables)),
            [t.to(device) for t in self.group_slots], [t.to(device) for t in self.group_tables])


class Tables(Protocol):
    """Where a batch finds its requests' block tables: a group of the KV cache."""

    block_size: int

    def block_table(self, request_id: int) -> list[int]: ...


@dataclass
class GroupTables:
    """Group ``group``'s block tables in ``kv_cache``, as ``build_varlen_batch`` reads them."""

    kv_cache: KVCacheCoordinator
    group: int = 0

    @property
    def block_size(self) -> int:
        return self.kv_cache.block_size

    def block_table(self, request_id: int) -> list[int]:
        return self.kv_cache.block_table(request_id, self.group)


def build_varlen_batch(manager: Tables, chunks: list[Chunk]) -> VarlenBatch:
    """The batch of ``chunks``: chunk c computes positions c.start .. c.end - 1 of its
    request, whose slots ``manager`` holds (a group's tables); past the request's known
    tokens, its drafts (``course.v1.spec_decode``)."""
    ids, positions, slots, starts, lengths, tables = [], [], [], [0], [], []
    for chunk in chunks:
        table, size = manager.block_table(chunk.request.id), manager.block_size
        span = range(chunk.start, chunk.end)
        ids += chunk.request.tokens_with_spec[chunk.start:chunk.end]
        positions += span
        slots += [table[p // size] * size + p % size for p in span]
        starts.append(starts[-1] + chunk.num_tokens)
        lengths.append(chunk.end)
        tables.append(table)
    width = max((len(t) for t in tables), default=1)
    return VarlenBatch(torch.tensor(ids, dtype=torch.int64),
                       torch.tensor(positions, dtype=torch.int64),
                       torch.tensor(slots, dtype=torch.int64),
                       torch.tensor(starts, dtype=torch.int32),
                       torch.tensor(lengths, dtype=torch.int32),
                       torch.tensor([t + [0] * (width - len(t)) for t in tables],
                                    dtype=torch.int32).reshape(len(tables), width))


def default_attention(device: torch.device) -> Callable:
    """Chapter 9's Triton kernel on a CUDA GPU, else ``varlen_paged_attention`` in PyTorch."""
    if device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        from kernels.varlen_attention import varlen_attention

        return varlen_attention
    return varlen_paged_attention


@dataclass
class ChunkRecord:
    """What one step computed: (request, start, tokens, kind) per chunk, kind "decode"
    (one token after the prompt), "prefill" (a chunk of the prompt), "verify" (the newest
    token and drafts, chapter 12) or "recompute" (a chunk of generated tokens, after a
    preemption); and the requests preempted."""

    step: int
    chunks: list[tuple[int, int, int, str]]
    preempted: list[int]
    budget: int


class ChunkedEngine:
    """The tiny model behind a ``ChunkedScheduler`` and a KV pool.

    The model's layers fall into KV-cache groups by their window (``model.config.windows``;
    None: full attention), in the order layers first have them; every group has as many
    layers, and a group's ``i``-th layer keeps its K/V in the pool's ``i``-th place (block
    tensors shared by the groups: a block belongs to one group's table at a time, so the
    pool costs a group's layers, not all of them, as vLLM's hybrid KV cache manager does).
    ``kv_cache`` builds the KV cache from (num_blocks, block_size, windows, enable_caching):
    chapter 9's ``KVCacheCoordinator``, or chapter 10's for sliding windows.

    ``schedule`` is the scheduling step (by default ``schedule_step``), ``step`` the model
    step (by default ``engine_step``), ``attention`` the variable-length paged attention (by
    default the Triton kernel on a CUDA GPU, else ``varlen_paged_attention``), and
    ``window_attention`` the same within a sliding window (chapter 10's; it takes the window
    before the scale).
    """

    def __init__(self, model: TinyModel, num_blocks: int, block_size: int,
                 max_num_batched_tokens: int, max_num_seqs: int = 64,
                 attention: Callable | None = None, schedule: Callable | None = None,
                 step: Callable | None = None, kv_cache: Callable = KVCacheCoordinator,
                 window_attention: Callable | None = None, enable_caching: bool = True) -> None:
        c = model.config
        windows = [c.window(layer) for layer in range(c.num_layers)]
        kinds = list(dict.fromkeys(windows))
        self.group_layers = [[i for i, w in enumerate(windows) if w == kind] for kind in kinds]
        if len({len(layers) for layers in self.group_layers}) != 1:
            raise ValueError(f"every group needs as many layers (windows {windows})")
        self.place = {layer: (group, index) for group, layers in enumerate(self.group_layers)
                      for index, layer in enumerate(layers)}
        self.model = model
        self.scheduler = ChunkedScheduler(
            num_blocks, block_size, max_num_batched_tokens, max_num_seqs,
            kv_cache(num_blocks, block_size, kinds, enable_caching))
        self.pool = self.empty_pool(num_blocks, block_size, len(self.group_layers[0]))
        self.attention = attention or default_attention(model.embedding.device)
        self.window_attention = window_attention
        self.schedule = schedule or schedule_step
        self.model_step = step or engine_step
        self.records: list[ChunkRecord] = []
        self.admitted: set[int] = set()
        self.prompt_tokens = 0  # prompt tokens of every request admitted
        self.prompt_hits = 0  # of them, found in the prefix cache at first admission
        self.steps = 0

    @property
    def kv_cache(self) -> KVCacheCoordinator:
        return self.scheduler.kv_cache

    def empty_pool(self, num_blocks: int, block_size: int, places: int) -> KVPool:
        """The pool's tensors, ``places`` layers' worth (chapter 13's engines store K/V in
        other forms)."""
        return KVPool.empty(self.model, num_blocks, block_size, places)

    def build_batch(self, plan: Schedule) -> VarlenBatch:
        """The step's batch, on the model's device: the first group's, with every group's
        slots and block tables."""
        groups = [build_varlen_batch(GroupTables(self.kv_cache, group), plan.chunks)
                  for group in range(len(self.group_layers))]
        first = groups[0]
        first.group_slots = [batch.slot_mapping for batch in groups]
        first.group_tables = [batch.block_tables for batch in groups]
        return first.to(self.model.embedding.device)

    def step(self) -> Schedule:
        """Schedule, note what is to be computed, run the model on the chunks."""
        plan = self.scheduler.step(self.schedule)
        self.note(plan)
        self.execute(plan)
        self.steps += 1
        return plan

    def execute(self, plan: Schedule) -> None:
        """Run the model on the step's chunks, if there are any."""
        if plan.chunks:
            self.model_step(self, plan)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               batch: VarlenBatch) -> torch.Tensor:
        """Layer ``layer``'s attention, as vLLM's ``Attention`` layer runs it: write the new
        tokens' ``k`` and ``v`` at the batch's slots in the layer's group (chapter 6's
        ``write_kv``) before attending, since each token attends to itself; then read
        (``read_attention``). A connector waits and saves around it
        (``course.v1.connector_engine``)."""
        group, place = self.place[layer]
        k_cache, v_cache = self.pool.k[place], self.pool.v[place]
        write_kv(k_cache, v_cache, k, v, batch.group_slots[group])
        return self.read_attention(layer, q, k_cache, v_cache, batch)

    def read_attention(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, batch: VarlenBatch) -> torch.Tensor:
        """``self.attention`` of ``q`` over the layer's K/V in ``k_cache`` and ``v_cache``,
        through its group's block tables, within its window if it has one."""
        tables = batch.group_tables[self.place[layer][0]]
        window = self.model.config.window(layer)
        if window is None:
            return self.attention(q, k_cache, v_cache, batch.query_start_loc, batch.seq_lens,
                                  tables, self.model.scale)
        if self.window_attention is None:
            raise ValueError(f"layer {layer} slides (a window of {window}): give the engine "
                             "chapter 10's window_attention")
        return self.window_attention(q, k_cache, v_cache, batch.query_start_loc,
                                     batch.seq_lens, tables, window, self.model.scale)

    def note(self, plan: Schedule) -> None:
        """Record the step's chunks by kind, and the prompt tokens a first admission skips."""
        kinds = []
        for chunk in plan.chunks:
            request, prompt = chunk.request, len(chunk.request.prompt)
            kind = ("prefill" if chunk.start < prompt else
                    "verify" if chunk.end > request.num_tokens else
                    "decode" if chunk.num_tokens == 1 else "recompute")
            if request.id not in self.admitted:  # its first admission: its prefix hits
                self.admitted.add(request.id)
                self.prompt_hits += chunk.start
                self.prompt_tokens += prompt
            kinds.append((request.id, chunk.start, chunk.num_tokens, kind))
        self.records.append(ChunkRecord(self.steps, kinds, list(plan.preempted),
                                        self.scheduler.max_num_batched_tokens))


def engine_step(engine: ChunkedEngine, plan: Schedule) -> None:
    """Run the model on ``plan``'s chunks (``engine.build_batch(plan)``): at every layer the
    tokens' q, k, v at their positions, then the layer's attention (``engine.attend(layer, q,
    k, v, batch)``); every request whose chunk ends at its last known token (``chunk.end ==
    chunk.request.num_tokens``) emits the greedy token from its chunk's last row's logits."""
    ### BEGIN SOLUTION
    model = engine.model
    batch = engine.build_batch(plan)
    x = model.embed(batch.input_ids)
    for layer in range(model.config.num_layers):
        q, k, v = model.qkv(layer, x, batch.positions)
        x = model.finish_layer(layer, x, engine.attend(layer, q, k, v, batch))
    last_rows = batch.query_start_loc[1:].long() - 1
    logits = model.logits(x[last_rows])
    for chunk, row in zip(plan.chunks, logits, strict=True):
        if chunk.end == chunk.request.num_tokens:
            chunk.request.emit(int(row.argmax()), row)
    ### END SOLUTION


def engine_requests(specs: list[tuple[list[int], int, int]]) -> list[ChunkedRequest]:
    """Requests numbered 0, 1, ... from ``(prompt, output_len, arrival)`` triples."""
    return [ChunkedRequest(i, list(prompt), output_len, arrival)
            for i, (prompt, output_len, arrival) in enumerate(specs)]


def serve_chunked(engine: ChunkedEngine, requests: list[ChunkedRequest],
                  max_steps: int = 10_000) -> list[ChunkedRequest]:
    """Run ``requests`` (each joining at step ``arrival``) to completion, in finishing
    order."""
    pending = sorted(requests, key=lambda r: (r.arrival, r.id))
    finished: list[ChunkedRequest] = []
    for step in range(max_steps):
        if not pending and not engine.scheduler.busy():
            return finished
        while pending and pending[0].arrival <= step:
            engine.scheduler.add(pending.pop(0))
        engine.step()
        for request in list(engine.scheduler.running):
            if request.done:
                engine.scheduler.finish(request)
                finished.append(request)
    raise RuntimeError(f"requests still unfinished after {max_steps} steps")
