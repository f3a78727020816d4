"""Wrong chapter 9 solutions, as learners write them, with the hint each must get."""

from __future__ import annotations

import importlib.util
import inspect
import tempfile
import textwrap
from pathlib import Path

import torch

from course.block_manager import NoFreeBlocksError
from course.chunked_scheduler import Chunk, Schedule
from course.prefix_cache import prefix_keys


def _scheduler_with(prefill_first=False, clip_budget=True, clip_remaining=True,
                    whole_hit=False, reset=True):
    """The scheduling step with one rule misread."""

    def schedule_step(scheduler):
        manager, plan = scheduler.manager, Schedule()
        budget = [scheduler.max_num_batched_tokens]

        def run(request, left):
            n = min(left, budget[0]) if clip_budget else left
            plan.chunks.append(Chunk(request, request.num_computed_tokens, n))
            request.num_computed_tokens += n
            budget[0] -= n

        def running():
            index = 0
            while index < len(scheduler.running) and budget[0] > 0:
                request = scheduler.running[index]
                try:
                    while manager.seq_len(request.id) < request.num_tokens:
                        manager.append_slot(request.id,
                                            request.tokens[manager.seq_len(request.id)])
                except NoFreeBlocksError:
                    victim = scheduler.running.pop()
                    manager.free(victim.id)
                    if reset:
                        victim.num_computed_tokens = 0
                    scheduler.waiting.appendleft(victim)
                    plan.preempted.append(victim.id)
                    continue
                left = request.num_tokens - request.num_computed_tokens
                if not clip_remaining:
                    left = request.num_tokens
                run(request, left)
                index += 1

        def waiting():
            while (not plan.preempted and scheduler.waiting and budget[0] > 0
                   and len(scheduler.running) < scheduler.max_num_seqs):
                request = scheduler.waiting[0]
                try:
                    hits = manager.allocate(request.id, request.tokens)
                except NoFreeBlocksError:
                    break
                if whole_hit:  # every cached full block counted, the last one too
                    hits = 0
                    for key in prefix_keys(request.tokens, manager.block_size):
                        if key not in manager.cache:
                            break
                        hits += manager.block_size
                scheduler.waiting.popleft()
                scheduler.running.append(request)
                request.num_computed_tokens = hits
                run(request, request.num_tokens - (0 if not clip_remaining else hits))

        if prefill_first:
            waiting()
            running()
        else:
            running()
            waiting()
        return plan

    return schedule_step


def _named(fn, name):
    fn.__name__ = name
    return fn


def _attention_with(seen):
    """The PyTorch reference with query j of a request seeing ``seen(start, q_len, seq_len,
    j)`` keys."""

    def varlen_paged_attention(query, k_cache, v_cache, query_start_loc, seq_lens,
                               block_tables, scale):
        _, num_q_heads, head_dim = query.shape
        _, block_size, num_kv_heads, _ = k_cache.shape
        group = num_q_heads // num_kv_heads
        out = torch.empty_like(query)
        for seq in range(len(seq_lens)):
            start, end = int(query_start_loc[seq]), int(query_start_loc[seq + 1])
            length = int(seq_lens[seq])
            table = block_tables[seq, : -(-length // block_size)].long()
            keys = k_cache[table].reshape(-1, num_kv_heads, head_dim)[:length].float()
            values = v_cache[table].reshape(-1, num_kv_heads, head_dim)[:length].float()
            keys = keys.repeat_interleave(group, dim=1)
            values = values.repeat_interleave(group, dim=1)
            for j in range(end - start):
                count = seen(start, end - start, length, j)
                scores = torch.einsum("hd,khd->hk", query[start + j].float(),
                                      keys[:count]) * scale
                out[start + j] = torch.einsum("hk,khd->hd", scores.softmax(dim=-1),
                                              values[:count]).to(query.dtype)
        return out

    return varlen_paged_attention


def _engine_step_with(sample_every_chunk=False, write_first=True, positions_from_zero=False,
                      first_row=False):
    from kernels.paged_attention_ref import write_kv

    def engine_step(engine, plan):
        model, pool = engine.model, engine.pool
        batch = engine.build_batch(plan)
        positions = batch.positions
        if positions_from_zero:  # each chunk's tokens numbered 0, 1, ...
            positions = torch.cat([torch.arange(c.num_tokens) for c in plan.chunks])
        x = model.embed(batch.input_ids)
        for layer in range(model.config.num_layers):
            q, k, v = model.qkv(layer, x, positions)
            if write_first:
                write_kv(pool.k[layer], pool.v[layer], k, v, batch.slot_mapping)
            out = engine.attention(q, pool.k[layer], pool.v[layer], batch.query_start_loc,
                                   batch.seq_lens, batch.block_tables, model.scale)
            if not write_first:
                write_kv(pool.k[layer], pool.v[layer], k, v, batch.slot_mapping)
            x = model.finish_layer(layer, x, out)
        rows = batch.query_start_loc[:-1] if first_row else batch.query_start_loc[1:] - 1
        logits = model.logits(x[rows.long()])
        for chunk, row in zip(plan.chunks, logits, strict=True):
            if sample_every_chunk or chunk.end == chunk.request.num_tokens:
                chunk.request.emit(int(row.argmax()), row)

    return engine_step


_FOLDER = Path(tempfile.mkdtemp(prefix="ch09-mutants-"))


def _mutant(kernel, name: str, old: str, new: str):
    """``kernel`` with ``old`` (which must occur once) replaced by ``new``, renamed ``name``:
    written to a file of its own, since Triton compiles from source files."""
    source = textwrap.dedent(inspect.getsource(kernel.fn))
    assert source.count(old) == 1, f"{old!r} is not in {kernel.__name__} exactly once"
    source = source.replace(old, new).replace(f"def {kernel.__name__}(", f"def {name}(")
    path = _FOLDER / f"{name}.py"
    path.write_text("import triton\nimport triton.language as tl\n\n\n" + source)
    spec = importlib.util.spec_from_file_location(f"ch09_mutants.{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def _kernels():
    from kernels.varlen_attention import varlen_attention_kernel as kernel

    right = "context = seq_len - q_len + (token - start) + 1"
    return [
        (_mutant(kernel, "no_causal_mask", right, "context = seq_len"), "apply the causal mask"),
        (_mutant(kernel, "packed_index_as_position", right, "context = token + 1"),
         "the start offsets are per request"),
        (_mutant(kernel, "context_one_short", right,
                 "context = seq_len - q_len + (token - start)"), "off-by-one"),
    ]


MUTANTS = {
    "schedule_step": [
        (_named(_scheduler_with(prefill_first=True), "_prefill_before_decodes"),
         "running requests (their decodes and unfinished prefill chunks) come first"),
        (_named(_scheduler_with(clip_budget=False), "_budget_overrun"),
         "takes its tokens from the one budget"),
        (_named(_scheduler_with(clip_remaining=False), "_chunk_not_clipped_to_the_prompt"),
         "what is left to compute"),
        (_named(_scheduler_with(whole_hit=True), "_hit_counts_the_whole_prompt"),
         "at least one token is always computed"),
        (_named(_scheduler_with(reset=False), "_preemption_keeps_computed_tokens"),
         "set num_computed_tokens to 0"),
    ],
    "varlen_paged_attention": [
        (_named(_attention_with(lambda start, q_len, n, j: n), "_no_causal_mask"),
         "apply the causal mask"),
        (_named(_attention_with(lambda start, q_len, n, j: min(n, start + j + 1)),
                "_packed_index_as_position"), "the start offsets are per request"),
        (_named(_attention_with(lambda start, q_len, n, j: n - q_len + j),
                "_context_one_short"), "off-by-one"),
    ],
    "varlen_attention_kernel": _kernels(),
    "engine_step": [
        (_named(_engine_step_with(sample_every_chunk=True), "_samples_after_every_chunk"),
         "its prompt is not computed yet"),
        (_named(_engine_step_with(write_first=False), "_attends_before_writing"),
         "before attending"),
        (_named(_engine_step_with(positions_from_zero=True), "_positions_from_the_chunk_start"),
         "true position"),
        (_named(_engine_step_with(first_row=True), "_logits_of_the_first_row"),
         "last row"),
    ],
}
