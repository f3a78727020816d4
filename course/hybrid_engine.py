"""A tiny hybrid model served through one pool of blocks, by chapter 9's kind of engine:
sliding-window and full-attention layers interleaved, every group's K/V in pages of one pool,
prefill in chunks under a token budget, token for token equal to contiguous generation with
the window's mask.

    layers      0 sliding  1 full  2 sliding  3 full        (TinyConfig.windows)
    groups      sliding: layers 0, 2     full: layers 1, 3   (one block table each)
    pool        K and V [num_blocks, block_size, kv_heads, dim] at each place in a group:
                place 0 holds layers 0 and 1, place 1 layers 2 and 3

A layer reads and writes its K/V in its place's tensors, at the blocks of its group's table.
A block belongs to one group's table at a time, so the layers sharing a place never write
the same block: the pool costs a group's layers, not all of them (vLLM's hybrid KV cache
manager shares its tensors across groups the same way).

Each step gives the running requests, oldest first, room in every group for their next
tokens (``HybridBlockManager.allocate_slots``, which first frees the blocks the windows left
behind): as many of the tokens each knows as the step's token budget has left, a prompt's
chunk or one decode. Where the pool runs short, the newest request is preempted (its blocks
freed, its tokens computed again later; a request the whole pool cannot hold is refused with
``ValueError``). The step's chunks run through chapter 9's model step (``engine_step``): its
requests and chunks are chapter 9's, its batch carries a block table and slot mapping per
group (``HybridBatch``), and a layer's attention (``attend``) writes and reads its place's
tensors through its group's, a sliding-window layer's queries seeing their windows alone, so
no step reads a block its table has given back.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from course.chunked_engine import VarlenBatch, build_varlen_batch, engine_step
from course.chunked_scheduler import Chunk, ChunkedRequest, Schedule
from course.hybrid_manager import HybridBlockManager
from course.hybrid_prefix import HybridPrefixCache
from course.tiny_model import TinyModel
from kernels.paged_attention_ref import write_kv
from kernels.sliding_window_attention import window_attention, window_attention_reference
from kernels.varlen_attention import varlen_attention
from kernels.varlen_attention_ref import varlen_paged_attention

# (query, k_cache, v_cache, query_start_loc, seq_lens, block_tables, window or None, scale)
Attend = Callable[..., torch.Tensor]


def attend_in_pytorch(query, k_cache, v_cache, query_start_loc, seq_lens, block_tables, window,
                      scale):
    """Variable-length paged attention: chapter 9's over every earlier token, or over the
    window alone (chapter 10's reference, through chapter 9's)."""
    if window is None:
        return varlen_paged_attention(query, k_cache, v_cache, query_start_loc, seq_lens,
                                      block_tables, scale)
    return window_attention_reference(query, k_cache, v_cache, query_start_loc, seq_lens,
                                      block_tables, window, scale)


def attend_in_triton(query, k_cache, v_cache, query_start_loc, seq_lens, block_tables, window,
                     scale):
    """The same through chapter 9's one Triton kernel: its first key 0, or the window's
    (``window_first_key``)."""
    if window is None:
        return varlen_attention(query, k_cache, v_cache, query_start_loc, seq_lens,
                                block_tables, scale)
    return window_attention(query, k_cache, v_cache, query_start_loc, seq_lens, block_tables,
                            window, scale)


@dataclass
class HybridBatch(VarlenBatch):
    """Chapter 9's batch with a slot mapping and block tables for each group; its own
    ``slot_mapping`` and ``block_tables`` are the first group's."""

    group_slots: list[torch.Tensor]  # per group: [num_tokens] int64
    group_tables: list[torch.Tensor]  # per group: [num_seqs, max_blocks] int32, padded with 0


@dataclass
class _GroupTables:
    """One group's block tables, read as chapter 9's batch builder reads a manager's."""

    manager: HybridBlockManager
    group: int

    @property
    def block_size(self) -> int:
        return self.manager.block_size

    def block_table(self, request: int) -> list[int]:
        return self.manager.tables[request][self.group]


class HybridEngine:
    """Serves ``model`` (its ``config.windows`` name each layer's window) from a pool of
    ``num_blocks`` blocks of ``block_size`` tokens, at most ``max_num_batched_tokens`` tokens a
    step; ``attention`` computes a layer's variable-length paged attention (by default
    ``attend_in_triton``, chapter 9's kernel, on a CUDA GPU, else ``attend_in_pytorch``). With
    ``prefix_caching``, a request starts from the longest prefix every group has cached
    (``HybridPrefixCache``), and its tokens there are not computed again. ``manager_class``
    replaces the manager's class (one built on ``HybridBlockManager``, or on
    ``HybridPrefixCache`` with ``prefix_caching``: a learner's ``allocate_slots`` in it);
    ``step`` the model step (chapter 9's ``engine_step``)."""

    def __init__(self, model: TinyModel, num_blocks: int, block_size: int,
                 attention: Attend | None = None, prefix_caching: bool = False,
                 max_num_batched_tokens: int = 64,
                 manager_class: type[HybridBlockManager] | None = None,
                 step: Callable = engine_step) -> None:
        c = model.config
        windows = [c.window(layer) for layer in range(c.num_layers)]
        kinds = list(dict.fromkeys(windows))  # each window once, in the order layers have it
        self.group_layers = [[i for i, w in enumerate(windows) if w == kind] for kind in kinds]
        if len({len(layers) for layers in self.group_layers}) != 1:
            raise ValueError(f"every group needs as many layers (windows {windows})")
        self.place = {layer: (group, index) for group, layers in enumerate(self.group_layers)
                      for index, layer in enumerate(layers)}
        on_gpu = model.embedding.device.type == "cuda" and \
            os.environ.get("TRITON_INTERPRET") != "1"
        self.model, self.block_size = model, block_size
        self.attention = attention or (attend_in_triton if on_gpu else attend_in_pytorch)
        self.model_step = step
        self.max_num_batched_tokens = max_num_batched_tokens
        self.prefix_caching = prefix_caching
        manager = manager_class or (HybridPrefixCache if prefix_caching else HybridBlockManager)
        self.manager = manager(num_blocks, block_size, kinds)
        shape = (num_blocks, block_size, c.num_kv_heads, c.head_dim)
        device = model.embedding.device
        # NaN until written: a read of a slot no step wrote poisons the output at once
        self.k = [torch.full(shape, float("nan"), device=device) for _ in self.group_layers[0]]
        self.v = [torch.full(shape, float("nan"), device=device) for _ in self.group_layers[0]]
        self.waiting: deque[ChunkedRequest] = deque()
        self.running: list[ChunkedRequest] = []
        self.preemptions = 0
        self.hit_tokens = 0  # tokens prefix hits spared computing

    def add(self, request: ChunkedRequest) -> None:
        self.waiting.append(request)

    def step(self) -> list[ChunkedRequest]:
        """The next tokens of the requests the budget and the pool have room for; returns the
        requests it finished."""
        self.running += self.waiting
        self.waiting.clear()
        plan = Schedule()
        budget = self.max_num_batched_tokens
        while self.running and budget:
            request = self.running.pop(0)
            if self.prefix_caching and request.id not in self.manager.tables:
                # starting, or starting again after preemption: from its longest hit
                request.num_computed_tokens = self.manager.allocate_prefix(request.id,
                                                                           request.tokens)
                self.hit_tokens += request.num_computed_tokens
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if self.manager.allocate_slots(request.id, request.num_computed_tokens, num_new):
                plan.chunks.append(Chunk(request, request.num_computed_tokens, num_new))
                request.num_computed_tokens += num_new
                budget -= num_new
                continue
            if not plan.chunks and not self.running:  # the pool is all its own, and too small
                raise ValueError(f"request {request.id} needs more blocks than the pool holds "
                                 f"for its first {request.num_computed_tokens + num_new} "
                                 "tokens")
            self.running.insert(0, request)
            self._preempt(self.running.pop())  # the newest request
        scheduled = [chunk.request for chunk in plan.chunks]
        self.running = scheduled + self.running  # the budget's leftovers last
        if plan.chunks:
            self.model_step(self, plan)
        if self.prefix_caching:
            for request in scheduled:
                self.manager.cache_full_blocks(request.id, request.tokens,
                                               request.num_computed_tokens)
        finished = [request for request in scheduled if request.done]
        for request in finished:
            self.manager.free(request.id)
            self.running.remove(request)
        return finished

    def _preempt(self, request: ChunkedRequest) -> None:
        """Free every block ``request`` holds; it computes its tokens again when it runs."""
        self.manager.free(request.id)
        request.num_computed_tokens = 0
        self.waiting.appendleft(request)
        self.preemptions += 1

    def build_batch(self, plan: Schedule) -> HybridBatch:
        """The step's batch, on the model's device: chapter 9's, built once per group (its
        slots and block tables from that group's tables)."""
        per_group = [build_varlen_batch(_GroupTables(self.manager, group), plan.chunks)
                     for group in range(len(self.group_layers))]
        device = self.model.embedding.device
        first = per_group[0].to(device)
        return HybridBatch(*(getattr(first, f.name) for f in fields(VarlenBatch)),
                           [batch.slot_mapping.to(device) for batch in per_group],
                           [batch.block_tables.to(device) for batch in per_group])

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               batch: HybridBatch) -> torch.Tensor:
        """Layer ``layer``'s attention: its K/V written in its place's tensors at its group's
        slots, then attention over its group's block tables, within its window if it has
        one."""
        group, place = self.place[layer]
        write_kv(self.k[place], self.v[place], k, v, batch.group_slots[group])
        return self.attention(q, self.k[place], self.v[place], batch.query_start_loc,
                              batch.seq_lens, batch.group_tables[group],
                              self.model.config.window(layer), self.model.scale)


def serve(engine: HybridEngine, requests: list[ChunkedRequest], max_steps: int = 100_000
          ) -> list[ChunkedRequest]:
    """Run ``engine`` until every request is done; the requests, in the order given."""
    for request in requests:
        engine.add(request)
    for _ in range(max_steps):
        if all(r.done for r in requests):
            return requests
        engine.step()
    raise RuntimeError(f"not done after {max_steps} steps")
