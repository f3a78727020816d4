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
``ValueError``). The step's tokens run through the model packed, one variable-length batch
(chapter 9's attention metadata, a block table per group); a sliding-window layer's queries
see their windows alone, and no step reads a block its table has given back.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from course.hybrid_manager import HybridBlockManager
from course.hybrid_prefix import HybridPrefixCache
from course.tiny_model import TinyModel
from kernels.paged_attention_ref import write_kv
from kernels.sliding_window_varlen import window_varlen_reference
from kernels.varlen_attention_ref import varlen_paged_attention

# (query, k_cache, v_cache, query_start_loc, seq_lens, block_tables, window or None, scale)
Attend = Callable[..., torch.Tensor]


def attend_in_pytorch(query, k_cache, v_cache, query_start_loc, seq_lens, block_tables, window,
                      scale):
    """Variable-length paged attention: chapter 9's over every earlier token, or over the
    window alone."""
    if window is None:
        return varlen_paged_attention(query, k_cache, v_cache, query_start_loc, seq_lens,
                                      block_tables, scale)
    return window_varlen_reference(query, k_cache, v_cache, query_start_loc, seq_lens,
                                   block_tables, window, scale)


@dataclass
class HybridRequest:
    id: int
    prompt: list[int]
    max_new_tokens: int
    output: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    num_computed: int = 0  # tokens whose K/V are in the cache

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_new_tokens


class HybridEngine:
    """Serves ``model`` (its ``config.windows`` name each layer's window) from a pool of
    ``num_blocks`` blocks of ``block_size`` tokens, at most ``max_num_batched_tokens`` tokens a
    step; ``attend`` computes a layer's variable-length paged attention
    (``attend_in_pytorch``, or Triton kernels with the same arguments). With
    ``prefix_caching``, a request starts from the longest prefix every group has cached
    (``HybridPrefixCache``), and its tokens there are not computed again. ``manager_class``
    replaces the manager's class (one built on ``HybridBlockManager``, or on
    ``HybridPrefixCache`` with ``prefix_caching``: a learner's ``allocate_slots`` in it)."""

    def __init__(self, model: TinyModel, num_blocks: int, block_size: int,
                 attend: Attend = attend_in_pytorch, prefix_caching: bool = False,
                 max_num_batched_tokens: int = 64,
                 manager_class: type[HybridBlockManager] | None = None) -> None:
        c = model.config
        windows = [c.window(layer) for layer in range(c.num_layers)]
        kinds = list(dict.fromkeys(windows))  # each window once, in the order layers have it
        self.group_layers = [[i for i, w in enumerate(windows) if w == kind] for kind in kinds]
        if len({len(layers) for layers in self.group_layers}) != 1:
            raise ValueError(f"every group needs as many layers (windows {windows})")
        self.place = {layer: (group, index) for group, layers in enumerate(self.group_layers)
                      for index, layer in enumerate(layers)}
        self.model, self.block_size, self.attend = model, block_size, attend
        self.max_num_batched_tokens = max_num_batched_tokens
        self.prefix_caching = prefix_caching
        manager = manager_class or (HybridPrefixCache if prefix_caching else HybridBlockManager)
        self.manager = manager(num_blocks, block_size, kinds)
        shape = (num_blocks, block_size, c.num_kv_heads, c.head_dim)
        device = model.embedding.device
        # NaN until written: a read of a slot no step wrote poisons the output at once
        self.k = [torch.full(shape, float("nan"), device=device) for _ in self.group_layers[0]]
        self.v = [torch.full(shape, float("nan"), device=device) for _ in self.group_layers[0]]
        self.waiting: deque[HybridRequest] = deque()
        self.running: list[HybridRequest] = []
        self.preemptions = 0
        self.hit_tokens = 0  # tokens prefix hits spared computing

    def add(self, request: HybridRequest) -> None:
        self.waiting.append(request)

    def step(self) -> list[HybridRequest]:
        """The next tokens of the requests the budget and the pool have room for; returns the
        requests it finished."""
        self.running += self.waiting
        self.waiting.clear()
        scheduled: list[tuple[HybridRequest, int]] = []  # (request, its new tokens)
        budget = self.max_num_batched_tokens
        while self.running and budget:
            request = self.running.pop(0)
            if self.prefix_caching and request.id not in self.manager.tables:
                # starting, or starting again after preemption: from its longest hit
                request.num_computed = self.manager.allocate_prefix(request.id, request.tokens)
                self.hit_tokens += request.num_computed
            num_new = min(len(request.tokens) - request.num_computed, budget)
            if self.manager.allocate_slots(request.id, request.num_computed, num_new):
                scheduled.append((request, num_new))
                budget -= num_new
                continue
            if not scheduled and not self.running:  # the pool is all its own, and too small
                raise ValueError(f"request {request.id} needs more blocks than the pool holds "
                                 f"for its first {request.num_computed + num_new} tokens")
            self.running.insert(0, request)
            self._preempt(self.running.pop())  # the newest request
        self.running = [r for r, _ in scheduled] + self.running  # the budget's leftovers last
        if scheduled:
            self._run(scheduled)
        finished = [r for r, _ in scheduled if r.done]
        for request in finished:
            self.manager.free(request.id)
            self.running.remove(request)
        return finished

    def _preempt(self, request: HybridRequest) -> None:
        """Free every block ``request`` holds; it computes its tokens again when it runs."""
        self.manager.free(request.id)
        request.num_computed = 0
        self.waiting.appendleft(request)
        self.preemptions += 1

    def _run(self, scheduled: list[tuple[HybridRequest, int]]) -> None:
        model, size = self.model, self.block_size
        device = model.embedding.device
        positions = [p for r, n in scheduled for p in range(r.num_computed, r.num_computed + n)]
        tokens = [r.tokens[p] for r, n in scheduled
                  for p in range(r.num_computed, r.num_computed + n)]
        ends = torch.tensor([n for _, n in scheduled]).cumsum(0)
        query_start_loc = torch.cat([torch.zeros(1, dtype=torch.long), ends]).to(torch.int32)
        seq_lens = torch.tensor([r.num_computed + n for r, n in scheduled], dtype=torch.int32)
        tables, slots = [], []
        for group in range(len(self.group_layers)):
            rows = [self.manager.tables[r.id][group] for r, _ in scheduled]
            width = max(len(row) for row in rows)
            tables.append(torch.tensor([row + [0] * (width - len(row)) for row in rows],
                                       dtype=torch.int32, device=device))
            slots.append(torch.tensor([row[p // size] * size + p % size
                                       for row, (r, n) in zip(rows, scheduled, strict=True)
                                       for p in range(r.num_computed, r.num_computed + n)],
                                      device=device))
        query_start_loc, seq_lens = query_start_loc.to(device), seq_lens.to(device)
        positions_t = torch.tensor(positions, device=device)
        x = model.embed(torch.tensor(tokens, device=device))
        for layer in range(model.config.num_layers):
            group, place = self.place[layer]
            q, k, v = model.qkv(layer, x, positions_t)
            write_kv(self.k[place], self.v[place], k, v, slots[group])
            out = self.attend(q, self.k[place], self.v[place], query_start_loc, seq_lens,
                              tables[group], model.config.window(layer), model.scale)
            x = model.finish_layer(layer, x, out)
        logits = model.logits(x[ends - 1])  # each request's last token this step
        for (request, num_new), row in zip(scheduled, logits, strict=True):
            request.num_computed += num_new
            if request.num_computed == len(request.tokens):  # all it knows computed: sample
                request.output.append(int(row.argmax()))
                request.logits.append(row)
            if self.prefix_caching:
                self.manager.cache_full_blocks(request.id, request.tokens, request.num_computed)


def serve(engine: HybridEngine, requests: list[HybridRequest], max_steps: int = 100_000
          ) -> list[HybridRequest]:
    """Run ``engine`` until every request is done; the requests, in the order given."""
    for request in requests:
        engine.add(request)
    for _ in range(max_steps):
        if all(r.done for r in requests):
            return requests
        engine.step()
    raise RuntimeError(f"not done after {max_steps} steps")
