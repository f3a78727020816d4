"""Chapter 14: KV events, what an engine's prefix cache tells the fleet.

An engine publishes what its prefix cache gains and loses, as vLLM does
(``vllm/distributed/kv_events.py``, vLLM 0.11): after each step, the step's events in one
batch, msgspec-encoded (MessagePack), on a ZMQ PUB socket, each batch as three frames::

    topic | sequence number (8 bytes, big-endian) | KVEventBatch(ts, [events...])

    BlockStored(block_hashes, parent_block_hash, token_ids, block_size, ...)  blocks cached
    BlockRemoved(block_hashes, ...)                                           blocks evicted
    AllBlocksCleared()                                                        all of them gone

PUB drops what a slow or absent subscriber cannot take, so a subscriber can miss batches; the
sequence numbers show the gap. The publisher keeps its last ``buffer_steps`` batches and
answers on a ROUTER socket: a client sends a starting sequence number (8 bytes, big-endian)
and receives every buffered batch from it on, each as (sequence number, payload), then the
end marker (-1, empty). A batch older than the buffer is gone for good.

Here the engine's own loop publishes and serves replays (``serve_replay``), where vLLM runs a
thread; the sockets and the bytes on them are the same.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """The base of every KV cache event; ``tag`` names the kind on the wire."""


class BlockStored(KVCacheEvent):
    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = "GPU"
    lora_name: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[bytes]
    medium: str | None = "GPU"


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


ENCODER = msgspec.msgpack.Encoder()
DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)


class ZmqEventPublisher:
    """Publishes event batches on ``endpoint`` (PUB) and replays its last ``buffer_steps`` on
    ``replay_endpoint`` (ROUTER). Sequence numbers start at 0 with each publisher: an engine
    that restarts starts again from 0."""

    def __init__(self, endpoint: str, replay_endpoint: str, topic: str = "kv",
                 buffer_steps: int = 10_000, context: zmq.Context | None = None) -> None:
        self.context = context or zmq.Context.instance()
        self.pub = self.context.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(endpoint)
        self.replay = self.context.socket(zmq.ROUTER)
        self.replay.setsockopt(zmq.LINGER, 0)
        self.replay.bind(replay_endpoint)
        self.topic = topic.encode()
        self.buffer: list[tuple[int, bytes]] = []
        self.buffer_steps = buffer_steps
        self.next_seq = 0

    def publish(self, events: list[Any], send: bool = True) -> int:
        """Encode ``events`` as the next batch, keep it for replay and send it (``send`` False:
        lose it on the way, as PUB does with a subscriber that cannot keep up); its number."""
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        payload = ENCODER.encode(KVEventBatch(ts=time.time(), events=events))
        self.buffer.append((seq, payload))
        del self.buffer[:-self.buffer_steps]
        if send:
            self.pub.send_multipart((self.topic, seq_bytes(seq), payload))
        return seq

    def serve_replay(self, timeout_ms: int = 0) -> int:
        """Answer the replay requests waiting (for ``timeout_ms`` at most for the first);
        how many were answered."""
        served = 0
        while self.replay.poll(timeout_ms if not served else 0):
            frames = self.replay.recv_multipart()
            if len(frames) == 3:
                client, _, start = frames
                first = int.from_bytes(start, "big", signed=True)
                for seq, payload in self.buffer:
                    if seq >= first:
                        self.replay.send_multipart((client, b"", seq_bytes(seq), payload))
                self.replay.send_multipart((client, b"", END_SEQ, b""))
            served += 1
        return served

    def close(self) -> None:
        self.pub.close(linger=0)
        self.replay.close(linger=0)


class ZmqEventSubscriber:
    """Subscribes to one engine's batches and asks it for replays."""

    def __init__(self, endpoint: str, replay_endpoint: str, topic: str = "kv",
                 context: zmq.Context | None = None) -> None:
        self.context = context or zmq.Context.instance()
        self.sub = self.context.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.sub.connect(endpoint)
        self.replay_endpoint = replay_endpoint

    def receive(self, timeout_ms: int = 0) -> list[tuple[int, KVEventBatch]]:
        """Every batch waiting (after ``timeout_ms`` at most for the first), in arrival order."""
        batches = []
        while self.sub.poll(timeout_ms if not batches else 0):
            _, seq, payload = self.sub.recv_multipart()
            batches.append((int.from_bytes(seq, "big", signed=True), DECODER.decode(payload)))
        return batches

    def replay(self, start_seq: int, timeout_ms: int = 5_000) -> list[tuple[int, KVEventBatch]]:
        """The publisher's buffered batches from ``start_seq`` on; raises ``TimeoutError`` when
        it does not answer within ``timeout_ms`` (it is down)."""
        dealer = self.context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_endpoint)
        try:
            dealer.send_multipart((b"", seq_bytes(start_seq)))
            batches = []
            while True:
                if not dealer.poll(timeout_ms):
                    raise TimeoutError(f"no replay from {self.replay_endpoint} in {timeout_ms} ms")
                _, seq, payload = dealer.recv_multipart()
                if seq == END_SEQ:
                    return batches
                batches.append((int.from_bytes(seq, "big", signed=True),
                                DECODER.decode(payload)))
        finally:
            dealer.close(linger=0)

    def close(self) -> None:
        self.sub.close(linger=0)
