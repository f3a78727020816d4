"""Wrong chapter 8 solutions, as learners write them, with the hint each must get."""

from __future__ import annotations

import torch

from course import paged_engine as reference
from kernels.paged_attention_ref import paged_decode_attention, write_kv

_REMEMBERED: dict[int, list[int]] = {}


def _positions_off_by_one(manager, seq_ids):
    batch = reference.build_decode_batch(manager, seq_ids)
    block_size = manager.block_size
    positions = batch.seq_lens.long()
    rows = torch.arange(len(seq_ids))
    slots = batch.block_tables[rows, (positions - 1) // block_size].long() * block_size \
        + (positions - 1) % block_size
    return reference.DecodeBatch(positions, slots, batch.block_tables, batch.seq_lens)


def _stale_tables(manager, seq_ids):
    """Remembers each table, refreshing it only when it grows: blind to copy-on-write."""
    for seq_id in seq_ids:
        table = manager.block_table(seq_id)
        if len(_REMEMBERED.get(seq_id, [])) != len(table):
            _REMEMBERED[seq_id] = table
    tables = [_REMEMBERED[s] for s in seq_ids]
    lengths = [manager.seq_len(s) for s in seq_ids]
    block_size = manager.block_size
    slots = [t[(n - 1) // block_size] * block_size + (n - 1) % block_size
             for t, n in zip(tables, lengths, strict=True)]
    width = max(map(len, tables))
    return reference.DecodeBatch(torch.tensor([n - 1 for n in lengths]), torch.tensor(slots),
                                 torch.tensor([t + [0] * (width - len(t)) for t in tables],
                                              dtype=torch.int32),
                                 torch.tensor(lengths, dtype=torch.int32))


def _attends_before_writing(model, tokens, batch, pool, attention=paged_decode_attention):
    x = model.embed(tokens)
    for layer in range(model.config.num_layers):
        q, k, v = model.qkv(layer, x, batch.positions)
        out = attention(q, pool.k[layer], pool.v[layer], batch.block_tables, batch.seq_lens,
                        model.scale)
        write_kv(pool.k[layer], pool.v[layer], k, v, batch.slot_mapping)
        x = model.finish_layer(layer, x, out)
    return model.logits(x)


def _rope_at_seq_len(model, tokens, batch, pool, attention=paged_decode_attention):
    moved = reference.DecodeBatch(batch.seq_lens.long(), batch.slot_mapping,
                                  batch.block_tables, batch.seq_lens)
    x = model.embed(tokens)
    for layer in range(model.config.num_layers):
        q, k, v = model.qkv(layer, x, moved.positions)
        write_kv(pool.k[layer], pool.v[layer], k, v, batch.slot_mapping)
        out = attention(q, pool.k[layer], pool.v[layer], batch.block_tables, batch.seq_lens,
                        model.scale)
        x = model.finish_layer(layer, x, out)
    return model.logits(x)


def _serve_with(prefill_tokens, copies=True, branches=True):
    def serve(engine, requests, max_steps=10_000):
        pending = sorted(requests, key=lambda r: r.arrival)
        finished = []
        for step in range(max_steps):
            if not pending and not engine.busy():
                return finished
            while pending and pending[0].arrival <= step:
                engine.scheduler.add(pending.pop(0))
            plan = engine.scheduler.step()
            if copies:
                engine.apply_copies(plan)
            for request in plan.prefill:
                logits = engine.prefill(request, prefill_tokens(request))
                request.emit(int(logits.argmax()), logits)
                if branches and request.n > 1 and request.generated == 1:
                    engine.start_branches(request, logits)
            if plan.decode:
                for request, row in zip(plan.decode, engine.decode(plan.decode), strict=True):
                    request.emit(int(row.argmax()), row)
            for request in list(engine.scheduler.running):
                if request.done:
                    engine.scheduler.finish(request)
                    finished.append(request)
            engine.record(step, plan)
        raise RuntimeError("unfinished")
    return serve


_recompute_from_the_prompt = _serve_with(lambda r: r.prompt)
_recompute_from_the_prompt.__name__ = "_recompute_from_the_prompt"
_no_block_copies = _serve_with(lambda r: r.tokens, copies=False)
_no_block_copies.__name__ = "_no_block_copies"
_no_branches = _serve_with(lambda r: r.tokens, branches=False)
_no_branches.__name__ = "_no_branches"

MUTANTS = {
    "build_decode_batch": [
        (_positions_off_by_one, "one too large"),
        (_stale_tables, "a table remembered from an earlier step is stale"),
    ],
    "paged_decode_step": [
        (_attends_before_writing, "write the new K/V"),
        (_rope_at_seq_len, "true position"),
    ],
    "serve": [
        (_recompute_from_the_prompt, "prefill its whole context"),
        (_no_block_copies, "Apply the step's block copies"),
        (_no_branches, "engine.start_branches"),
    ],
}
