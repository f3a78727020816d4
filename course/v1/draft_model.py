"""Chapter 12: a draft model, and an EAGLE-shaped draft head, whose K/V live in the target's
pool::

    pool places   target layers ...           draft layers ...
    block tables  one full-attention group's, shared: a block holds both models' K/V for
                  its tokens, so the draft's K/V come back, are cached, hit and roll back
                  with the target's (vLLM keeps an EAGLE drafter's layers in the target's KV
                  cache the same way: more layers of a group)

    each step     the draft runs over the step's chunks too, writing its K/V at the same
                  slots (its prefill, its catching up on the tokens verification kept)
    after it      a decoding request's drafts: room for k more tokens from its newest (the
                  draft's lookahead slots, vLLM's num_lookahead_tokens), then k greedy steps
                  of the draft, each writing the K/V of the token it reads

A draft's K/V at a rejected token are left where they were written; the next proposal writes
from the newest token on, and the blocks past the computed tokens are given back by rollback,
as the target's are. A draft head (``DraftHead``) reads the target's hidden states, so it
follows each step after verification instead, and needs a prefix hit's last block computed
again (``KVCacheCoordinator.use_eagle``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from course.tiny_model import TinyModel
from course.v0.paged_engine import KVPool
from course.v1.chunked_engine import GroupTables, VarlenBatch, build_varlen_batch
from course.v1.chunked_scheduler import Chunk, ChunkedRequest, Schedule
from kernels.paged_attention_ref import write_kv

if TYPE_CHECKING:
    from course.v1.speculative_engine import SpeculativeEngine


class DraftModel:
    """``model`` proposing drafts by greedy decoding, its K/V in the engine's pool. It must
    have the target's K/V shape (KV heads and head size) and attend over every token."""

    def __init__(self, model: TinyModel) -> None:
        if model.config.windows is not None and any(model.config.windows):
            raise ValueError("the draft model attends over every token")
        self.model = model
        self.engine: SpeculativeEngine | None = None
        self.group = 0
        self.first_place = 0

    def attach(self, engine: SpeculativeEngine) -> None:
        """Give the draft's layers places in ``engine``'s pool, in its first full-attention
        group (a ``ValueError`` where there is none, or the K/V shapes differ)."""
        target, draft = engine.model.config, self.model.config
        if (target.num_kv_heads, target.head_dim) != (draft.num_kv_heads, draft.head_dim):
            raise ValueError(f"the draft's K/V ({draft.num_kv_heads} heads of {draft.head_dim}) "
                             f"must be the target's ({target.num_kv_heads} of "
                             f"{target.head_dim}) to share its blocks")
        windows = [target.window(layers[0]) for layers in engine.group_layers]
        if None not in windows:
            raise ValueError("the draft shares a full-attention group's blocks; the target "
                             "has none")
        self.engine, self.group = engine, windows.index(None)
        places = KVPool.empty(self.model, engine.kv_cache.pool.num_blocks,
                              engine.kv_cache.block_size)
        self.first_place = len(engine.pool.k)
        engine.pool.k += places.k
        engine.pool.v += places.v

    def run(self, batch: VarlenBatch, slots: torch.Tensor, tables: torch.Tensor
            ) -> torch.Tensor:
        """The draft over ``batch``'s tokens at ``slots`` of its group, through ``tables``:
        each layer writes its K/V, then attends; the logits of every row."""
        return self.model.logits(self.layers(self.model.embed(batch.input_ids), batch, slots,
                                             tables))

    def layers(self, x: torch.Tensor, batch: VarlenBatch, slots: torch.Tensor,
               tables: torch.Tensor) -> torch.Tensor:
        """The draft's layers over the rows ``x`` of ``batch``; the last layer's output."""
        engine, model = self.engine, self.model
        for layer in range(model.config.num_layers):
            k_cache = engine.pool.k[self.first_place + layer]
            v_cache = engine.pool.v[self.first_place + layer]
            q, k, v = model.qkv(layer, x, batch.positions)
            write_kv(k_cache, v_cache, k, v, slots)
            out = engine.attention(q, k_cache, v_cache, batch.query_start_loc, batch.seq_lens,
                                   tables, model.scale)
            x = model.finish_layer(layer, x, out)
        return x

    def before_verification(self, plan: Schedule) -> None:
        """The draft's pass over the step's chunks, before verification takes anything back."""
        batch = self.engine.build_batch(plan)
        self.run(batch, batch.group_slots[self.group], batch.group_tables[self.group])

    def after_verification(self, plan: Schedule) -> None:
        """Nothing: a draft model has followed the step already."""

    def propose(self, wanted: list[tuple[ChunkedRequest, int]]) -> None:
        """Drafts for each ``(request, k)``: room for ``k`` tokens from the request's newest
        (none: no drafts for it), then greedy steps of the draft, every request still
        drafting in one batch, each step reading the token the one before proposed; the
        drafts kept in ``request.spec_token_ids`` as they come."""
        kv = self.engine.kv_cache
        drafting = [(r, k) for r, k in wanted if kv.allocate_slots(r, k)]
        for request, _ in drafting:
            request.spec_token_ids = []
        for step in range(max((k for _, k in drafting), default=0)):
            batch_of = [r for r, k in drafting if k > step]
            chunks = [Chunk(r, r.num_tokens - 1 + step, 1) for r in batch_of]
            batch = build_varlen_batch(GroupTables(kv, self.group), chunks)
            batch = batch.to(self.model.embedding.device)
            logits = self.run(batch, batch.slot_mapping, batch.block_tables)
            for request, row in zip(batch_of, logits, strict=True):
                request.spec_token_ids.append(int(row.argmax()))


class DraftHead(DraftModel):
    """An EAGLE-shaped draft head (Li et al. 2024, "EAGLE: Speculative Sampling Requires
    Rethinking Feature Uncertainty"): ``model`` (of the target's hidden size) reads, at
    position t, its embedding of the token after t plus a projection of the *target's* last
    hidden state at t, and its logits there say what follows the token after t. Where the
    target has no hidden state yet (the positions of drafts), its own output at the position
    before stands in.

    So its K/V at a position are made from the token after it and the target's hidden state
    there: it follows each step only after verification, over the positions whose next token
    is known; and a prefix hit's last block is computed again (``use_eagle``), since its
    last token's K/V were made from a token after it that the hit's key does not hold."""

    def __init__(self, model: TinyModel, seed: int = 0) -> None:
        super().__init__(model)
        size = model.config.hidden
        gen = torch.Generator().manual_seed(seed)
        self.projection = (torch.randn(size, size, generator=gen) / size ** 0.5).to(
            model.embedding.device)
        self.latest: dict[int, tuple[int, torch.Tensor, torch.Tensor]] = {}

    def attach(self, engine: SpeculativeEngine) -> None:
        if engine.model.config.hidden != self.model.config.hidden:
            raise ValueError("the draft head reads the target's hidden state: it must have "
                             f"the target's hidden size, {engine.model.config.hidden}")
        super().attach(engine)
        engine.kv_cache.use_eagle = True

    def before_verification(self, plan: Schedule) -> None:
        """Nothing yet: the token after the step's last position is not known."""

    def after_verification(self, plan: Schedule) -> None:
        """Over each chunk's positions whose next token is now known and computed: the head
        at position t reads the token at t + 1 and the target's hidden state at t (its row
        in the step); each request's last such position is kept for its next drafts."""
        engine, kv = self.engine, self.engine.kv_cache
        hidden, rows, chunks, end = engine.model.hidden, [], [], 0
        for chunk in plan.chunks:
            request, first, end = chunk.request, end, end + chunk.num_tokens
            last = min(chunk.end, request.num_computed_tokens, request.num_tokens - 1)
            if last > chunk.start:
                chunks.append(Chunk(request, chunk.start, last - chunk.start))
                rows += range(first, first + last - chunk.start)
        if not chunks:
            return
        batch = build_varlen_batch(GroupTables(kv, self.group), chunks)
        batch.input_ids = torch.tensor([c.request.tokens[p + 1] for c in chunks
                                        for p in range(c.start, c.end)])
        batch = batch.to(self.model.embedding.device)
        features = self.read(batch, hidden[torch.tensor(rows, device=hidden.device)])
        logits = self.model.logits(features)
        for chunk, row in zip(chunks, batch.query_start_loc[1:].tolist(), strict=True):
            self.latest[chunk.request.id] = (chunk.end - 1, logits[row - 1], features[row - 1])

    def read(self, batch: VarlenBatch, hidden: torch.Tensor) -> torch.Tensor:
        """The head over ``batch`` (its tokens the ones after each position), with
        ``hidden`` the target's hidden state (or its stand-in) at each row."""
        x = self.model.embed(batch.input_ids) + hidden @ self.projection.T
        return self.layers(x, batch, batch.slot_mapping, batch.block_tables)

    def propose(self, wanted: list[tuple[ChunkedRequest, int]]) -> None:
        """Each request's first draft from its latest position's logits (the one before its
        newest token); then room for ``k - 1`` more positions from its newest (none: the
        first draft alone), and greedy steps, each reading the draft before it and the
        head's own output at the position before as the hidden state."""
        kv = self.engine.kv_cache
        running = {r.id for r in self.engine.scheduler.running}
        self.latest = {i: kept for i, kept in self.latest.items() if i in running}
        drafting, feature_of = [], {}
        for request, k in wanted:
            position, logits, feature = self.latest.get(request.id, (-1, None, None))
            if position != request.num_tokens - 2:
                continue  # its latest position is not the one before its newest token
            request.spec_token_ids = [int(logits.argmax())]
            if k > 1 and kv.allocate_slots(request, k - 1):
                drafting.append((request, k))
                feature_of[request.id] = feature
        for step in range(1, max((k for _, k in drafting), default=0)):
            now = [r for r, k in drafting if k > step]
            chunks = [Chunk(r, r.num_tokens - 2 + step, 1) for r in now]
            batch = build_varlen_batch(GroupTables(kv, self.group), chunks)
            batch.input_ids = torch.tensor([r.spec_token_ids[-1] for r in now])
            batch = batch.to(self.model.embedding.device)
            features = self.read(batch, torch.stack([feature_of[r.id] for r in now]))
            for request, feature, row in zip(now, features, self.model.logits(features),
                                             strict=True):
                feature_of[request.id] = feature
                request.spec_token_ids.append(int(row.argmax()))
