"""A tiny hybrid model served through one pool of blocks: sliding-window and full-attention
layers interleaved, every group's K/V in pages of one pool, token for token equal to
contiguous generation with the window's mask.

    layers      0 sliding  1 full  2 sliding  3 full        (TinyConfig.windows)
    groups      sliding: layers 0, 2     full: layers 1, 3   (one block table each)
    pool        K and V [num_blocks, block_size, kv_heads, dim] at each place in a group:
                place 0 holds layers 0 and 1, place 1 layers 2 and 3

A layer reads and writes its K/V in its place's tensors, at the blocks of its group's table.
A block belongs to one group's table at a time, so the layers sharing a place never write
the same block: the pool costs a group's layers, not all of them (vLLM's hybrid KV cache
manager shares its tensors across groups the same way).

Each step gives every running request room for one more token in every group
(``HybridBlockManager.allocate_slots``, which first frees the blocks the windows left
behind), preempting the newest request where the pool runs short (its blocks freed, its
tokens computed again later; a request the whole pool cannot hold is refused with
``ValueError``), then runs each request's next token through the model: a
prompt token, or the token it generated last. A sliding-window layer attends over its window
alone; no step reads a block its table has given back.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from course.hybrid_manager import HybridBlockManager
from course.hybrid_prefix import HybridPrefixCache
from course.tiny_model import TinyModel
from kernels.paged_attention_ref import paged_decode_attention, write_kv
from kernels.sliding_window_attention import sliding_window_reference

# (query, k_cache, v_cache, block_tables, seq_lens, window or None, scale) -> output
Attend = Callable[..., torch.Tensor]


def attend_in_pytorch(query, k_cache, v_cache, block_tables, seq_lens, window, scale):
    """Paged decode attention: chapter 6's over every token, or over the window alone."""
    if window is None:
        return paged_decode_attention(query, k_cache, v_cache, block_tables, seq_lens, scale)
    return sliding_window_reference(query, k_cache, v_cache, block_tables, seq_lens, window,
                                    scale)


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
    ``num_blocks`` blocks of ``block_size`` tokens; ``attend`` computes a layer's paged decode
    attention (``attend_in_pytorch``, or Triton kernels with the same arguments). With
    ``prefix_caching``, a request starts from the longest prefix every group has cached
    (``HybridPrefixCache``), and its tokens there are not computed again."""

    def __init__(self, model: TinyModel, num_blocks: int, block_size: int,
                 attend: Attend = attend_in_pytorch, prefix_caching: bool = False) -> None:
        c = model.config
        windows = [c.window(layer) for layer in range(c.num_layers)]
        kinds = list(dict.fromkeys(windows))  # each window once, in the order layers have it
        self.group_layers = [[i for i, w in enumerate(windows) if w == kind] for kind in kinds]
        if len({len(layers) for layers in self.group_layers}) != 1:
            raise ValueError(f"every group needs as many layers (windows {windows})")
        self.place = {layer: (group, index) for group, layers in enumerate(self.group_layers)
                      for index, layer in enumerate(layers)}
        self.model, self.block_size, self.attend = model, block_size, attend
        manager = HybridPrefixCache if prefix_caching else HybridBlockManager
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
        """One token of every request that gets room; returns the requests it finished."""
        self.running += self.waiting
        self.waiting.clear()
        scheduled = []
        while self.running:
            request = self.running.pop(0)
            if isinstance(self.manager, HybridPrefixCache) and \
                    request.id not in self.manager.tables:  # starting, or again after preemption
                request.num_computed = self.manager.allocate_prefix(request.id, request.tokens)
                self.hit_tokens += request.num_computed
            if self.manager.allocate_slots(request.id, request.num_computed, 1):
                scheduled.append(request)
                continue
            if not scheduled and not self.running:  # the pool is all its own, and too small
                raise ValueError(f"request {request.id} needs more blocks than the pool holds "
                                 f"({len(request.tokens)} tokens)")
            self.running.insert(0, request)
            self._preempt(self.running.pop())  # the newest request
        self.running = scheduled
        if scheduled:
            self._run(scheduled)
        finished = [r for r in scheduled if r.done]
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

    def _run(self, requests: list[HybridRequest]) -> None:
        model, size = self.model, self.block_size
        positions = torch.tensor([r.num_computed for r in requests])
        tokens = torch.tensor([r.tokens[r.num_computed] for r in requests])
        device = model.embedding.device
        positions, tokens = positions.to(device), tokens.to(device)
        seq_lens = (positions + 1).to(torch.int32)
        tables, slots = [], []
        for group in range(len(self.group_layers)):
            rows = [self.manager.tables[r.id][group] for r in requests]
            width = max(len(row) for row in rows)
            tables.append(torch.tensor([row + [0] * (width - len(row)) for row in rows],
                                       dtype=torch.int32, device=device))
            slots.append(torch.tensor([row[r.num_computed // size] * size
                                       + r.num_computed % size
                                       for row, r in zip(rows, requests, strict=True)],
                                      device=device))
        x = model.embed(tokens)
        for layer in range(model.config.num_layers):
            group, place = self.place[layer]
            q, k, v = model.qkv(layer, x, positions)
            write_kv(self.k[place], self.v[place], k, v, slots[group])
            out = self.attend(q, self.k[place], self.v[place], tables[group], seq_lens,
                              model.config.window(layer), model.scale)
            x = model.finish_layer(layer, x, out)
        logits = model.logits(x)
        for request, row in zip(requests, logits, strict=True):
            request.num_computed += 1
            if request.num_computed == len(request.tokens):  # its last known token: sample
                request.output.append(int(row.argmax()))
                request.logits.append(row)
            if isinstance(self.manager, HybridPrefixCache):
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
