"""Wrong chapter 8 solutions, as learners write them, with the hint each must get; and
``RULES``: each rule the notebook states about a TODO, with the mutants that break it alone."""

from __future__ import annotations

import torch

from course.v0 import paged_engine as reference
from kernels.paged_attention_ref import paged_decode_attention, write_kv
from mutants import Rule

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


def _padded_to_the_pool(manager, seq_ids):
    batch = reference.build_decode_batch(manager, seq_ids)
    tables = [manager.block_table(s) + [0] * (manager.num_blocks - len(manager.block_table(s)))
              for s in seq_ids]
    return reference.DecodeBatch(batch.positions, batch.slot_mapping,
                                 torch.tensor(tables, dtype=torch.int32), batch.seq_lens)


def _rows_in_manager_order(manager, seq_ids):
    """Walks the manager's tables, keeping those asked for: rows in the manager's order."""
    return reference.build_decode_batch(manager, [s for s in manager.tables if s in seq_ids])


def _seq_lens_without_the_new_token(manager, seq_ids):
    batch = reference.build_decode_batch(manager, seq_ids)
    return reference.DecodeBatch(batch.positions, batch.slot_mapping, batch.block_tables,
                                 batch.seq_lens - 1)


def _slot_is_the_position(manager, seq_ids):
    batch = reference.build_decode_batch(manager, seq_ids)
    return reference.DecodeBatch(batch.positions, batch.positions.clone(), batch.block_tables,
                                 batch.seq_lens)


def _one_pool_for_every_layer(model, tokens, batch, pool, attention=paged_decode_attention):
    x = model.embed(tokens)
    for layer in range(model.config.num_layers):
        q, k, v = model.qkv(layer, x, batch.positions)
        write_kv(pool.k[0], pool.v[0], k, v, batch.slot_mapping)
        out = attention(q, pool.k[0], pool.v[0], batch.block_tables, batch.seq_lens,
                        model.scale)
        x = model.finish_layer(layer, x, out)
    return model.logits(x)


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


def _serve_with(prefill_tokens=lambda r: r.tokens, copies="first", branches="first",
                late=False, limit="raise", finish=True, idle_stop=False, record=True,
                skip_idle=False):
    def serve(engine, requests, max_steps=10_000):
        pending = sorted(requests, key=lambda r: r.arrival)
        finished = []
        skipped = 0
        for count in range(max_steps):
            step = count + skipped
            if not pending and not engine.busy():
                return finished
            if idle_stop and not engine.busy() and step > 0:
                return finished  # nothing running: done (the requests still to come are lost)
            if skip_idle and not engine.busy():  # nothing to run: on to the next arrival
                skipped += max(0, pending[0].arrival - step)
                step = count + skipped
            while pending and (pending[0].arrival < step if late else
                               pending[0].arrival <= step):
                engine.scheduler.add(pending.pop(0))
            plan = engine.scheduler.step()
            if copies == "first":
                engine.apply_copies(plan)
            for request in plan.prefill:
                logits = engine.prefill(request, prefill_tokens(request))
                request.emit(int(logits.argmax()), logits)
                forks = {"first": request.generated == 1, "every": True, "never": False}
                if request.n > 1 and forks[branches]:
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
            if record:
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
_no_branches = _named(_serve_with(branches="never"), "_no_branches")
_forks_at_every_prefill = _named(_serve_with(branches="every"), "_forks_at_every_prefill")
_no_record = _named(_serve_with(record=False), "_no_record")
_skips_idle_steps = _named(_serve_with(skip_idle=True), "_skips_idle_steps")
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
                free_cpu=True, leave_running=False, release="free", siblings=False):
    def abort(engine, request):
        s = engine.scheduler
        family = {request.id} | ({request.parent} if siblings and request.parent is not None
                                 else set())  # a branch's cancel taking its whole family
        taken = []
        for name in queues:
            queue = getattr(s, name)
            for r in [r for r in queue if r is request or r.id in family - {request.id}
                      or (branches and r.parent in family)]:
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
_abort_takes_the_family = _named(_abort_with(siblings=True), "_abort_takes_the_family")


def _abort_rebuilds_queues_as_lists(engine, request):
    s = engine.scheduler
    taken = [r for r in [*s.waiting, *s.running, *s.swapped]
             if r is request or r.parent == request.id]
    for r in taken:
        if any(r is x for x in s.running):
            s.gpu.free(r.id)
        elif any(r is x for x in s.swapped):
            s.cpu.free(r.id)
    s.waiting = [r for r in s.waiting if not any(r is t for t in taken)]
    s.running = [r for r in s.running if not any(r is t for t in taken)]
    s.swapped = [r for r in s.swapped if not any(r is t for t in taken)]
    return taken


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


def _one_by_one(abort=True, keep_error=True, then_together=False):
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
        survivors = [r for r in requests if any(r is s for s in engine.scheduler.running)]
        if then_together and survivors:  # the found-good ones decoded as a batch, once more
            for request, row in zip(survivors, engine.decode(survivors), strict=True):
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
_fault_decodes_survivors_twice = _named(_faults_with(_one_by_one(then_together=True)),
                                        "_fault_decodes_survivors_twice")


def _returns_nothing_when_fine(engine, requests):
    try:
        logits = engine.decode(requests)
    except Exception as error:
        return _one_by_one()(engine, requests, error)
    for request, row in zip(requests, logits, strict=True):
        request.emit(int(row.argmax()), row)


MUTANTS = {
    "build_decode_batch": [
        (_positions_off_by_one, "one too large"),
        (_stale_tables, "a table remembered from an earlier step is stale"),
        (_int64_tables, "block_tables is a int64 tensor, expected int32"),
        (_padded_to_the_pool, "padded past its own blocks to the longest table's length"),
        (_rows_in_manager_order, "the rows follow the order of seq_ids"),
        (_seq_lens_without_the_new_token, "Each is one too small"),
        (_slot_is_the_position, "its slot is where that position lives in its block table"),
    ],
    "paged_decode_step": [
        (_attends_before_writing, "not in the pool when attention read it"),
        (_rope_at_seq_len, "RoPE at position seq_len"),
        (_ignores_attention, "was never called"),
        (_one_pool_for_every_layer, "at some layer"),
    ],
    "serve": [
        (_recompute_from_the_prompt, "its whole context"),
        (_no_block_copies, "was not called in it"),
        (_copies_after_the_model, "ran after the model"),
        (_no_branches, "engine.start_branches"),
        (_forks_at_every_prefill, "a request forks once"),
        (_no_record, "engine.record(step, plan) ran in"),
        (_skips_idle_steps, "idle steps included"),
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
        (_abort_takes_the_family, "the other requests stay where they were"),
        (_abort_rebuilds_queues_as_lists, "is now a list, was a deque"),
    ],
    "decode_surviving_faults": [
        (_fault_escapes, "The fault escaped"),
        (_fault_aborts_the_batch, "though its own decode works"),
        (_fault_skips_without_abort, "yet it is still in scheduler.running"),
        (_fault_loses_the_error, "goes in request.error"),
        (_fault_decodes_survivors_twice, "emitted 2 tokens in this step, expected 1"),
        (_returns_nothing_when_fine, "returned None, expected the aborted requests, []"),
    ],
}

RULES = [
    Rule("that token's **position** (`seq_len - 1`)", "build_decode_batch",
         ("_positions_off_by_one",)),
    Rule("its **slot** in the pool (through the block table, chapter 2)", "build_decode_batch",
         ("_slot_is_the_position",)),
    Rule("the tokens to attend over, the one decoded included", "build_decode_batch",
         ("_seq_lens_without_the_new_token",)),
    Rule("Read tables from the manager every step: copy-on-write can replace a sequence's last "
         "block between two steps.", "build_decode_batch", ("_stale_tables",)),
    Rule("one row per sequence, in the order of `seq_ids`", "build_decode_batch",
         ("_rows_in_manager_order",)),
    Rule("each block table, padded past its own blocks to the longest table's length",
         "build_decode_batch", ("_padded_to_the_pool",)),
    Rule("`[num_seqs, max_blocks]` int32", "build_decode_batch", ("_int64_tables",)),
    Rule("compute q, k, v at the batch's positions", "paged_decode_step", ("_rope_at_seq_len",)),
    Rule("into that layer's pool at the slot mapping", "paged_decode_step",
         ("_one_pool_for_every_layer",)),
    Rule("**before** attending (the new token attends to itself)", "paged_decode_step",
         ("_attends_before_writing",)),
    Rule("attend with `attention(q, pool.k[layer], pool.v[layer], batch.block_tables, "
         "batch.seq_lens, model.scale)`", "paged_decode_step", ("_ignores_attention",)),
    Rule("a request joins the waiting queue (`engine.scheduler.add`, once) just before the step "
         "its `arrival` names", "serve", ("_joins_one_step_late",)),
    Rule("Step s is the s-th call of `engine.scheduler.step()`, counted from 0, idle steps "
         "included", "serve", ("_skips_idle_steps",)),
    Rule("`engine.apply_copies(plan)` (before anything is written: a swapped-out victim's "
         "blocks may be reused in the same step)", "serve",
         ("_no_block_copies", "_copies_after_the_model")),
    Rule("each request in `plan.prefill` is prefilled with its whole context, `request.tokens`",
         "serve", ("_recompute_from_the_prompt",)),
    Rule("a request with `n > 1` prefilled for the first time (`generated == 1`) starts its "
         "branches", "serve", ("_no_branches", "_forks_at_every_prefill")),
    Rule("every running request that is `done` is finished and collected", "serve",
         ("_leaks_finished_blocks",)),
    Rule("`engine.record(step, plan)`.", "serve", ("_no_record",)),
    Rule("When nothing is pending and the engine is not busy, return every finished request "
         "(branches included).", "serve", ("_stops_when_idle",)),
    Rule("A run that finishes within `max_steps` steps returns", "serve", ("_limit_off_by_one",)),
    Rule("one with requests still unfinished after `max_steps` steps raises `RuntimeError`",
         "serve", ("_returns_quietly",)),
    Rule("take `request` out of whichever list holds it", "abort",
         ("_abort_running_only", "_abort_leaves_it_running")),
    Rule("and with it every branch the engine holds whose `parent` is `request.id`", "abort",
         ("_abort_without_branches",)),
    Rule("(cancelling a branch cancels that branch alone)", "abort",
         ("_abort_takes_the_family",)),
    Rule("a running request's GPU blocks go back with `engine.scheduler.gpu.free(id)`", "abort",
         ("_abort_keeps_gpu_blocks",)),
    Rule("a swapped-out one's CPU blocks with `engine.scheduler.cpu.free(id)`", "abort",
         ("_abort_keeps_cpu_blocks",)),
    Rule("`free` drops one reference per block, so a block shared with a request that stays "
         "keeps its other references", "abort", ("_abort_frees_shared_blocks",)),
    Rule("nothing else changes: the other requests stay where they were, in order, with their "
         "blocks", "abort", ("_abort_rebuilds_queues_as_lists",)),
    Rule("when it works, each request emits the greedy token of its row (as in `serve`) and the "
         "function returns `[]`", "decode_surviving_faults", ("_returns_nothing_when_fine",)),
    Rule("When it raises (any `Exception`)", "decode_surviving_faults", ("_fault_escapes",)),
    Rule("decode each request still running again on its own (`engine.decode([request])`)",
         "decode_surviving_faults", ("_fault_aborts_the_batch",)),
    Rule("one whose own decode raises is cancelled with your `abort` (its branches with it)",
         "decode_surviving_faults", ("_fault_skips_without_abort",)),
    Rule("the exception its decode raised kept in its `error`", "decode_surviving_faults",
         ("_fault_loses_the_error",)),
    Rule("Every request that survives emits exactly one token.", "decode_surviving_faults",
         ("_fault_decodes_survivors_twice",)),
]
