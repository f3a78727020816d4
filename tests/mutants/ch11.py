"""Wrong chapter 11 solutions, as learners write them, with the hint each must get; and
``RULES``: each rule the notebook states about a TODO, with the mutants that break it alone."""

from __future__ import annotations

from course.v1.chunked_scheduler import Chunk
from course.v1.kv_connector import KVConnectorMetadata
from course.v1.offloading_connector import BlockCopy
from mutants import Rule


def _named(name: str, fn):
    fn.__name__ = name
    return fn


# --- get_num_new_matched_tokens ----------------------------------------------------------------


def _matching(first_block=lambda hit, size: hit // size,
              last_block=lambda tokens, size: (tokens - 1) // size,
              counted=None, per_block=None, asynchronous=lambda found: found > 0,
              prompt_only=False):
    """``get_num_new_matched_tokens`` with the candidates from ``first_block`` to
    ``last_block``, the found ones counted by ``counted(tier, keys)`` (else the tier's lookup),
    ``per_block`` tokens each (else block_size)."""

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        first = first_block(num_computed_tokens, self.block_size)
        tokens = len(request.prompt) if prompt_only else request.num_tokens
        last = last_block(tokens, self.block_size)
        keys = self.block_keys(request, last)[first:]
        found = counted(self.tier, keys) if counted else self.tier.lookup(keys)
        return found * (per_block or self.block_size), asynchronous(found)

    return get_num_new_matched_tokens


def _every_held(tier, keys):
    return sum(key in tier.ready for key in keys)


def _held_or_written(tier, keys):
    count = 0
    while count < len(keys) and keys[count] in tier.block_of:
        count += 1
    return count


_from_block_0 = _named("_from_block_0", _matching(first_block=lambda hit, size: 0))
_the_last_tokens_block_too = _named("_the_last_tokens_block_too", _matching(
    last_block=lambda tokens, size: -(-tokens // size)))
_blocks_not_tokens = _named("_blocks_not_tokens", _matching(per_block=1))
_the_prompts_blocks_only = _named("_the_prompts_blocks_only", _matching(prompt_only=True))
_always_asynchronous = _named("_always_asynchronous",
                              _matching(asynchronous=lambda found: True))
_every_held_block = _named("_every_held_block", _matching(counted=_every_held))
_blocks_being_written = _named("_blocks_being_written", _matching(counted=_held_or_written))


# --- build_connector_meta ----------------------------------------------------------------------


def _metadata(empty_pending=True, record_loading=True, last_block=lambda end, size: end // size,
              table_from_first=True, empty_entries=False, together=True):
    """``build_connector_meta`` with each of its rules as a switch."""

    def build_connector_meta(self, schedule, block_ids):
        metadata = KVConnectorMetadata(loads=dict(self.pending))
        if record_loading:
            for request_id, copies in self.pending.items():
                self.loading[request_id] = [copy.key for copy in copies]
        if empty_pending:
            self.pending = {}
        for chunk in schedule.chunks:
            first = chunk.start // self.block_size
            last = last_block(chunk.end, self.block_size)
            keys = self.block_keys(chunk.request, last)[first:]
            if together:
                room = self.tier.prepare_store(keys)
                stored = room[0] if room else []
            else:  # a key at a time: some of the chunk's blocks saved when not all fit
                stored = []
                for key in keys:
                    one = self.tier.prepare_store([key])
                    stored += one[0] if one else []
            table = block_ids[chunk.request.id]
            offset = first if table_from_first else 0
            where = {key: table[offset + i] for i, key in enumerate(keys)}
            copies = [BlockCopy(where[key], cpu, key) for key, cpu in stored]
            if copies or empty_entries:
                metadata.saves[chunk.request.id] = copies
        return metadata

    return build_connector_meta


_loads_handed_over_again = _named("_loads_handed_over_again", _metadata(empty_pending=False))
_loads_not_kept_in_flight = _named("_loads_not_kept_in_flight",
                                   _metadata(record_loading=False))
_saves_the_unfinished_block = _named("_saves_the_unfinished_block", _metadata(
    last_block=lambda end, size: -(-end // size)))
_gpu_block_from_the_tables_start = _named("_gpu_block_from_the_tables_start",
                                          _metadata(table_from_first=False))
_an_entry_for_no_saves = _named("_an_entry_for_no_saves", _metadata(empty_entries=True))
_stores_a_block_at_a_time = _named("_stores_a_block_at_a_time", _metadata(together=False))


# --- admit_with_connector ----------------------------------------------------------------------


def _admission(skip_loading=True, wait_for_loads=True, count_loaded=True, cache_loaded=True,
               leave_loading=True, hold_new_when_full=True, loaded_when_full=True,
               zero_when_asked_later=True, zero_when_refused=True, from_the_hit=True,
               room_for_every_token=True, room_for_num_new=True, told_after_room=True,
               count_after_room=True, skipped_in_front=True, stop_when_preempted=True,
               cap_seqs=True, cap_budget=True):
    """``admit_with_connector`` with each of its rules as a switch."""

    def admit_with_connector(scheduler, plan):
        kv, connector = scheduler.kv_cache, scheduler.connector
        budget = scheduler.max_num_batched_tokens - plan.total_num_scheduled_tokens
        skipped, pool_full = [], False
        while (scheduler.waiting and budget > 0 and (not plan.preempted or not
                                                       stop_when_preempted)
               and (len(scheduler.running) < scheduler.max_num_seqs or not cap_seqs)):
            request = scheduler.waiting.popleft()
            if request.id in scheduler.loading:
                if request.id not in scheduler.received:
                    skipped.append(request)
                    if not skip_loading:
                        break
                    continue
                if leave_loading:
                    scheduler.loading.remove(request.id)
                    scheduler.received.remove(request.id)
                if cache_loaded:
                    kv.cache_blocks(request)
            else:
                if pool_full and hold_new_when_full:
                    skipped.append(request)
                    continue
                hits = kv.get_computed_tokens(request) if from_the_hit else 0
                request.num_computed_tokens = hits
                num_external, _ = connector.get_num_new_matched_tokens(request, hits)
                if num_external is None:
                    if zero_when_asked_later:
                        request.num_computed_tokens = 0
                    skipped.append(request)
                    continue
                if not told_after_room:  # no table yet: the connector is given none
                    connector.update_state_after_alloc(request, [], num_external)
                if not count_after_room:
                    request.num_computed_tokens += num_external
                if num_external:
                    room = request.num_tokens - hits if room_for_every_token else num_external
                else:
                    room = min(request.num_tokens - hits, budget) if room_for_num_new else \
                        request.num_tokens - hits
                if not kv.allocate_slots(request, room):
                    if zero_when_refused:
                        request.num_computed_tokens = 0
                    pool_full = True
                    skipped.append(request)
                    if not loaded_when_full:
                        break
                    continue
                if told_after_room:
                    connector.update_state_after_alloc(request, kv.block_table(request.id),
                                                       num_external)
                if count_loaded and count_after_room:
                    request.num_computed_tokens += num_external
                if num_external and wait_for_loads:
                    scheduler.loading.add(request.id)
                    skipped.append(request)
                    continue
            scheduler.running.append(request)
            remaining = request.num_tokens - request.num_computed_tokens
            num_new = min(remaining, budget) if cap_budget else remaining
            plan.chunks.append(Chunk(request, request.num_computed_tokens, num_new))
            request.num_computed_tokens += num_new
            budget -= num_new
        if skipped_in_front:
            scheduler.waiting.extendleft(reversed(skipped))
        else:
            scheduler.waiting.extend(skipped)

    return admit_with_connector


_ADMISSIONS = {
    "_stops_at_a_loading_request": dict(skip_loading=False),
    "_runs_before_its_load_lands": dict(wait_for_loads=False),
    "_computes_the_loaded_tokens_again": dict(count_loaded=False),
    "_loaded_blocks_never_cached": dict(cache_loaded=False),
    "_still_loading_once_it_runs": dict(leave_loading=False),
    "_new_requests_after_one_that_did_not_fit": dict(hold_new_when_full=False),
    "_nothing_after_one_that_did_not_fit": dict(loaded_when_full=False),
    "_keeps_its_hit_when_asked_again_later": dict(zero_when_asked_later=False),
    "_keeps_its_hit_when_refused_room": dict(zero_when_refused=False),
    "_ignores_the_gpu_hit": dict(from_the_hit=False),
    "_room_for_the_loaded_tokens_only": dict(room_for_every_token=False),
    "_room_for_every_token_when_it_runs_now": dict(room_for_num_new=False),
    "_tells_the_connector_before_its_room": dict(told_after_room=False),
    "_adds_the_loaded_tokens_before_its_room": dict(count_after_room=False),
    "_skipped_requests_to_the_back": dict(skipped_in_front=False),
    "_admits_after_a_preemption": dict(stop_when_preempted=False),
    "_no_max_num_seqs": dict(cap_seqs=False),
    "_no_token_budget": dict(cap_budget=False),
}
_admission_mutants = {name: _named(name, _admission(**flags))
                      for name, flags in _ADMISSIONS.items()}

_MATCH = "tier.lookup counts those it holds from the first"
_META = "build_connector_meta hands over every load decided since the last step"

MUTANTS = {
    "get_num_new_matched_tokens": [
        (_from_block_0, "The GPU's hit is computed already"),
        (_the_last_tokens_block_too, "The block that holds the last token is never loaded"),
        (_blocks_not_tokens, "It returns tokens, not blocks"),
        (_always_asynchronous, "With nothing to load there is nothing to wait for"),
        (_every_held_block, _MATCH),
        (_blocks_being_written, "A block still being written cannot be loaded yet"),
        (_the_prompts_blocks_only, "A request can come back with generated tokens"),
    ],
    "build_connector_meta": [
        (_loads_handed_over_again, _META),
        (_loads_not_kept_in_flight, _META),
        (_saves_the_unfinished_block, "saves the full blocks each chunk completes"),
        (_gpu_block_from_the_tables_start, "the request's table at the block's index"),
        (_an_entry_for_no_saves, _META),
        (_stores_a_block_at_a_time, "None: that chunk saves nothing"),
    ],
    "admit_with_connector": [(_admission_mutants[name], hint) for name, hint in [
        ("_stops_at_a_loading_request", "the requests behind it are still looked at"),
        ("_runs_before_its_load_lands", "skipped until the load is reported done"),
        ("_computes_the_loaded_tokens_again", "The tokens loaded are computed"),
        ("_loaded_blocks_never_cached", "has its computed tokens cached"),
        ("_still_loading_once_it_runs", "leaves both scheduler.loading and scheduler.received"),
        ("_new_requests_after_one_that_did_not_fit", "no new request is admitted that step"),
        ("_nothing_after_one_that_did_not_fit", "even once a new request found no room"),
        ("_keeps_its_hit_when_asked_again_later", "asks to be asked again later (None) is "
                                                  "skipped with its num_computed_tokens back"),
        ("_keeps_its_hit_when_refused_room", "finds no room for (False) is skipped with its "
                                             "num_computed_tokens back to 0"),
        ("_ignores_the_gpu_hit", "A new request starts from its GPU hit"),
        ("_room_for_the_loaded_tokens_only", "gets room for every token it knows"),
        ("_room_for_every_token_when_it_runs_now", "gets room for the num_new tokens it runs"),
        ("_tells_the_connector_before_its_room", "once kv.allocate_slots has made room"),
        ("_adds_the_loaded_tokens_before_its_room", "the n loaded tokens are added once its "
                                                    "room is made"),
        ("_skipped_requests_to_the_back", "keep their order at the front of waiting"),
        ("_admits_after_a_preemption", "Admission stops when the step preempted"),
        ("_no_max_num_seqs", "or max_num_seqs requests run"),
        ("_no_token_budget", "less what the running requests took"),
    ]],
}

RULES = [
    Rule("The candidates are the request's blocks from the GPU hit's end, block "
         "num_computed_tokens // block_size", "get_num_new_matched_tokens", ("_from_block_0",)),
    Rule("up to but not including the block that holds its last token",
         "get_num_new_matched_tokens", ("_the_last_tokens_block_too",)),
    Rule("block (request.num_tokens - 1) // block_size", "get_num_new_matched_tokens",
         ("_the_prompts_blocks_only",)),
    Rule("self.tier.lookup(keys) says how many of keys, from the first, the tier holds",
         "get_num_new_matched_tokens", ("_every_held_block", "_blocks_being_written")),
    Rule("Each block found is block_size tokens.", "get_num_new_matched_tokens",
         ("_blocks_not_tokens",)),
    Rule("(num_tokens, num_tokens > 0)", "get_num_new_matched_tokens",
         ("_always_asynchronous",)),
    Rule("record its keys in self.loading[request_id]", "build_connector_meta",
         ("_loads_not_kept_in_flight",)),
    Rule("and empty self.pending.", "build_connector_meta", ("_loads_handed_over_again",)),
    Rule("the full blocks the chunk completes, blocks chunk.start // block_size to chunk.end "
         "// block_size (not included)", "build_connector_meta",
         ("_saves_the_unfinished_block",)),
    Rule("their keys (self.block_keys) go to self.tier.prepare_store(keys)",
         "build_connector_meta", ("_stores_a_block_at_a_time",)),
    Rule("the GPU block read from the request's table block_ids[request_id] at the block's "
         "index", "build_connector_meta", ("_gpu_block_from_the_tables_start",)),
    Rule("a chunk with none adds no entry.", "build_connector_meta",
         ("_an_entry_for_no_saves",)),
    Rule("its load is in flight; skip it (it keeps its place and its blocks) and look at the "
         "next.", "admit_with_connector", ("_stops_at_a_loading_request",)),
    Rule("its load is done; it leaves both sets", "admit_with_connector",
         ("_still_loading_once_it_runs",)),
    Rule("its computed tokens (hits and loaded tokens, less what failed) are cached "
         "(kv.cache_blocks(request)), and it runs", "admit_with_connector",
         ("_loaded_blocks_never_cached",)),
    Rule("num_computed_tokens becomes its GPU hit (kv.get_computed_tokens(request))",
         "admit_with_connector", ("_ignores_the_gpu_hit",)),
    Rule("None means ask again later (num_computed_tokens back to 0, skip it)",
         "admit_with_connector", ("_keeps_its_hit_when_asked_again_later",)),
    Rule("with n > 0, for every token it knows after its hit (num_tokens - hits: the loaded "
         "ones arrive while it waits, and once they have it runs without asking for more)",
         "admit_with_connector", ("_room_for_the_loaded_tokens_only",)),
    Rule("else for the num_new tokens it runs now.", "admit_with_connector",
         ("_room_for_every_token_when_it_runs_now",)),
    Rule("False: its num_computed_tokens goes back to 0", "admit_with_connector",
         ("_keeps_its_hit_when_refused_room",)),
    Rule("and it and every new request after it are skipped this step", "admit_with_connector",
         ("_new_requests_after_one_that_did_not_fit",)),
    Rule("requests whose load is done still run", "admit_with_connector",
         ("_nothing_after_one_that_did_not_fit",)),
    Rule("Then connector.update_state_after_alloc(request, kv.block_table(id), n).",
         "admit_with_connector", ("_tells_the_connector_before_its_room",)),
    Rule("With n > 0 its num_computed_tokens grows by n", "admit_with_connector",
         ("_computes_the_loaded_tokens_again", "_adds_the_loaded_tokens_before_its_room")),
    Rule("and it waits for its load: into scheduler.loading, skipped.",
         "admit_with_connector", ("_runs_before_its_load_lands",)),
    Rule("while plan preempted nothing", "admit_with_connector",
         ("_admits_after_a_preemption",)),
    Rule("budget is left (max_num_batched_tokens minus what plan schedules)",
         "admit_with_connector", ("_no_token_budget",)),
    Rule("fewer than max_num_seqs requests run", "admit_with_connector", ("_no_max_num_seqs",)),
    Rule("The requests skipped keep their order at the front of waiting.",
         "admit_with_connector", ("_skipped_requests_to_the_back",)),
]
