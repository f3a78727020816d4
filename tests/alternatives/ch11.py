"""Chapter 11 solved another way: the scheduler half keeps each request's keys as a dict by
block index and walks the tier block by block, saves grouped by request before they are
handed over; the admission reads the queue by index and rebuilds it at the end."""

from __future__ import annotations

from course.v0.prefix_cache import ROOT_KEY, block_key
from course.v1.chunked_scheduler import Chunk
from course.v1.kv_connector import KVConnectorMetadata, KVConnectorScheduler
from course.v1.offloading_connector import BlockCopy


class OffloadingConnectorScheduler(KVConnectorScheduler):
    def __init__(self, tier, block_size):
        self.tier, self.block_size = tier, block_size
        self.known = {}  # request id -> {block index: key}
        self.pending, self.loading, self.admissions = {}, {}, []

    def block_keys(self, request, num_blocks):
        known = self.known.setdefault(request.id, {})
        for index in range(num_blocks):
            if index not in known:
                parent = known[index - 1] if index else ROOT_KEY
                start = index * self.block_size
                known[index] = block_key(parent, request.tokens[start:start + self.block_size])
        return [known[index] for index in range(num_blocks)]

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        stop = (request.num_tokens - 1) // self.block_size
        keys = self.block_keys(request, stop)
        index = num_computed_tokens // self.block_size
        while index < stop and self.tier.lookup([keys[index]]) == 1:
            index += 1
        tokens = (index - num_computed_tokens // self.block_size) * self.block_size
        return tokens, tokens != 0

    def update_state_after_alloc(self, request, block_ids, num_external_tokens):
        self.admissions.append((request.id, request.num_tokens, request.num_computed_tokens,
                                num_external_tokens))
        if num_external_tokens == 0:
            return
        first = request.num_computed_tokens // self.block_size
        count = num_external_tokens // self.block_size
        keys = self.block_keys(request, first + count)[first:]
        cpu = self.tier.prepare_load(keys)
        self.tier.touch(keys)
        self.pending[request.id] = [BlockCopy(block_ids[first + i], cpu[i], keys[i])
                                    for i in range(count)]

    def build_connector_meta(self, schedule, block_ids):
        handed, self.pending = self.pending, {}
        for request_id in handed:
            self.loading[request_id] = [copy.key for copy in handed[request_id]]
        saves = {}
        for chunk in schedule.chunks:
            first = chunk.start // self.block_size
            keys = self.block_keys(chunk.request, chunk.end // self.block_size)
            room = self.tier.prepare_store(keys[first:])
            if room is None:
                continue
            index_of = {key: index for index, key in enumerate(keys)}
            found = [BlockCopy(block_ids[chunk.request.id][index_of[key]], cpu, key)
                     for key, cpu in room[0]]
            saves.update({chunk.request.id: found} if found else {})
        return KVConnectorMetadata(loads=handed, saves=saves)

    def update_connector_output(self, output):
        for request_id in output.finished_recving:
            self.tier.complete_load(self.loading.pop(request_id))
        self.tier.complete_store(output.worker_meta or [])

    def request_finished(self, request, block_ids):
        self.known.pop(request.id, None)
        return False, None


ALTERNATIVES = [OffloadingConnectorScheduler]


def admit_with_connector(scheduler, plan):
    kv, connector = scheduler.kv_cache, scheduler.connector
    queue = list(scheduler.waiting)
    budget = scheduler.max_num_batched_tokens - plan.total_num_scheduled_tokens
    held_back, index, new_ones_fit = [], 0, True

    def room_for(request, hit, extra):
        """Whether the pool has room: every token after the hit for one that will wait for
        its load, else this step's share."""
        wanted = request.num_tokens - hit
        return kv.allocate_slots(request, wanted if extra > 0 else min(wanted, budget))

    while index < len(queue) and not plan.preempted and budget > 0 \
            and len(scheduler.running) < scheduler.max_num_seqs:
        request = queue[index]
        index += 1
        loading = request.id in scheduler.loading
        if loading and request.id not in scheduler.received:
            held_back.append(request)
            continue
        if loading:
            scheduler.loading.discard(request.id)
            scheduler.received.discard(request.id)
            kv.cache_blocks(request)
        elif not new_ones_fit:
            held_back.append(request)
            continue
        else:
            hit = kv.get_computed_tokens(request)
            request.num_computed_tokens = hit
            extra, _ = connector.get_num_new_matched_tokens(request, hit)
            fits = extra is not None and room_for(request, hit, extra)
            if not fits:
                request.num_computed_tokens = 0
                new_ones_fit = extra is None
                held_back.append(request)
                continue
            connector.update_state_after_alloc(request, kv.block_table(request.id), extra)
            request.num_computed_tokens = hit + extra
            if extra > 0:
                scheduler.loading.add(request.id)
                held_back.append(request)
                continue
        count = min(budget, request.num_tokens - request.num_computed_tokens)
        plan.chunks.append(Chunk(request, request.num_computed_tokens, count))
        request.num_computed_tokens += count
        budget -= count
        scheduler.running.append(request)
    scheduler.waiting.clear()
    scheduler.waiting.extend(held_back + queue[index:])
