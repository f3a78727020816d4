"""Chapter 14's KV events, explored as states: an engine's KV cache (chapter 9's, with the
fleet's hash) serves requests with shared prefixes and tenants' salts, evicts, is reset; after
every step it publishes its events over real ZMQ sockets (in-process transport), and some
batches are lost on the way. The router's indexer applies what arrives, finds the gaps, asks
for replays and resynchronises. Whatever happened, once it has caught up the index holds
exactly the hashes the engine's cache holds, or, when the replay buffer no longer held what
was lost, never a hash the engine does not hold."""

from __future__ import annotations

import itertools
import threading

import zmq
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from course.v1.chunked_scheduler import ChunkedRequest, ChunkedScheduler
from course.v1.fleet_cache import FleetKVCacheCoordinator
from course.v1.kv_events import (
    DECODER,
    ENCODER,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    ZmqEventPublisher,
    ZmqEventSubscriber,
)
from course.v1.kv_indexer import KVIndexer

PREFIXES = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9, 9], [7, 7, 7, 7]]
endpoints = (f"inproc://events-{n}" for n in itertools.count())


def replay(publisher: ZmqEventPublisher, subscriber: ZmqEventSubscriber, start: int):
    """Ask for a replay while the publisher's loop (a thread here) serves it."""
    server = threading.Thread(target=publisher.serve_replay, kwargs={"timeout_ms": 5_000})
    server.start()
    try:
        return subscriber.replay(start, timeout_ms=5_000)
    finally:
        server.join()


class EngineAndIndexer(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.context = zmq.Context()
        self.index = KVIndexer()
        self.ids = itertools.count()
        self.start_engine()

    def start_engine(self) -> None:
        """A fresh engine: an empty cache, a new publisher whose first batch (seq 0, sent) is
        ``AllBlocksCleared``. The index is not told: batch 0 is how it learns."""
        pub, rep = next(endpoints), next(endpoints)
        self.publisher = ZmqEventPublisher(pub, rep, buffer_steps=5, context=self.context)
        self.subscriber = ZmqEventSubscriber(pub, rep, context=self.context)
        self.cache = FleetKVCacheCoordinator(num_blocks=9, block_size=2)
        self.scheduler = ChunkedScheduler(9, 2, max_num_batched_tokens=5, kv_cache=self.cache)
        self.publisher.publish([AllBlocksCleared()])
        self.last_lost = False
        self.lost_for_good = False

    def teardown(self) -> None:
        self.subscriber.close()
        self.publisher.close()
        self.context.term()

    @rule(prefix=st.sampled_from(PREFIXES), tail=st.lists(st.integers(0, 3), max_size=3),
          salt=st.sampled_from([None, "tenant-a", "tenant-b"]), output=st.integers(1, 3))
    def add_request(self, prefix, tail, salt, output):
        if len(self.scheduler.running) + len(self.scheduler.waiting) < 3:
            self.scheduler.add(ChunkedRequest(next(self.ids), prefix + tail, output,
                                              cache_salt=salt))

    @rule(lose=st.booleans())
    def step(self, lose):
        plan = self.scheduler.step()
        for chunk in plan.chunks:  # no model: each request emits a token of its own
            if chunk.end == chunk.request.num_tokens:
                chunk.request.emit(chunk.request.id % 4)
        for request in [r for r in self.scheduler.running if r.done]:
            self.scheduler.finish(request)
        self.publish(lose)

    @rule(lose=st.booleans())
    def reset_prefix_cache(self, lose):
        self.cache.reset()
        self.publish(lose)

    def publish(self, lose: bool) -> None:
        events = self.cache.take_events()
        sent = KVEventBatch(ts=0.0, events=events)
        assert DECODER.decode(ENCODER.encode(sent)).events == events  # the wire keeps them
        self.publisher.publish(events, send=not lose)
        self.last_lost = lose

    @rule(told=st.booleans())
    def restart_engine(self, told):
        """The engine restarts; the router is told (as the fleet's driver tells it), or learns
        from batch 0 alone."""
        self.subscriber.close()
        self.publisher.close()
        self.start_engine()
        if told:
            self.index.restarted(0)

    @rule()
    def receive(self):
        self.drain()
        if not self.last_lost:  # the newest batch arrived: so did, or were replayed, all before
            self.caught_up()

    def drain(self) -> None:
        for seq, batch in self.subscriber.receive(timeout_ms=5):
            missing = self.index.apply_batch(0, seq, batch)
            if missing is not None:
                self.resync(missing)

    def resync(self, start: int) -> None:
        """Replay from ``start``; whether the engine's buffer still held the first batch the
        index lacks is the test's to know, not the index's to say."""
        needed = self.index.last_seq.get(0, -1) + 1
        held = any(seq == needed for seq, _ in self.publisher.buffer)
        intact = self.index.resync(0, replay(self.publisher, self.subscriber, start))
        assert intact == held or needed >= self.publisher.next_seq
        self.lost_for_good |= not held and needed < self.publisher.next_seq

    @precondition(lambda self: self.publisher.next_seq > 0)
    @rule()
    def catch_up(self):
        """What a router does when it suspects it is behind: take what has arrived, then
        replay from its last batch."""
        self.drain()
        self.resync(self.index.last_seq.get(0, -1) + 1)
        self.caught_up()

    def caught_up(self) -> None:
        assert self.index.last_seq[0] == self.publisher.next_seq - 1
        held, actual = self.index.blocks[0], self.cache.cached_hashes()
        assert held <= actual, "the index names a block the engine has evicted"
        if not self.lost_for_good:
            assert held == actual

    @invariant()
    def index_maps_agree(self):
        for engine, hashes in self.index.blocks.items():
            for block_hash in hashes:
                assert engine in self.index.engines[block_hash]
        assert all(self.index.engines.values())


EngineAndIndexer.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow])
test_the_index_follows_the_engine_through_lost_batches = EngineAndIndexer.TestCase


def test_events_say_what_was_stored_and_evicted_in_order():
    cache = FleetKVCacheCoordinator(num_blocks=4, block_size=2)
    scheduler = ChunkedScheduler(4, 2, max_num_batched_tokens=8, kv_cache=cache)
    first = ChunkedRequest(0, [1, 2, 3, 4, 5], 1)
    scheduler.add(first)
    scheduler.step()
    stored = cache.take_events()
    hashes = cache.hash_blocks(first, [1, 2, 3, 4])
    assert stored == [BlockStored(block_hashes=hashes, parent_block_hash=None,
                                  token_ids=[1, 2, 3, 4], block_size=2)]
    first.emit(0)
    scheduler.finish(first)
    second = ChunkedRequest(1, [8, 8, 8, 8, 8], 1)  # needs all 3 blocks: evicts both cached
    scheduler.add(second)
    scheduler.step()
    events = cache.take_events()
    assert isinstance(events[0], BlockRemoved) and set(events[0].block_hashes) == set(hashes)
    assert isinstance(events[1], BlockStored) and events[1].token_ids == [8, 8, 8, 8]
