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


def _int64_tables(manager, seq_ids):
    batch = reference.build_decode_batch(manager, seq_ids)
    return reference.DecodeBatch(batch.positions, batch.slot_mapping,
                                 batch.block_tables.long(), batch.seq_lens)


def _ignores_attention(model, tokens, batch, pool, attention=paged_decode_attention):
    """Always chapter 6's attention, whatever it is given."""
    x = model.embed(tokens)
    for layer in range(model.config.num_layers):
        q, k, v = model.qkv(layer, x, batch.positions)
        write_kv(pool.k[layer], pool.v[layer], k, v, batch.slot_mapping)
        out = paged_decode_attention(q, pool.k[layer], pool.v[layer], batch.block_tables,
                                     batch.seq_lens, model.scale)
        x = model.finish_layer(layer, x, out)
    return model.logits(x)


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


def _serve_with(prefill_tokens=lambda r: r.tokens, copies="first", branches=True,
                late=False, limit="raise", finish=True, idle_stop=False):
    def serve(engine, requests, max_steps=10_000):
        pending = sorted(requests, key=lambda r: r.arrival)
        finished = []
        for step in range(max_steps):
            if not pending and not engine.busy():
                return finished
            if idle_stop and not engine.busy() and step > 0:
                return finished  # nothing running: done (the requests still to come are lost)
            while pending and (pending[0].arrival < step if late else
                               pending[0].arrival <= step):
                engine.scheduler.add(pending.pop(0))
            plan = engine.scheduler.step()
            if copies == "first":
                engine.apply_copies(plan)
            for request in plan.prefill:
                logits = engine.prefill(request, prefill_tokens(request))
                request.emit(int(logits.argmax()), logits)
                if branches and request.n > 1 and request.generated == 1:
                    engine.start_branches(request, logits)
            if plan.decode:
                for request, row in zip(plan.decode, engine.decode(plan.decode), strict=True):
                    request.emit(int(row.argmax()), row)
            if copies == "last":
                engine.apply_copies(plan)
            for request in list(engine.scheduler.running):
                if request.done:
                    if finish:
                        engine.scheduler.finish(request)
                    else:  # out of the batch, its blocks still held
                        engine.scheduler.running.remove(request)
                    finished.append(request)
            engine.record(step, plan)
        if limit == "raise" and (pending or engine.busy()):
            raise RuntimeError("unfinished")
        return finished
    return serve


def _named(function, name):
    function.__name__ = name
    return function


_recompute_from_the_prompt = _named(_serve_with(lambda r: r.prompt),
                                    "_recompute_from_the_prompt")
_no_block_copies = _named(_serve_with(copies="never"), "_no_block_copies")
_copies_after_the_model = _named(_serve_with(copies="last"), "_copies_after_the_model")
_no_branches = _named(_serve_with(branches=False), "_no_branches")
_joins_one_step_late = _named(_serve_with(late=True), "_joins_one_step_late")
_returns_quietly = _named(_serve_with(limit="return"), "_returns_quietly")
_leaks_finished_blocks = _named(_serve_with(finish=False), "_leaks_finished_blocks")
_stops_when_idle = _named(_serve_with(idle_stop=True), "_stops_when_idle")


def _limit_off_by_one(engine, requests, max_steps=10_000):
    """Raises when the last allowed step finished the work: max_steps - 1 steps, really."""
    return _serve_with()(engine, requests, max_steps - 1) if max_steps else \
        _serve_with()(engine, requests, 0)


# --- abort -----------------------------------------------------------------------------------


def _abort_with(queues=("waiting", "running", "swapped"), branches=True, free_gpu=True,
                free_cpu=True, leave_running=False, release="free"):
    def abort(engine, request):
        s = engine.scheduler
        taken = []
        for name in queues:
            queue = getattr(s, name)
            for r in [r for r in queue if r is request or (branches and r.parent == request.id)]:
                if not (leave_running and name == "running"):
                    queue.remove(r)
                if name == "running" and free_gpu:
                    if release == "free":
                        s.gpu.free(r.id)
                    else:  # every block straight back to the pool, shared or not
                        for block in s.gpu.tables.pop(r.id):
                            s.gpu.ref_counts[block] = 0
                            if block not in s.gpu.free_blocks:
                                s.gpu.free_blocks.append(block)
                        del s.gpu.lengths[r.id]
                if name == "swapped" and free_cpu:
                    s.cpu.free(r.id)
                taken.append(r)
        return taken
    return abort


_abort_running_only = _named(_abort_with(queues=("running",)), "_abort_running_only")
_abort_without_branches = _named(_abort_with(branches=False), "_abort_without_branches")
_abort_keeps_cpu_blocks = _named(_abort_with(free_cpu=False), "_abort_keeps_cpu_blocks")
_abort_keeps_gpu_blocks = _named(_abort_with(free_gpu=False), "_abort_keeps_gpu_blocks")
_abort_leaves_it_running = _named(_abort_with(leave_running=True), "_abort_leaves_it_running")
_abort_frees_shared_blocks = _named(_abort_with(release="all"), "_abort_frees_shared_blocks")


# --- decode_surviving_faults -----------------------------------------------------------------


def _faults_with(on_fault):
    def decode_surviving_faults(engine, requests):
        try:
            logits = engine.decode(requests)
        except Exception as error:
            return on_fault(engine, requests, error)
        for request, row in zip(requests, logits, strict=True):
            request.emit(int(row.argmax()), row)
        return []
    return decode_surviving_faults


def _whole_batch(engine, requests, error):
    aborted = []
    for request in requests:
        request.error = error
        aborted += reference.abort(engine, request)
    return aborted


def _one_by_one(abort=True, keep_error=True):
    def retry(engine, requests, error):
        aborted = []
        for request in requests:
            if not any(r is request for r in engine.scheduler.running):
                continue
            try:
                row = engine.decode([request])[0]
            except Exception as own:
                if keep_error:
                    request.error = own
                if abort:
                    aborted += reference.abort(engine, request)
                continue
            request.emit(int(row.argmax()), row)
        return aborted
    return retry


def _fault_escapes(engine, requests):
    for request, row in zip(requests, engine.decode(requests), strict=True):
        request.emit(int(row.argmax()), row)
    return []


_fault_aborts_the_batch = _named(_faults_with(_whole_batch), "_fault_aborts_the_batch")
_fault_skips_without_abort = _named(_faults_with(_one_by_one(abort=False)),
                                    "_fault_skips_without_abort")
_fault_loses_the_error = _named(_faults_with(_one_by_one(keep_error=False)),
                                "_fault_loses_the_error")


MUTANTS = {
    "build_decode_batch": [
        (_positions_off_by_one, "one too large"),
        (_stale_tables, "a table remembered from an earlier step is stale"),
        (_int64_tables, "block_tables is a int64 tensor, expected int32"),
    ],
    "paged_decode_step": [
        (_attends_before_writing, "not in the pool when attention read it"),
        (_rope_at_seq_len, "RoPE at position seq_len"),
        (_ignores_attention, "was never called"),
    ],
    "serve": [
        (_recompute_from_the_prompt, "its whole context"),
        (_no_block_copies, "was not called in it"),
        (_copies_after_the_model, "ran after the model"),
        (_no_branches, "engine.start_branches"),
        (_joins_one_step_late, "late"),
        (_returns_quietly, "returned, with requests unfinished"),
        (_leaks_finished_blocks, "never went back"),
        (_stops_when_idle, "missing from what serve returned"),
        (_limit_off_by_one, "a run that ends within max_steps returns"),
    ],
    "abort": [
        (_abort_running_only, "is still in scheduler.swapped"),
        (_abort_without_branches, "its branches too"),
        (_abort_keeps_cpu_blocks, "CPU BlockManager still holds"),
        (_abort_keeps_gpu_blocks, "GPU BlockManager still holds"),
        (_abort_leaves_it_running, "is still in scheduler.running"),
        (_abort_frees_shared_blocks, "loses one reference per sequence"),
    ],
    "decode_surviving_faults": [
        (_fault_escapes, "The fault escaped"),
        (_fault_aborts_the_batch, "though its own decode works"),
        (_fault_skips_without_abort, "yet it is still in scheduler.running"),
        (_fault_loses_the_error, "goes in request.error"),
    ],
}
