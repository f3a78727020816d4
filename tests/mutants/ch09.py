"""Wrong chapter 9 solutions, as learners write them, with the hint each must get."""

from __future__ import annotations

import torch

from course.v0.prefix_cache import prefix_keys
from course.v1.chunked_scheduler import Chunk, Schedule
from mutants import Rule, kernel_mutant


def _scheduler_with(prefill_first=False, clip_budget=True, clip_remaining=True,
                    whole_hit=False, hit_from_zero=False, hit_as_blocks=False, reset=True,
                    free_victim=True, victim_to_front=True, preempt_oldest=False,
                    ask_again_after_itself=False, stop_after_preempting_another=False,
                    admit_after_preemption=False, cap_running=True, room_for_the_step=True,
                    reset_after_refusal=True, stop_at_refusal=True):
    """The scheduling step with one rule misread."""

    def schedule_step(scheduler):
        kv, plan = scheduler.kv_cache, Schedule()
        budget = [scheduler.max_num_batched_tokens]

        def num_new(request):
            left = request.num_tokens - (request.num_computed_tokens if clip_remaining else 0)
            return min(left, budget[0]) if clip_budget else left

        def room(request, n):
            if room_for_the_step:
                return kv.allocate_slots(request, n)
            # room for every token left, though only n are scheduled now
            return kv.allocate_slots(request, request.num_tokens - request.num_computed_tokens)

        def run(request, n):
            plan.chunks.append(Chunk(request, request.num_computed_tokens, n))
            request.num_computed_tokens += n
            budget[0] -= n

        def preempt():
            victim = scheduler.running.pop(0 if preempt_oldest else -1)
            if free_victim:
                kv.free(victim)
            if reset:
                victim.num_computed_tokens = 0
            if victim_to_front:
                scheduler.waiting.appendleft(victim)
            else:
                scheduler.waiting.append(victim)
            plan.preempted.append(victim.id)
            return victim

        def running():
            index = 0
            while index < len(scheduler.running) and budget[0] > 0:
                request = scheduler.running[index]
                n = num_new(request)
                preempted_another = preempted_itself = False
                while not room(request, n):
                    victim = preempt()
                    if victim is request:
                        preempted_itself = True
                        if not ask_again_after_itself:
                            break
                    else:
                        preempted_another = True
                if preempted_itself and not ask_again_after_itself:
                    break
                run(request, n)
                index += 1
                if stop_after_preempting_another and preempted_another:
                    break  # as if preempting anyone ended the pass

        def hit_of(request):
            if hit_from_zero:  # every new request computed from its first token
                return 0
            if hit_as_blocks:  # the hit read as a number of blocks
                return kv.get_computed_tokens(request) * kv.block_size
            if whole_hit:  # every cached full block counted, the last one too
                hits = 0
                for key in prefix_keys(request.tokens, kv.block_size):
                    if kv.pool.cached_block(0, key) is None:
                        break
                    hits += kv.block_size
                return hits
            return kv.get_computed_tokens(request)

        def waiting():
            if plan.preempted and not admit_after_preemption:
                return
            for request in list(scheduler.waiting):
                if budget[0] <= 0 or (cap_running and
                                      len(scheduler.running) >= scheduler.max_num_seqs):
                    break
                request.num_computed_tokens = hit_of(request)
                n = num_new(request)
                if not room(request, n):
                    if reset_after_refusal:
                        request.num_computed_tokens = 0
                    if stop_at_refusal:
                        break
                    continue  # as if a later request could take the place of this one
                scheduler.waiting.remove(request)
                scheduler.running.append(request)
                run(request, n)

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
        (_named(_scheduler_with(room_for_the_step=False), "_room_for_every_token_left"),
         "not for every token left"),
        (_named(_scheduler_with(whole_hit=True), "_hit_counts_the_whole_prompt"),
         "at least one token is always computed"),
        (_named(_scheduler_with(hit_from_zero=True), "_new_request_from_token_0"),
         "set its num_computed_tokens to kv.get_computed_tokens(request)"),
        (_named(_scheduler_with(hit_as_blocks=True), "_hit_read_as_blocks"),
         "not a number of blocks"),
        (_named(_scheduler_with(preempt_oldest=True), "_preempts_the_oldest"),
         "preempt the last of scheduler.running"),
        (_named(_scheduler_with(free_victim=False), "_victim_keeps_its_blocks"),
         "kv.free(request) gives them back to the pool"),
        (_named(_scheduler_with(reset=False), "_preemption_keeps_computed_tokens"),
         "set num_computed_tokens to 0"),
        (_named(_scheduler_with(victim_to_front=False), "_victim_at_the_back_of_waiting"),
         "goes back first (waiting.appendleft)"),
        (_named(_scheduler_with(ask_again_after_itself=True),
                "_asks_again_after_preempting_itself"),
         "A request that preempted itself was asked for again"),
        (_named(_scheduler_with(stop_after_preempting_another=True),
                "_pass_ends_after_preempting_another"),
         "Only a request that had to preempt itself (it was the newest) ends the pass"),
        (_named(_scheduler_with(admit_after_preemption=True), "_admits_after_a_preemption"),
         "no waiting request is admitted in that step"),
        (_named(_scheduler_with(cap_running=False), "_ignores_max_num_seqs"),
         "fewer than max_num_seqs requests run"),
        (_named(_scheduler_with(reset_after_refusal=False), "_refused_request_keeps_its_hit"),
         "kept its prefix hit as num_computed_tokens"),
        (_named(_scheduler_with(stop_at_refusal=False), "_admits_past_a_refusal"),
         "admitting stops"),
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
    Rule("Running requests, in order (scheduler.running, oldest first)", "schedule_step",
         ("_prefill_before_decodes",)),
    Rule("num_new = min(request.num_tokens - request.num_computed_tokens, budget)",
         "schedule_step", ("_budget_overrun", "_chunk_not_clipped_to_the_prompt")),
    Rule("ask kv.allocate_slots(request, num_new) for their slots", "schedule_step",
         ("_room_for_every_token_left",)),
    Rule("preempt the newest running request (the last of scheduler.running)",
         "schedule_step", ("_preempts_the_oldest",)),
    Rule("kv.free(it)", "schedule_step", ("_victim_keeps_its_blocks",)),
    Rule("set its num_computed_tokens to 0", "schedule_step",
         ("_preemption_keeps_computed_tokens",)),
    Rule("put it at the front of waiting", "schedule_step", ("_victim_at_the_back_of_waiting",)),
    Rule("then ask again, unless the request preempted was this one (no running request is "
         "left after it, and the pass ends)", "schedule_step",
         ("_asks_again_after_preempting_itself", "_pass_ends_after_preempting_another")),
    Rule("Waiting requests, only if nothing was preempted this step", "schedule_step",
         ("_admits_after_a_preemption",)),
    Rule("fewer than max_num_seqs requests run", "schedule_step", ("_ignores_max_num_seqs",)),
    Rule("its num_computed_tokens becomes its prefix hit, kv.get_computed_tokens(request)",
         "schedule_step", ("_new_request_from_token_0", "_hit_read_as_blocks")),
    Rule("which never reaches its last token: there is always one to compute",
         "schedule_step", ("_hit_counts_the_whole_prompt",)),
    Rule("its num_computed_tokens goes back to 0", "schedule_step",
         ("_refused_request_keeps_its_hit",)),
    Rule("returns False, its num_computed_tokens goes back to 0 and admitting stops",
         "schedule_step", ("_admits_past_a_refusal",)),
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
