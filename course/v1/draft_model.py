"""Chapter 12: a draft model whose K/V live in the target's pool::

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
as the target's are.
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
        engine, model = self.engine, self.model
        x = model.embed(batch.input_ids)
        for layer in range(model.config.num_layers):
            k_cache = engine.pool.k[self.first_place + layer]
            v_cache = engine.pool.v[self.first_place + layer]
            q, k, v = model.qkv(layer, x, batch.positions)
            write_kv(k_cache, v_cache, k, v, slots)
            out = engine.attention(q, k_cache, v_cache, batch.query_start_loc, batch.seq_lens,
                                   tables, model.scale)
            x = model.finish_layer(layer, x, out)
        return model.logits(x)

    def follow(self, plan: Schedule) -> None:
        """The draft's pass over the step's chunks, before verification takes anything back."""
        batch = self.engine.build_batch(plan)
        self.run(batch, batch.group_slots[self.group], batch.group_tables[self.group])

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
