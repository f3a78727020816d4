"""Chapter 11's workloads and demonstrations for the tiny model: conversations that come back to
their prefixes, served with a CPU tier behind a connector or by a prefill/decode pair, and
compared token for token with contiguous generation."""

from __future__ import annotations

import random
from collections.abc import Callable

from course.language import tr_later
from course.tiny_model import TinyModel, generate_contiguous
from course.v0.prefix_cache import prefix_keys
from course.v1.chunked_engine import serve_chunked
from course.v1.chunked_scheduler import Chunk, ChunkedRequest, Schedule
from course.v1.connector_engine import ConnectorEngine, admit_with_connector
from course.v1.disaggregated import (
    KVHandoff,
    PrefillConnectorScheduler,
    PrefillConnectorWorker,
    disaggregated_pair,
    serve_disaggregated,
)
from course.v1.offload_tier import CPUTier
from course.v1.offloading_connector import OffloadingConnectorScheduler, offloading_connector


def conversations(count: int, seed: int, num_conversations: int = 4,
                  vocab: int = 128) -> list[ChunkedRequest]:
    """``count`` turns of ``num_conversations`` chats taken in turn, a few steps apart: each
    turn's prompt is its chat's previous prompt and a few new tokens, so it starts with a
    prefix the engine computed before (on the GPU, in a CPU tier, or evicted from both)."""
    rng = random.Random(seed)
    chats = [[rng.randrange(vocab) for _ in range(rng.randint(2, 8))]
             for _ in range(num_conversations)]
    requests = []
    for i in range(count):
        chat = chats[i % num_conversations]
        chat += [rng.randrange(vocab) for _ in range(rng.randint(1, 5))]
        requests.append(ChunkedRequest(i, list(chat), rng.randint(1, 5), 2 * i))
    return requests


def failing_keys(requests: list[ChunkedRequest], block_size: int, fraction: float,
                 seed: int) -> set:
    """A ``fraction`` of the requests' block keys, drawn with ``seed``: loads of these fail."""
    keys = sorted({key for r in requests for key in prefix_keys(r.prompt, block_size)})
    rng = random.Random(seed)
    return {key for key in keys if rng.random() < fraction}


def compare_with_contiguous(model: TinyModel, finished: list[ChunkedRequest]
                            ) -> tuple[int, float]:
    """How many requests generated exactly the tokens of a contiguous run, and the largest
    difference of any logit."""
    identical, largest = 0, 0.0
    for request in finished:
        tokens, logits = generate_contiguous(model, request.prompt, request.output_len)
        identical += request.output == tokens
        for ours, theirs in zip(request.logits, logits, strict=False):
            largest = max(largest, float((ours - theirs).abs().max()))
    return identical, largest


# (GPU blocks, block size, token budget, CPU blocks, load steps, share of loads failing, policy)
OFFLOAD_SCENARIOS = {
    tr_later("loads of one step"): (10, 4, 16, 64, 1, 0.0, "lru"),
    tr_later("loads of four steps"): (10, 4, 16, 64, 4, 0.0, "arc"),
    tr_later("chunked prefill, budget 3"): (8, 4, 3, 64, 2, 0.0, "lru"),
    tr_later("failed loads"): (10, 4, 16, 64, 2, 0.4, "lru"),
    tr_later("preemption and failures"): (12, 2, 8, 64, 2, 0.3, "arc"),
    tr_later("a tier of 3 blocks"): (10, 4, 16, 3, 1, 0.0, "arc"),
}


def serve_offloading(model: TinyModel, num_blocks: int, block_size: int, budget: int,
                     cpu_blocks: int, load_steps: int = 1, fail: float = 0.0,
                     policy: str = "lru", seed: int = 0, count: int = 12,
                     scheduler_half: type = OffloadingConnectorScheduler,
                     admit: Callable = admit_with_connector, max_steps: int = 1_000
                     ) -> tuple[ConnectorEngine, list[ChunkedRequest]]:
    """``count`` conversation turns served by an engine with a CPU tier behind its connector
    (``RuntimeError`` if they are not done in ``max_steps`` steps)."""
    requests = conversations(count, seed)
    connector = offloading_connector(cpu_blocks, block_size, policy, load_steps,
                                     failing_keys(requests, block_size, fail, seed),
                                     scheduler_half)
    engine = ConnectorEngine(model, num_blocks, block_size, budget, connector, admit=admit)
    return engine, serve_chunked(engine, requests, max_steps)


def unsettled(engine: ConnectorEngine) -> list[str]:
    """What an offloading engine still holds once it has nothing to do: blocks not back in
    its pool, loads in flight, blocks half stored in the tier. Empty when all is settled."""
    scheduler, tier = engine.scheduler, engine.connector.tier
    found = []
    if engine.kv_cache.num_held():
        found.append(f"{engine.kv_cache.num_held()} GPU blocks still held")
    if scheduler.loading or scheduler.received or scheduler.sending:
        found.append("requests still loading or sending")
    if engine.worker.in_flight.jobs or engine.connector.loading or tier.loading:
        found.append("loads still in flight")
    if set(tier.block_of) != tier.ready:
        found.append("CPU blocks half stored")
    if len(tier.block_of) + len(tier.free_blocks) != engine.worker.num_cpu_blocks:
        found.append("CPU blocks lost")
    return found


def offload_row(model: TinyModel, scenario: tuple, **engine: object) -> dict:
    """One scenario of ``OFFLOAD_SCENARIOS`` served (``engine``: ``scheduler_half``,
    ``admit``), as a row: requests, identical, blocks loaded, tokens computed again after a
    failed load, preemptions, the largest logit difference, whether everything settled."""
    served, finished = serve_offloading(model, *scenario, **engine)
    identical, largest = compare_with_contiguous(model, finished)
    return {"requests": len(finished), "identical": identical,
            "blocks_loaded": served.worker.bytes_loaded // served.worker.block_bytes,
            "recomputed": served.scheduler.recomputed_tokens,
            "preemptions": sum(len(r.preempted) for r in served.records),
            "largest_logit_difference": largest, "settled": not unsettled(served)}


# (prefill blocks, decode blocks, block size, token budget, load steps, lease steps)
PAIR_SCENARIOS = {
    tr_later("loads of one step"): (32, 32, 4, 16, 1, 64),
    tr_later("slow loads, chunked"): (16, 20, 4, 5, 3, 64),
    tr_later("blocks of 2, short lease"): (16, 20, 2, 8, 2, 2),
    tr_later("lease shorter than the load"): (12, 16, 4, 16, 4, 3),
}


def pair_row(model: TinyModel, scenario: tuple, seed: int = 0, count: int = 12,
             **engine: object) -> dict:
    """One scenario of ``PAIR_SCENARIOS`` served by a prefill engine and a decode engine
    (``engine``: ``admit``), as a row: requests, identical, blocks handed over, tokens the
    decode engine computed because the prefill engine had let their blocks go, and whether
    both pools ended empty."""
    *sizes, load_steps, lease_steps = scenario
    pair = disaggregated_pair(model, *sizes, load_steps, lease_steps, **engine)
    finished = serve_disaggregated(pair, conversations(count, seed), max_steps=1_000)
    identical, largest = compare_with_contiguous(model, finished)
    empty = all(not e.kv_cache.num_held() and not e.scheduler.sending
                for e in (pair.prefill, pair.decode))
    return {"requests": len(finished), "identical": identical,
            "blocks_handed_over": pair.decode.worker.bytes_loaded // pair.decode.worker.block_bytes,
            "recomputed": pair.decode.scheduler.recomputed_tokens,
            "largest_logit_difference": largest,
            "settled": empty and not pair.prefill.worker.leases and not pair.handoff.taken}


def abandoned_prefill(model: TinyModel, lease_steps: int = 5, count: int = 6, seed: int = 1,
                      **engine: object) -> dict:
    """A prefill engine whose decode engine never reads: each finished request's blocks are
    kept for their lease, then freed. Its requests, the blocks it still holds at the end, and
    how many leases ran out."""
    handoff = KVHandoff()
    served = ConnectorEngine(model, 16, 4, 16, (PrefillConnectorScheduler(4),
                                                PrefillConnectorWorker(handoff, lease_steps)),
                             **engine)
    requests = conversations(count, seed)
    for request in requests:
        request.output_len = 1
    finished = serve_chunked(served, requests, max_steps=1_000)
    return {"requests": len(finished),
            "blocks_held": served.kv_cache.num_held(),
            "still_sending": len(served.scheduler.sending), "released": len(handoff.released)}


def scheduler_half_probe(half: type) -> tuple:
    """What a scheduler half of class ``half`` does in a short scenario, in terms any correct
    one reports alike: what a 14-token request with a GPU hit of one block finds in a tier
    holding its first three blocks (blocks of 4), and which GPU blocks a 14-token prefill of
    another request saves."""
    tokens = list(range(14))
    keys = prefix_keys(tokens, 4)
    tier = CPUTier(8)
    tier.prepare_store(keys[:3])
    tier.complete_store(keys[:3])
    scheduler = half(tier, 4)
    found = scheduler.get_num_new_matched_tokens(ChunkedRequest(0, tokens, 1), 4)
    other = ChunkedRequest(1, list(range(50, 64)), 1)
    metadata = scheduler.build_connector_meta(Schedule([Chunk(other, 0, 14)]), {1: [5, 6, 7, 8]})
    return found, [copy.gpu_block for copy in metadata.saves.get(1, [])]


def admission_probe(admit: Callable) -> dict:
    """``pair_row`` of the slow-loads scenario, both engines admitting with ``admit`` (no TODO
    of the scheduler half takes part)."""
    return pair_row(TinyModel(), PAIR_SCENARIOS["slow loads, chunked"], admit=admit)
