"""Chapter 14: a fleet of engines, each its own process, and the router that feeds them.

    driver (this process)                              engine e (its own process)
    ---------------------                              --------------------------
    Router: route(request_block_hashes) ---------Submit----> ChunkedEngine.step() while busy
      index (KVIndexer) <---- KV events (PUB/SUB) ---------- take_events(): one batch a step
                        ---- replay from seq (DEALER/ROUTER) -> the publisher's buffer
      outputs, hits     <---- Finished(tokens, hit, seq) --- requests done this step
      tests             ---- QueryState / Stop ------------> cached_hashes() / exit

Every engine is a replica: the same tiny model (config and weight seed), chapter 9's engine
over the fleet's KV cache (``course.v1.fleet_cache``), which names blocks by the fleet's hash.
The driver routes each request by the overlap of its block hashes with what the index says
each engine holds, and keeps that index true from the engines' events alone: a gap in an
engine's sequence numbers is filled by replay, a dead engine is forgotten, a restarted engine's
batch 0 (``AllBlocksCleared``) wipes what it held, and a restarted router starts from a
snapshot and replays what it missed.

**Waves.** ``serve`` submits a wave of requests, waits for all of them, then brings the index
up to the last batch each engine reported before routing the next wave. Routing then depends
only on what the engines did, never on when their events arrived: a test can predict it. (A
live router routes on an index a few batches behind; Dynamo's does.)

**Processes.** Engines start from multiprocessing's ``forkserver``, with this module (and so
torch) preloaded in the server: each engine is a fork of a process that imported torch and
ran nothing, so it starts in a fraction of a second, where forking the driver, whose torch
may have started threads, is unsafe, and ``spawn`` would import torch once per engine. As
with ``spawn``, a script that builds a ``Fleet`` does so under ``if __name__ == "__main__":``
(each engine process imports the driver's main module).

**Sockets.** ``ipc://`` endpoints in a private temporary folder (mode 0700): nothing listens
on any network interface, not even loopback, so no other user of the machine can connect,
and no port is chosen, raced for or reported; the driver names every endpoint before the
engine starts. Each life of an engine (``generation``) gets endpoints of its own, so nothing
queued for a dead process reaches its successor. (ZMQ's ``ipc`` is Unix-only, and its paths
are limited to about 100 bytes: ``Fleet`` says so when the temporary folder's path is longer.)

**Faults, injected on purpose** (constructor options, for tests and demonstrations; they
apply to an engine's first process only, a restarted engine is healthy):

* ``lose_batches[e]``: sequence numbers engine ``e`` publishes with ``send=False``: kept for
  replay, never sent, as PUB drops batches for a subscriber that cannot keep up;
* ``hash_seeds[e]``: engine ``e``'s hash seed; one that differs from the router's makes every
  hash of it unknown to the router: its fleet hits drop to zero, silently;
* ``hang_after_finished[e]``: engine ``e`` stops stepping once it has finished that many
  requests (alive and answering queries, its other requests never done): a hung engine, and a
  deterministic moment to ``kill`` one with requests in flight.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.process import BaseProcess

import cloudpickle
import msgspec
import zmq

from course.tiny_model import TinyConfig, TinyModel
from course.v1.block_hash import FLEET_SEED, none_hash
from course.v1.chunked_engine import ChunkedEngine
from course.v1.chunked_scheduler import ChunkedRequest
from course.v1.fleet_cache import FleetKVCacheCoordinator
from course.v1.fleet_parts import FleetParts
from course.v1.kv_events import (
    AllBlocksCleared,
    KVEventBatch,
    ZmqEventPublisher,
    ZmqEventSubscriber,
)
from course.v1.kv_router import Router

# ----------------------------------------------------------------------------- the messages


class Request(msgspec.Struct, frozen=True):
    """A request as the fleet serves it: ``output_len`` greedy tokens after ``prompt``;
    ``cache_salt`` a tenant's (its blocks are hashed apart from other tenants')."""

    id: int
    prompt: list[int]
    output_len: int
    cache_salt: str | None = None


class Submit(msgspec.Struct, tag=True):
    requests: list[Request]


class QueryState(msgspec.Struct, tag=True):
    pass


class Stop(msgspec.Struct, tag=True):
    pass


class Ready(msgspec.Struct, tag=True):
    pid: int
    seq: int  # its last batch published: 0, the AllBlocksCleared of a fresh start


class Output(msgspec.Struct):
    id: int
    tokens: list[int]
    prompt_hit: int  # prompt tokens found in the engine's cache at its first admission


class Finished(msgspec.Struct, tag=True):
    outputs: list[Output]
    seq: int  # its last batch published, this step's included


class State(msgspec.Struct, tag=True):
    hashes: list[bytes]  # cached_hashes(), sorted
    seq: int


TO_ENGINE = msgspec.msgpack.Decoder(Submit | QueryState | Stop)
TO_DRIVER = msgspec.msgpack.Decoder(Ready | Finished | State)
ENCODER = msgspec.msgpack.Encoder()

# ----------------------------------------------------------------------------- an engine


@dataclass(frozen=True)
class EngineSpec:
    """Everything one engine process needs (pickled to it)."""

    engine: int
    generation: int
    control: str  # the driver's ROUTER, which this engine's DEALER connects to
    events: str  # this engine's PUB endpoint
    replay: str  # this engine's replay ROUTER endpoint
    driver_pid: int
    model_config: TinyConfig
    model_seed: int
    num_blocks: int
    block_size: int
    max_num_batched_tokens: int
    buffer_steps: int
    hasher: bytes  # the fleet's request_block_hashes, by cloudpickle (a notebook's own too)
    hash_seed: str = FLEET_SEED
    lose_batches: frozenset[int] = frozenset()
    hang_after_finished: int | None = None


def identity(engine: int, generation: int) -> bytes:
    """The name of an engine's life on the control socket: ``b"<engine>.<generation>"``."""
    return f"{engine}.{generation}".encode()


def engine_main(spec: EngineSpec) -> None:
    """One engine's life: build the replica, publish batch 0 (``AllBlocksCleared``: whatever
    a router knew of an earlier life is gone), say ``Ready``, then loop: take messages, step
    while busy, publish each step's events as one batch, report finished requests, serve
    replays. Returns on ``Stop``, or when the driver's process is gone (no orphans)."""
    import torch

    torch.set_num_threads(1)  # one thread per process: engines share the machine's cores
    model = TinyModel(spec.model_config, seed=spec.model_seed)
    engine = ChunkedEngine(model, spec.num_blocks, spec.block_size, spec.max_num_batched_tokens,
                           kv_cache=partial(FleetKVCacheCoordinator, seed=spec.hash_seed,
                                            hasher=cloudpickle.loads(spec.hasher)))
    scheduler, kv = engine.scheduler, engine.kv_cache
    context = zmq.Context()
    control = context.socket(zmq.DEALER)
    control.setsockopt(zmq.LINGER, 0)
    control.setsockopt(zmq.IDENTITY, identity(spec.engine, spec.generation))
    control.connect(spec.control)
    publisher = ZmqEventPublisher(spec.events, spec.replay, buffer_steps=spec.buffer_steps,
                                  context=context)

    def publish(events: list) -> int:
        return publisher.publish(events, send=publisher.next_seq not in spec.lose_batches)

    hits: dict[int, int] = {}  # request id -> its prefix hit, from its first chunk
    finished = 0
    poller = zmq.Poller()
    poller.register(control, zmq.POLLIN)
    poller.register(publisher.replay, zmq.POLLIN)
    try:
        control.send(ENCODER.encode(Ready(pid=os.getpid(), seq=publish([AllBlocksCleared()]))))
        while True:
            hung = spec.hang_after_finished is not None and finished >= spec.hang_after_finished
            stepping = scheduler.busy() and not hung
            ready = dict(poller.poll(0 if stepping else 100))
            if publisher.replay in ready:
                publisher.serve_replay()
            while control in ready and control.poll(0):
                message = TO_ENGINE.decode(control.recv())
                if isinstance(message, Stop):
                    return
                if isinstance(message, QueryState):
                    control.send(ENCODER.encode(State(sorted(kv.cached_hashes()),
                                                      publisher.next_seq - 1)))
                else:
                    for r in message.requests:
                        scheduler.add(ChunkedRequest(r.id, list(r.prompt), r.output_len,
                                                     cache_salt=r.cache_salt))
            if not stepping:
                if not _alive(spec.driver_pid):
                    return
                continue
            plan = engine.step()
            for chunk in plan.chunks:
                hits.setdefault(chunk.request.id, chunk.start)
            events = kv.take_events()
            if events:  # vLLM publishes a step's events only when there are some
                publish(events)
            done = [r for r in scheduler.running if r.done]
            for request in done:
                scheduler.finish(request)
            if done:
                finished += len(done)
                outputs = [Output(r.id, list(r.output), hits.pop(r.id)) for r in done]
                control.send(ENCODER.encode(Finished(outputs, publisher.next_seq - 1)))
    finally:
        publisher.close()
        control.close(linger=0)
        context.term()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _context() -> multiprocessing.context.BaseContext:
    """The forkserver context, this module preloaded in the server (effective only before
    the server's first start: later calls find it running, and forks take what it has)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


# ----------------------------------------------------------------------------- the driver


@dataclass
class EngineHandle:
    """The driver's side of one engine's current life."""

    spec: EngineSpec
    process: BaseProcess
    subscriber: ZmqEventSubscriber
    alive: bool = True
    reported_seq: int = 0  # the last batch the engine said it published
    last_heard: float = 0.0  # when it last sent anything (a message or a batch)
    in_flight: dict[int, Request] = field(default_factory=dict)
    state: State | None = None  # its answer to the last QueryState

    @property
    def engine(self) -> int:
        return self.spec.engine

    @property
    def generation(self) -> int:
        return self.spec.generation

    def subscribe(self, context: zmq.Context) -> None:
        """A new subscription to its events (what the old one had queued is dropped)."""
        self.subscriber.close()
        self.subscriber = ZmqEventSubscriber(self.spec.events, self.spec.replay,
                                             context=context)


@dataclass
class WaveStats:
    """One wave's prompt tokens, those the engines found cached (``hit_tokens``) and those
    the router expected them to find (``routed_hit_tokens``: its index's overlap with the
    engine it chose, in tokens)."""

    prompt_tokens: int = 0
    hit_tokens: int = 0
    routed_hit_tokens: int = 0


@dataclass
class RouterSnapshot:
    """A router's saved state: ``index``, ``KVIndexer.snapshot()``; ``generations``, the life
    of each engine it describes."""

    index: dict[int, tuple[int, list[bytes]]]
    generations: dict[int, int]


class Fleet:
    """``num_engines`` engine processes and the router-side driver; a context manager that
    stops every process on exit, exceptions included.

    ``outputs[id]`` is each finished request's tokens, ``served_by[id]`` the engine that
    finished it, ``routes`` every routing decision in order as ``(request id, engine)``
    (a request re-sent after a failure appears twice), ``waves`` each wave's ``WaveStats``,
    ``gaps[e]`` how many gaps in engine ``e``'s sequence numbers a later batch showed (then
    filled by replay), ``late[e]`` how many times a wave ended short of the batch engine ``e``
    reported (no later batch came to show the gap: filled by replay too).
    Timeouts: ``start_timeout_s`` for a process to say ``Ready``, ``answer_timeout_s`` for
    any other answer (a replay, a state, a wave's engine that sends nothing); an engine with
    requests in flight that stays silent that long is declared hung, killed and failed over.
    The fault options are described in the module's docstring.
    """

    def __init__(self, num_engines: int, policy: str = "kv", overlap_score_weight: float = 1.0,
                 model_config: TinyConfig | None = None, model_seed: int = 0,
                 num_blocks: int = 64, block_size: int = 16, max_num_batched_tokens: int = 64,
                 buffer_steps: int = 10_000, hash_seed: str = FLEET_SEED,
                 hash_seeds: Sequence[str] | None = None,
                 lose_batches: dict[int, set[int]] | None = None,
                 hang_after_finished: dict[int, int] | None = None,
                 start_timeout_s: float = 60.0, answer_timeout_s: float = 30.0,
                 sub_grace_s: float = 0.5, parts: FleetParts | None = None) -> None:
        self.num_engines = num_engines
        self.block_size = block_size
        self.first_parent = none_hash(hash_seed)  # the router's own seed
        self.start_timeout_s, self.answer_timeout_s = start_timeout_s, answer_timeout_s
        self.sub_grace_s = sub_grace_s  # how long a batch may take on PUB before a replay
        self.parts = parts or FleetParts()
        self.router = Router(num_engines, block_size, policy, overlap_score_weight,
                             index=self.parts.indexer(), choose=self.parts.choose_engine)
        self.engine_options = dict(model_config=model_config or TinyConfig(), model_seed=model_seed,
                         num_blocks=num_blocks, block_size=block_size,
                         max_num_batched_tokens=max_num_batched_tokens,
                         buffer_steps=buffer_steps,
                         hasher=cloudpickle.dumps(self.parts.request_block_hashes))
        self.faults = {e: dict(hash_seed=(hash_seeds[e] if hash_seeds else hash_seed),
                               lose_batches=frozenset((lose_batches or {}).get(e, ())),
                               hang_after_finished=(hang_after_finished or {}).get(e))
                       for e in range(num_engines)}
        self.hash_seed = hash_seed
        self.outputs: dict[int, list[int]] = {}
        self.served_by: dict[int, int] = {}
        self.routes: list[tuple[int, int]] = []
        self.waves: list[WaveStats] = []
        self.gaps = dict.fromkeys(range(num_engines), 0)
        self.late = dict.fromkeys(range(num_engines), 0)
        self.hits: dict[int, int] = {}
        self.routed_hits: dict[int, int] = {}
        self.handles: dict[int, EngineHandle] = {}
        self.folder = tempfile.mkdtemp(prefix="kv-fleet-")
        if len(self.folder) > 80:
            raise ValueError(f"ipc paths under {self.folder} would pass ZMQ's ~100-byte limit: "
                             "set TMPDIR to a shorter folder")
        self.context = zmq.Context()
        # a subscriber connects before its engine binds and retries until it can: every 10 ms
        # (ZMQ's default is 100), so that it is most likely subscribed before the engine's
        # first step; a batch PUB drops before that is found as a gap and replayed
        self.context.setsockopt(zmq.RECONNECT_IVL, 10)
        self.control = self.context.socket(zmq.ROUTER)
        self.control.setsockopt(zmq.LINGER, 0)
        self.control.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a dead engine raises
        self.control.bind(f"ipc://{self.folder}/control")
        try:
            for engine in range(num_engines):
                self._start(engine, generation=0)
            self._wait_ready(range(num_engines))
        except BaseException:
            self.close()
            raise

    # -- life and death

    def _start(self, engine: int, generation: int) -> None:
        """Start engine ``engine``'s process (its ``generation``-th life) and subscribe."""
        base = f"ipc://{self.folder}/e{engine}.{generation}"
        faults = self.faults[engine] if generation == 0 else dict(hash_seed=self.hash_seed)
        spec = EngineSpec(engine, generation, f"ipc://{self.folder}/control", f"{base}.events",
                          f"{base}.replay", os.getpid(), **self.engine_options, **faults)
        process = _context().Process(target=engine_main, args=(spec,),
                                     name=f"kv-engine-{engine}", daemon=True)
        process.start()
        subscriber = ZmqEventSubscriber(spec.events, spec.replay, context=self.context)
        self.handles[engine] = EngineHandle(spec, process, subscriber, reported_seq=-1,
                                            last_heard=time.monotonic())

    def _wait_ready(self, engines: Sequence[int]) -> None:
        """Wait for each of ``engines`` to say ``Ready``, then bring the index up to its batch
        0 (by replay: PUB drops what is sent before the subscriber is connected)."""
        deadline = time.monotonic() + self.start_timeout_s
        for engine in engines:
            handle = self.handles[engine]
            while handle.reported_seq < 0:
                if not handle.process.is_alive():
                    raise RuntimeError(f"engine {engine} exited with {handle.process.exitcode} "
                                       "before it was ready")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"engine {engine} was not ready in "
                                       f"{self.start_timeout_s} s")
                self._pump(50)
            self._catch_up(engine, 0)

    def kill(self, engine: int) -> None:
        """SIGKILL engine ``engine``'s process, as a crash would, requests in flight or not.
        The driver is not told: it notices, as it would a real crash (``wait``)."""
        process = self.handles[engine].process
        if process.is_alive():
            os.kill(process.pid, signal.SIGKILL)
        process.join(self.answer_timeout_s)

    def restart(self, engine: int) -> None:
        """Start a fresh process for ``engine`` (failing over its old one first if the driver
        had not noticed it was gone): its batch 0, ``AllBlocksCleared``, resets what the index
        holds for it, and it is routed to again."""
        handle = self.handles[engine]
        if handle.alive:
            self._fail(engine, "restarted")
        self._start(engine, handle.generation + 1)
        self._wait_ready([engine])
        self.router.down.discard(engine)

    def snapshot(self) -> RouterSnapshot:
        """What a router would save to restart from: ``index.snapshot()``, and which life of
        each engine it describes (sequence numbers count again from 0 in a new life)."""
        return RouterSnapshot(self.router.index.snapshot(),
                              {e: h.generation for e, h in self.handles.items()})

    def restart_router(self, snapshot: RouterSnapshot) -> None:
        """Replace the router by one restored from ``snapshot`` (``Fleet.snapshot()``, taken
        earlier), as a restarted router process would: new subscriptions (what the old ones
        had queued is lost), then each live engine's batches since the snapshot's by replay,
        from batch 0 for an engine restarted since. Batches already gone from an engine's
        buffer cannot be replayed: ``resync`` forgets that engine's blocks, so the index never
        claims a block the engine does not hold. Call it between waves (nothing in flight)."""
        if any(h.in_flight for h in self.handles.values()):
            raise RuntimeError("restart_router between waves: requests are in flight")
        old = self.router
        self.router = Router(self.num_engines, self.block_size, old.policy,
                             old.overlap_score_weight,
                             index=self.parts.indexer.restore(snapshot.index),
                             choose=self.parts.choose_engine, down=set(old.down))
        for engine, handle in self.handles.items():
            index = self.router.index
            if not handle.alive or snapshot.generations.get(engine) != handle.generation:
                index.restarted(engine)  # a life the snapshot does not describe
            if handle.alive:
                handle.subscribe(self.context)
                self._catch_up(engine, index.last_seq[engine] + 1)

    def _fail(self, engine: int, reason: str) -> None:
        """Engine ``engine`` is gone (``reason``): make sure of it, forget what it held, stop
        routing to it and send its unfinished requests to live engines."""
        handle = self.handles[engine]
        handle.alive = False
        if handle.process.is_alive():
            os.kill(handle.process.pid, signal.SIGKILL)
        handle.process.join(self.answer_timeout_s)
        handle.subscriber.close()  # what it had queued is from a dead engine
        self.router.index.forget(engine)
        self.router.down.add(engine)
        orphans = list(handle.in_flight.values())
        handle.in_flight.clear()
        for request in orphans:
            self.router.finish(engine, len(request.prompt))
        if orphans and len(self.router.down) == self.num_engines:
            raise RuntimeError(f"engine {engine} {reason}; no engine is left for requests "
                               f"{[r.id for r in orphans]}")
        self.submit(orphans)

    def close(self) -> None:
        """Stop every engine (``Stop``, then SIGKILL past ``answer_timeout_s``), close every
        socket and remove the folder of endpoints. Safe to call twice."""
        for handle in self.handles.values():
            if handle.alive and handle.process.is_alive():
                try:
                    self._send(handle, Stop())
                except ConnectionError:
                    pass
        deadline = time.monotonic() + self.answer_timeout_s
        for handle in self.handles.values():
            handle.process.join(max(0.0, deadline - time.monotonic()))
            if handle.process.is_alive():
                handle.process.kill()
                handle.process.join(self.answer_timeout_s)
            handle.subscriber.close()
        self.handles.clear()
        if not self.control.closed:
            self.control.close(linger=0)
            self.context.term()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests

    def live_engines(self) -> list[int]:
        return [e for e, h in self.handles.items() if h.alive]

    def submit(self, requests: Sequence[Request]) -> None:
        """Route each request, in order, on the index as it is now, and send each engine its
        share in one message. An engine found dead first is failed over."""
        self._check_alive()
        shares: dict[int, list[Request]] = {}
        for request in requests:
            hashes = self.parts.request_block_hashes(request.prompt, self.block_size,
                                                     self.first_parent,
                                                     cache_salt=request.cache_salt)
            overlaps = self.router.index.overlap_blocks(hashes)
            engine = self.router.route(hashes, len(request.prompt))
            self.routes.append((request.id, engine))
            self.routed_hits[request.id] = overlaps.get(engine, 0) * self.block_size
            self.handles[engine].in_flight[request.id] = request
            shares.setdefault(engine, []).append(request)
        for engine, share in shares.items():
            handle = self.handles[engine]
            handle.last_heard = time.monotonic()
            try:
                self._send(handle, Submit(share))
            except ConnectionError:  # gone: its share goes elsewhere
                self._fail(engine, "could not be reached")

    def wait(self, until: Callable[[], bool] | None = None) -> bool:
        """Take the engines' answers and events until no request is in flight (then bring the
        index up to every engine's last reported batch: ``True``), or until ``until()`` holds
        (``False``). Failed engines are noticed and failed over on the way."""
        while any(h.in_flight for h in self.handles.values()):
            if until is not None and until():
                return False
            self._pump(20)
            self._check_alive()
        self._check_alive()  # an engine that died idle is failed over too
        self._sync()
        return True

    def serve_wave(self, requests: Sequence[Request]) -> WaveStats:
        """Serve one wave to the end (``submit``, ``wait``); its ``WaveStats``."""
        self.submit(requests)
        self.wait()
        return self.finish_wave(requests)

    def finish_wave(self, requests: Sequence[Request]) -> WaveStats:
        """Record and return the ``WaveStats`` of ``requests``, all finished."""
        stats = WaveStats(sum(len(r.prompt) for r in requests),
                          sum(self.hits[r.id] for r in requests),
                          sum(self.routed_hits[r.id] for r in requests))
        self.waves.append(stats)
        return stats

    def serve(self, waves: Sequence[Sequence[Request]]) -> list[WaveStats]:
        """Serve ``waves`` one after another; each wave's ``WaveStats`` (the outputs are in
        ``outputs``, the engines in ``served_by``)."""
        return [self.serve_wave(wave) for wave in waves]

    def query_state(self, engine: int) -> State:
        """Engine ``engine``'s cached hashes and last published batch, asked of it."""
        handle = self.handles[engine]
        handle.state = None
        self._send(handle, QueryState())
        deadline = time.monotonic() + self.answer_timeout_s
        while handle.state is None:
            if not handle.process.is_alive():
                raise ConnectionError(f"engine {engine} exited ({handle.process.exitcode}) "
                                      "before it answered a state query")
            if time.monotonic() > deadline:
                raise TimeoutError(f"engine {engine} did not answer a state query in "
                                   f"{self.answer_timeout_s} s")
            self._pump(20)
        return handle.state

    # -- the plumbing

    def _send(self, handle: EngineHandle, message: msgspec.Struct) -> None:
        """Send ``message`` to the engine; ``ConnectionError`` when its process is gone (the
        control socket is ``ROUTER_MANDATORY``: it refuses a peer it no longer has)."""
        try:
            self.control.send_multipart((identity(handle.engine, handle.generation),
                                         ENCODER.encode(message)))
        except zmq.ZMQError as error:
            raise ConnectionError(f"engine {handle.engine} cannot be reached: {error}") from None

    def _pump(self, timeout_ms: int) -> None:
        """Wait up to ``timeout_ms`` for anything, then take every message and batch
        waiting."""
        poller = zmq.Poller()
        poller.register(self.control, zmq.POLLIN)
        for handle in self.handles.values():
            if handle.alive:
                poller.register(handle.subscriber.sub, zmq.POLLIN)
        poller.poll(timeout_ms)
        while self.control.poll(0):
            sender, payload = self.control.recv_multipart()
            engine, generation = map(int, sender.decode().split("."))
            handle = self.handles.get(engine)
            if handle is None or handle.generation != generation or not handle.alive:
                continue  # from a life already failed over: its requests went elsewhere
            handle.last_heard = time.monotonic()
            self._take(handle, TO_DRIVER.decode(payload))
        for engine in self.live_engines():
            handle = self.handles[engine]
            if not handle.alive:  # failed over while this loop ran
                continue
            batches = handle.subscriber.receive(0)
            if batches:
                handle.last_heard = time.monotonic()
                self._apply(engine, batches)

    def _take(self, handle: EngineHandle, message: Ready | Finished | State) -> None:
        handle.reported_seq = max(handle.reported_seq, message.seq)
        if isinstance(message, State):
            handle.state = message
        elif isinstance(message, Finished):
            for output in message.outputs:
                request = handle.in_flight.pop(output.id, None)
                if request is None:
                    continue
                self.outputs[output.id] = output.tokens
                self.served_by[output.id] = handle.engine
                self.hits[output.id] = output.prompt_hit
                self.router.finish(handle.engine, len(request.prompt))

    def _apply(self, engine: int, batches: list[tuple[int, KVEventBatch]]) -> None:
        """Apply ``batches`` of ``engine`` to the index; at a gap, replay from the first batch
        missing (the batches received after it are then old and ignored)."""
        for seq, batch in batches:
            if not self.handles[engine].alive:
                return
            missing = self.router.index.apply_batch(engine, seq, batch)
            if missing is not None:
                self.gaps[engine] += 1
                self._catch_up(engine, missing)

    def _catch_up(self, engine: int, start: int) -> None:
        """Replay engine ``engine``'s batches from ``start`` into the index."""
        handle = self.handles[engine]
        try:
            replayed = handle.subscriber.replay(start, int(self.answer_timeout_s * 1000))
        except TimeoutError:
            if handle.process.is_alive():
                raise TimeoutError(f"engine {engine} did not answer a replay from batch "
                                   f"{start} in {self.answer_timeout_s} s") from None
            self._fail(engine, "died")
            return
        self.router.index.resync(engine, replayed)

    def _sync(self) -> None:
        """Bring the index up to each live engine's last reported batch: from PUB within
        ``sub_grace_s``, else by replay (the batch was lost)."""
        for engine in self.live_engines():
            handle = self.handles[engine]
            deadline = time.monotonic() + self.sub_grace_s
            while (handle.alive and self.router.index.last_seq[engine] < handle.reported_seq
                   and time.monotonic() < deadline):
                self._pump(10)
            if handle.alive and self.router.index.last_seq[engine] < handle.reported_seq:
                self.late[engine] += 1  # lost on the way: no later batch showed the gap
                self._catch_up(engine, self.router.index.last_seq[engine] + 1)

    def _check_alive(self) -> None:
        """Fail over every engine whose process died, or that holds requests and has sent
        nothing for ``answer_timeout_s`` (hung)."""
        now = time.monotonic()
        for engine in self.live_engines():
            handle = self.handles[engine]
            if not handle.process.is_alive():
                self._fail(engine, f"died (exit code {handle.process.exitcode})")
            elif handle.in_flight and now - handle.last_heard > self.answer_timeout_s:
                self._fail(engine, f"sent nothing in {self.answer_timeout_s} s")


def shared_prefix_waves(block_size: int, waves: int = 3, per_wave: int = 6, seed: int = 14,
                        first_id: int = 0) -> list[list[Request]]:
    """``waves`` waves of ``per_wave`` requests: one of three system prompts (two blocks) and
    a user's question (4 to 12 tokens), for one of two tenants (a ``cache_salt`` each), 5
    tokens to generate; so requests share prefixes within a tenant and never across
    tenants. Numbered from ``first_id``, drawn from ``seed``."""
    rng = random.Random(seed)
    systems = [[rng.randrange(1, 128) for _ in range(2 * block_size)] for _ in range(3)]
    drawn, next_id = [], first_id
    for _ in range(waves):
        wave = []
        for _ in range(per_wave):
            question = [rng.randrange(1, 128) for _ in range(rng.randrange(4, 13))]
            wave.append(Request(next_id, rng.choice(systems) + question, 5,
                                cache_salt=rng.choice(["tenant-a", "tenant-b"])))
            next_id += 1
        drawn.append(wave)
    return drawn
