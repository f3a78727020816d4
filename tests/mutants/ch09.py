"""Wrong chapter 9 solutions, as learners write them, with the hint each must get."""

from __future__ import annotations

import torch

from course.block_manager import NoFreeBlocksError
from course.chunked_scheduler import Chunk, Schedule
from course.prefix_cache import prefix_keys
from mutants import Rule, kernel_mutant


def _scheduler_with(prefill_first=False, clip_budget=True, clip_remaining=True,
                    whole_hit=False, reset=True, admit_after_preemption=False,
                    slots_before_budget=False, stop_after_preempting_another=False):
    """The scheduling step with one rule misread."""

    def schedule_step(scheduler):
        manager, plan = scheduler.manager, Schedule()
        budget = [scheduler.max_num_batched_tokens]

        def run(request, left):
            n = min(left, budget[0]) if clip_budget else left
            plan.chunks.append(Chunk(request, request.num_computed_tokens, n))
            request.num_computed_tokens += n
            budget[0] -= n

        def slots(request):
            while manager.seq_len(request.id) < request.num_tokens:
                manager.append_slot(request.id, request.tokens[manager.seq_len(request.id)])

        def every_slot_first():
            """Every running request's slots before any budget is spent (the rule takes
            them inside the budget loop, for the requests it schedules)."""
            index = 0
            while index < len(scheduler.running):
                try:
                    slots(scheduler.running[index])
                    index += 1
                except NoFreeBlocksError:
                    victim = scheduler.running.pop()
                    manager.free(victim.id)
                    victim.num_computed_tokens = 0
                    scheduler.waiting.appendleft(victim)
                    plan.preempted.append(victim.id)

        def running():
            if slots_before_budget:
                every_slot_first()
            index, preempted_another = 0, False
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
                    preempted_another = victim is not request
                    continue
                left = request.num_tokens - request.num_computed_tokens
                if not clip_remaining:
                    left = request.num_tokens
                run(request, left)
                index += 1
                if stop_after_preempting_another and preempted_another:
                    break  # as if preempting anyone ended the pass

        def waiting():
            while ((admit_after_preemption or not plan.preempted) and scheduler.waiting
                   and budget[0] > 0
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


def _attention_with(seen, precision=torch.float32):
    """The PyTorch reference with query j of a request seeing ``seen(start, q_len, seq_len,
    j)`` keys, its arithmetic in ``precision`` (None: the query's dtype)."""

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
            dtype = precision or query.dtype
            keys = k_cache[table].reshape(-1, num_kv_heads, head_dim)[:length].to(dtype)
            values = v_cache[table].reshape(-1, num_kv_heads, head_dim)[:length].to(dtype)
            keys = keys.repeat_interleave(group, dim=1)
            values = values.repeat_interleave(group, dim=1)
            for j in range(end - start):
                count = seen(start, end - start, length, j)
                scores = torch.einsum("hd,khd->hk", query[start + j].to(dtype),
                                      keys[:count]) * scale
                out[start + j] = torch.einsum("hk,khd->hd", scores.softmax(dim=-1),
                                              values[:count]).to(query.dtype)
        return out

    return varlen_paged_attention


def _engine_step_with(sample_every_chunk=False, one_layers_cache=False,
                      positions_from_zero=False, first_row=False, sample_past_the_prompt=False):

    def engine_step(engine, plan):
        model = engine.model
        batch = engine.build_batch(plan)
        positions = batch.positions
        if positions_from_zero:  # each chunk's tokens numbered 0, 1, ...
            positions = torch.cat([torch.arange(c.num_tokens) for c in plan.chunks])
        x = model.embed(batch.input_ids)
        for layer in range(model.config.num_layers):
            q, k, v = model.qkv(layer, x, positions)
            out = engine.attend(0 if one_layers_cache else layer, q, k, v, batch)
            x = model.finish_layer(layer, x, out)
        rows = batch.query_start_loc[:-1] if first_row else batch.query_start_loc[1:] - 1
        logits = model.logits(x[rows.long()])
        for chunk, row in zip(plan.chunks, logits, strict=True):
            request = chunk.request
            if sample_past_the_prompt:  # once the prompt is in, as if only prompts recomputed
                if chunk.end >= len(request.prompt):
                    request.emit(int(row.argmax()), row)
            elif sample_every_chunk or chunk.end == request.num_tokens:
                chunk.request.emit(int(row.argmax()), row)

    return engine_step


def _kernels():
    from kernels.varlen_attention import varlen_attention_kernel as kernel

    right = "context = seq_len - q_len + (token - start) + 1"
    return [
        (kernel_mutant(kernel, "no_causal_mask", right, "context = seq_len"),
         "apply the causal mask"),
        (kernel_mutant(kernel, "packed_index_as_position", right, "context = token + 1"),
         "the start offsets are per request"),
        (kernel_mutant(kernel, "context_one_short", right,
                 "context = seq_len - q_len + (token - start)"), "off-by-one"),
        (kernel_mutant(kernel, "every_block_of_the_request",
                       "range(first // BLOCK_SIZE, tl.cdiv(context, BLOCK_SIZE))",
                       "range(first // BLOCK_SIZE, tl.cdiv(seq_len, BLOCK_SIZE))"),
         "cdiv(context, BLOCK_SIZE) - 1; every key outside them is masked"),
        (kernel_mutant(kernel, "loop_from_block_0", "range(first // BLOCK_SIZE,", "range(0,"),
         "first // BLOCK_SIZE to cdiv(context, BLOCK_SIZE) - 1"),
        (kernel_mutant(kernel, "first_key_not_asked", "first = FIRST_KEY(context, window)",
                       "first = 0"), "where FIRST_KEY says they start later"),
        (kernel_mutant(kernel, "no_mask_before_the_first_key", "(positions >= first) & ", ""),
         "masking slots before first"),
        (kernel_mutant(kernel, "stores_the_padded_rows",
                       "out.to(out_ptr.dtype.element_ty), mask=q_mask)",
                       "out.to(out_ptr.dtype.element_ty), mask=dim_ok[None, :])"),
         "which belongs to another program"),
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
        (_named(_scheduler_with(admit_after_preemption=True), "_admits_after_a_preemption"),
         "no waiting request is admitted in that step"),
        (_named(_scheduler_with(slots_before_budget=True), "_slots_before_the_budget_pass"),
         "the budget does not reach this step takes no slot"),
        (_named(_scheduler_with(stop_after_preempting_another=True),
                "_pass_ends_after_preempting_another"),
         "Only a request that had to preempt itself (it was the newest) ends the pass"),
    ],
    "varlen_paged_attention": [
        (_named(_attention_with(lambda start, q_len, n, j: n), "_no_causal_mask"),
         "apply the causal mask"),
        (_named(_attention_with(lambda start, q_len, n, j: min(n, start + j + 1)),
                "_packed_index_as_position"), "the start offsets are per request"),
        (_named(_attention_with(lambda start, q_len, n, j: n - q_len + j),
                "_context_one_short"), "off-by-one"),
        (_named(_attention_with(lambda start, q_len, n, j: n - q_len + j + 1, precision=None),
                "_arithmetic_in_the_query_dtype"), "compute the scores, the softmax"),
    ],
    "varlen_attention_kernel": _kernels(),
    "engine_step": [
        (_named(_engine_step_with(sample_every_chunk=True), "_samples_after_every_chunk"),
         "are not computed yet"),
        (_named(_engine_step_with(one_layers_cache=True), "_every_layer_in_layer_0s_cache"),
         "that layer's number"),
        (_named(_engine_step_with(positions_from_zero=True), "_positions_from_the_chunk_start"),
         "true position"),
        (_named(_engine_step_with(first_row=True), "_logits_of_the_first_row"),
         "last row"),
        (_named(_engine_step_with(sample_past_the_prompt=True), "_samples_once_past_the_prompt"),
         "recomputed after a preemption"),
    ],
}

RULES = [
    Rule("Running requests first, in order, while the budget is above 0.", "schedule_step",
         ("_prefill_before_decodes",)),
    Rule("while the budget is above 0. First every token of the request without a slot gets "
         "one", "schedule_step", ("_slots_before_the_budget_pass",)),
    Rule("takes n from the budget", "schedule_step", ("_budget_overrun",)),
    Rule("Preempting another request ends nothing: this request gets its slot and the pass "
         "goes on to the next running request.", "schedule_step",
         ("_pass_ends_after_preempting_another",)),
    Rule("Then schedule min(request.num_tokens - request.num_computed_tokens, budget) tokens",
         "schedule_step", ("_chunk_not_clipped_to_the_prompt",)),
    Rule("chapter 4's allocate never counts the block that holds the last token",
         "schedule_step", ("_hit_counts_the_whole_prompt",)),
    Rule("set its num_computed_tokens to 0", "schedule_step",
         ("_preemption_keeps_computed_tokens",)),
    Rule("Waiting requests, only if nothing was preempted this step", "schedule_step",
         ("_admits_after_a_preemption",)),
    Rule("attends (causally) to the request's keys 0 .. seq_len - q_len + j",
         "varlen_paged_attention", ("_no_causal_mask", "_context_one_short")),
    Rule("its query j sits at position seq_len - q_len + j", "varlen_paged_attention",
         ("_packed_index_as_position",)),
    Rule("compute in fp32, return the query's dtype", "varlen_paged_attention",
         ("_arithmetic_in_the_query_dtype",)),
    Rule("context = position + 1 keys in all (the causal mask)", "varlen_attention_kernel",
         ("no_causal_mask", "context_one_short")),
    Rule("the request's first token and query length (query_start_loc_ptr)",
         "varlen_attention_kernel", ("packed_index_as_position",)),
    Rule("over blocks first // BLOCK_SIZE .. cdiv(context, BLOCK_SIZE) - 1 only",
         "varlen_attention_kernel", ("every_block_of_the_request", "loop_from_block_0")),
    Rule("first = FIRST_KEY(context, window)", "varlen_attention_kernel",
         ("first_key_not_asked",)),
    Rule("slots before first", "varlen_attention_kernel", ("no_mask_before_the_first_key",)),
    Rule("the padded group rows >= GROUP are never stored", "varlen_attention_kernel",
         ("stores_the_padded_rows",)),
    Rule("only where the chunk ends at the request's last known token", "engine_step",
         ("_samples_after_every_chunk", "_samples_once_past_the_prompt")),
    Rule("engine.attend(layer, q, k, v, batch)", "engine_step",
         ("_every_layer_in_layer_0s_cache",)),
    Rule("q, k, v = model.qkv(layer, x, batch.positions)", "engine_step",
         ("_positions_from_the_chunk_start",)),
    Rule("Then the logits of each chunk's last row", "engine_step",
         ("_logits_of_the_first_row",)),
]
