"""Chapter 8: a paged serving engine for the tiny model, built from the course's pieces.

    requests --> Scheduler (chapter 5) --plan--> copies: copy-on-write, swap out, swap in
                   |  BlockManager (chapter 3)        |
                   v                                  v
                 prefill: whole context, K/V written through the slot mapping (chapter 6)
                 decode:  one token per sequence, paged attention over the block tables
                 emit tokens; finish done requests (their blocks return to the pool)

One step of ``serve``: new arrivals join the waiting queue; ``Scheduler.step`` reserves a slot
for every running sequence (preempting the newest when the pool is short), swaps in and admits;
the engine performs the step's block copies, prefills what was admitted, decodes the rest, and
finishes what is done. Copies run in a fixed order before any K/V is written: copy-on-write
(reads blocks as they stood), swap out (reads the victims' blocks), swap in (may write into
blocks a swap-out or copy just read).

Parallel sampling: a request with ``n`` > 1 is forked after its prefill into ``n`` branches
sharing its blocks; branch k takes the k-th most likely first token, then each goes on
greedily.

Answers are the bodies between ``### BEGIN SOLUTION`` and ``### END SOLUTION``: chapter 8's
notebook renders its cells from them, and a learner edition replaces them with stubs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from course.language import tr_later
from course.tiny_model import TinyModel, causal_attention
from course.v0.block_manager import BlockManager, CopyOnWrite, Slot
from course.v0.frames import Frame
from course.v0.scheduler import Request, Scheduler, StepPlan
from kernels.paged_attention_ref import paged_decode_attention, write_kv


@dataclass
class GenRequest(Request):
    """A request with its tokens: ``prompt``, and ``output`` as generated (with the logits
    each token was chosen from). ``n`` > 1 asks for that many parallel-sampling branches."""

    prompt: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    n: int = 1
    branch: int = 0  # k > 0: took the k-th most likely first token of its parent
    parent: int | None = None  # a branch: the id of the request it was forked from
    error: Exception | None = None  # why the request was aborted by a fault, if it was

    @property
    def tokens(self) -> list[int]:
        """The request's context: prompt, then every generated token."""
        return self.prompt + self.output

    def emit(self, token: int, logits: torch.Tensor) -> None:
        self.output.append(token)
        self.logits.append(logits)
        self.generated += 1


def make_request(request_id: int, prompt: list[int], output_len: int, arrival: int = 0,
                 n: int = 1) -> GenRequest:
    return GenRequest(request_id, len(prompt), output_len, arrival, prompt=list(prompt), n=n)


class CopyRecordingBlockManager(BlockManager):
    """Chapter 3's BlockManager, keeping the copy-on-write orders that ``append_slot``
    returns (the scheduler reserves slots but does not pass them on) for the engine."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self.copies: list[CopyOnWrite] = []

    def append_slot(self, seq_id: int) -> Slot:
        slot = super().append_slot(seq_id)
        if slot.copy is not None:
            self.copies.append(slot.copy)
        return slot


@dataclass
class KVPool:
    """Per layer, K and V of every block: [num_blocks, block_size, num_kv_heads, head_dim]."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]

    @classmethod
    def empty(cls, model: TinyModel, num_blocks: int, block_size: int,
              places: int | None = None) -> KVPool:
        """Filled with NaN: a read of a slot nothing wrote poisons the output at once.
        ``places``: how many layers' tensors (the model's layers unless given)."""
        c, device = model.config, model.embedding.device
        shape = (num_blocks, block_size, c.num_kv_heads, c.head_dim)
        count = c.num_layers if places is None else places
        return cls([torch.full(shape, float("nan"), device=device) for _ in range(count)],
                   [torch.full(shape, float("nan"), device=device) for _ in range(count)])

    def copy_blocks(self, into: KVPool, pairs: list[tuple[int, int]],
                    num_slots: int | None = None) -> None:
        """Copy block src of this pool to block dst of ``into`` for each (src, dst)."""
        for layer in range(len(self.k)):
            for src, dst in pairs:
                into.k[layer][dst, :num_slots] = self.k[layer][src, :num_slots]
                into.v[layer][dst, :num_slots] = self.v[layer][src, :num_slots]


@dataclass
class DecodeBatch:
    """The tensors one decode step needs, one row per sequence, in the order of the sequences
    given. ``max_blocks`` is the longest table's length; a shorter row is padded past its own
    blocks (with 0 here: attention never reads past ``seq_lens``, so any value works)."""

    positions: torch.Tensor  # [num_seqs] int64: the position of the token being decoded
    slot_mapping: torch.Tensor  # [num_seqs] int64: where its K/V go in the pool
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32: each table, padded
    seq_lens: torch.Tensor  # [num_seqs] int32: tokens to attend over, the new one included

    def to(self, device: torch.device | str) -> DecodeBatch:
        return DecodeBatch(*(t.to(device) for t in (self.positions, self.slot_mapping,
                                                     self.block_tables, self.seq_lens)))


def build_decode_batch(manager: BlockManager, seq_ids: list[int]) -> DecodeBatch:
    """The decode batch of ``seq_ids``, whose slots ``manager`` has just reserved (their
    lengths already count the token being decoded)."""
    ### BEGIN SOLUTION
    tables = [manager.block_table(seq_id) for seq_id in seq_ids]
    lengths = [manager.seq_len(seq_id) for seq_id in seq_ids]
    block_size = manager.block_size
    positions = [length - 1 for length in lengths]
    slots = [table[p // block_size] * block_size + p % block_size
             for table, p in zip(tables, positions, strict=True)]
    width = max(len(table) for table in tables)
    padded = [table + [0] * (width - len(table)) for table in tables]
    return DecodeBatch(torch.tensor(positions, dtype=torch.int64),
                       torch.tensor(slots, dtype=torch.int64),
                       torch.tensor(padded, dtype=torch.int32),
                       torch.tensor(lengths, dtype=torch.int32))
    ### END SOLUTION


def paged_decode_step(model: TinyModel, tokens: torch.Tensor, batch: DecodeBatch,
                      pool: KVPool, attention: Callable = paged_decode_attention
                      ) -> torch.Tensor:
    """One decode step of ``tokens`` [num_seqs] through the paged cache: at every layer,
    write the new K/V at the batch's slots, then attend through the block tables. Returns
    the logits [num_seqs, vocab]."""
    ### BEGIN SOLUTION
    x = model.embed(tokens)
    for layer in range(model.config.num_layers):
        q, k, v = model.qkv(layer, x, batch.positions)
        write_kv(pool.k[layer], pool.v[layer], k, v, batch.slot_mapping)
        out = attention(q, pool.k[layer], pool.v[layer], batch.block_tables, batch.seq_lens,
                        model.scale)
        x = model.finish_layer(layer, x, out)
    return model.logits(x)
    ### END SOLUTION


def prefill_slots(manager: BlockManager, seq_id: int) -> torch.Tensor:
    """The flat slot of each of the sequence's positions 0 .. seq_len - 1."""
    table, block_size = manager.block_table(seq_id), manager.block_size
    positions = torch.arange(manager.seq_len(seq_id))
    return torch.tensor(table)[positions // block_size] * block_size + positions % block_size


def paged_prefill(model: TinyModel, tokens: list[int], slots: torch.Tensor,
                  pool: KVPool) -> torch.Tensor:
    """Run a whole context (positions 0 .. n - 1): write its K/V at ``slots`` and attend
    causally over them (prefill reads its own fresh K/V, as prefill kernels do). Returns the
    last position's logits [vocab]."""
    device = model.embedding.device
    x = model.embed(torch.tensor(tokens, device=device))
    positions = torch.arange(len(tokens), device=device)
    for layer in range(model.config.num_layers):
        q, k, v = model.qkv(layer, x, positions)
        write_kv(pool.k[layer], pool.v[layer], k, v, slots.to(device))
        x = model.finish_layer(layer, x, causal_attention(q, k, v, model.scale))
    return model.logits(x[-1:])[0]


def default_attention(device: torch.device, block_size: int) -> Callable:
    """Chapter 7's Triton kernel on a CUDA GPU (blocks of 16 or more), else chapter 6's
    ``paged_decode_attention`` in PyTorch."""
    if device.type == "cuda" and block_size >= 16 and os.environ.get("TRITON_INTERPRET") != "1":
        from kernels.paged_attention import paged_attention

        return paged_attention
    return paged_decode_attention


@dataclass
class StepRecord:
    """What one engine step did, for charts and the animation."""

    step: int
    running: int  # sequences holding GPU blocks after the step
    waiting: int
    swapped: int
    used_blocks: int
    stored_tokens: int  # K/V slots holding a token
    event: str


class PagedEngine:
    """The tiny model behind a Scheduler, a copy-recording BlockManager and a KV pool.

    ``attention`` is the paged decode attention; by default chapter 7's Triton kernel
    (``kernels.paged_attention.paged_attention``) when the model is on a CUDA GPU and blocks
    hold at least 16 tokens (what ``tl.dot`` needs there), else chapter 6's
    ``paged_decode_attention``. Pass the kernel explicitly to run it on the interpreter
    (correct and slow). ``build_batch`` and ``decode_step`` are what ``decode`` runs: the
    chapter's first two TODOs, ``build_decode_batch`` and ``paged_decode_step`` (pass your
    own; without them, the course's own versions).
    """

    def __init__(self, model: TinyModel, num_blocks: int, block_size: int,
                 preemption: str = "recompute", cpu_blocks: int = 0, max_num_seqs: int = 64,
                 attention: Callable | None = None, build_batch: Callable | None = None,
                 decode_step: Callable | None = None) -> None:
        self.model = model
        self.scheduler = Scheduler(num_blocks, block_size, max_num_seqs=max_num_seqs,
                                   max_num_batched_tokens=1 << 20, watermark=0.0,
                                   preemption=preemption, cpu_blocks=cpu_blocks)
        self.scheduler.gpu = CopyRecordingBlockManager(num_blocks, block_size)
        self.gpu_pool = KVPool.empty(model, num_blocks, block_size)
        self.cpu_pool = KVPool.empty(model, max(cpu_blocks, 1), block_size)
        if attention is None:
            attention = default_attention(model.embedding.device, block_size)
        self.attention = attention
        # the module's functions as they are now (a default argument would keep them as
        # first defined)
        self.build_batch = build_batch or build_decode_batch
        self.decode_step = decode_step or paged_decode_step
        self.records: list[StepRecord] = []
        self.frames: list[Frame] = []
        self.rejected: list[GenRequest] = []
        self._branch_ids = 0

    @property
    def blocks(self) -> BlockManager:
        return self.scheduler.gpu

    def busy(self) -> bool:
        s = self.scheduler
        return bool(s.waiting or s.running or s.swapped)

    def apply_copies(self, plan: StepPlan) -> None:
        """The step's block copies, before any K/V is written: copy-on-write, swap out, swap
        in (in that order; see the module's docstring)."""
        for copy in self.blocks.copies:
            self.gpu_pool.copy_blocks(self.gpu_pool, [(copy.src, copy.dst)], copy.num_slots)
        for _, pairs in plan.swapped_out:
            self.gpu_pool.copy_blocks(self.cpu_pool, pairs)
        for _, pairs in plan.swapped_in:
            self.cpu_pool.copy_blocks(self.gpu_pool, pairs)
        self.rejected.extend(request for request, _ in plan.rejected)

    def prefill(self, request: GenRequest, tokens: list[int]) -> torch.Tensor:
        """Prefill ``tokens`` (the request's whole context) into its blocks; the logits of
        the token that follows them."""
        slots = prefill_slots(self.blocks, request.id)[:len(tokens)]
        return paged_prefill(self.model, tokens, slots, self.gpu_pool)

    def decode(self, requests: list[GenRequest]) -> torch.Tensor:
        """One decode step of every request in ``requests`` (slots already reserved)."""
        device = self.model.embedding.device
        batch = self.build_batch(self.blocks, [r.id for r in requests]).to(device)
        last = torch.tensor([r.output[-1] for r in requests], device=device)
        return self.decode_step(self.model, last, batch, self.gpu_pool, self.attention)

    def start_branches(self, parent: GenRequest, logits: torch.Tensor) -> list[GenRequest]:
        """Fork ``parent`` (just prefilled, its first token emitted) into ``parent.n`` - 1
        more branches sharing its blocks; branch k emits the k-th most likely token."""
        choices = logits.topk(parent.n).indices.tolist()
        branches = []
        for k in range(1, parent.n):
            self._branch_ids += 1
            child = GenRequest(-self._branch_ids, parent.prompt_len, parent.output_len,
                               parent.arrival, prompt=list(parent.prompt), branch=k,
                               parent=parent.id)
            child.emit(choices[k], logits)
            self.blocks.fork(parent.id, child.id)
            self.scheduler.running.append(child)
            branches.append(child)
        return branches

    def record(self, step: int, plan: StepPlan) -> None:
        """Note the step for the charts and the animation; clear its copy-on-write orders."""
        s, blocks = self.scheduler, self.blocks
        # in English (a notebook counts the events), shown in the chosen language
        event = tr_later(f"step {step}: {len(plan.prefill)} prefill, {len(plan.decode)} decode")
        event += "".join(tr_later(f", preempted {r.id}") for r in plan.preempted)
        event += "".join(tr_later(f", swapped in {r.id}") for r, _ in plan.swapped_in)
        event += "".join(tr_later(f", copy-on-write {c.src}->{c.dst}") for c in blocks.copies)
        self.records.append(StepRecord(step, len(s.running), len(s.waiting), len(s.swapped),
                                       blocks.num_blocks - blocks.num_free_blocks(),
                                       sum(blocks.lengths.values()), event))
        first_copy = blocks.copies[0] if blocks.copies else None
        self.frames.append(Frame(
            event, {k: list(v) for k, v in blocks.tables.items()}, dict(blocks.lengths),
            list(blocks.ref_counts), blocks.num_free_blocks(),
            None if first_copy is None else (first_copy.src, first_copy.dst,
                                             first_copy.num_slots)))
        blocks.copies.clear()


def serve(engine: PagedEngine, requests: list[GenRequest], max_steps: int = 10_000
          ) -> list[GenRequest]:
    """Run ``requests`` (each joining at step ``arrival``) to completion; return every
    finished request, parallel-sampling branches included."""
    ### BEGIN SOLUTION
    pending = sorted(requests, key=lambda r: r.arrival)
    finished: list[GenRequest] = []
    for step in range(max_steps):
        if not pending and not engine.busy():
            return finished
        while pending and pending[0].arrival <= step:
            engine.scheduler.add(pending.pop(0))
        plan = engine.scheduler.step()
        engine.apply_copies(plan)
        for request in plan.prefill:
            logits = engine.prefill(request, request.tokens)
            request.emit(int(logits.argmax()), logits)
            if request.n > 1 and request.generated == 1:
                engine.start_branches(request, logits)
        if plan.decode:
            logits = engine.decode(plan.decode)
            for request, row in zip(plan.decode, logits, strict=True):
                request.emit(int(row.argmax()), row)
        for request in list(engine.scheduler.running):
            if request.done:
                engine.scheduler.finish(request)
                finished.append(request)
        engine.record(step, plan)
    if pending or engine.busy():
        raise RuntimeError(f"requests still unfinished after {max_steps} steps")
    return finished
    ### END SOLUTION


def abort(engine: PagedEngine, request: GenRequest) -> list[GenRequest]:
    """Cancel ``request`` wherever it is (waiting, running or swapped out), and with it every
    parallel-sampling branch forked from it that the engine still holds. Every block they
    hold goes back: on the GPU each drops one reference (a block shared with a request that
    stays keeps its other references); a swapped-out request's CPU blocks are freed. Returns
    the requests taken out, in any order (none if the engine holds neither ``request`` nor a
    branch of it)."""
    ### BEGIN SOLUTION
    scheduler = engine.scheduler

    def cancelled(other: GenRequest) -> bool:
        return other is request or other.parent == request.id

    taken = [r for r in scheduler.waiting if cancelled(r)]
    for r in taken:
        scheduler.waiting.remove(r)  # a waiting request holds no blocks
    for r in [r for r in scheduler.running if cancelled(r)]:
        scheduler.running.remove(r)
        scheduler.gpu.free(r.id)
        taken.append(r)
    for r in [r for r in scheduler.swapped if cancelled(r)]:
        scheduler.swapped.remove(r)
        scheduler.cpu.free(r.id)
        taken.append(r)
    return taken
    ### END SOLUTION


def decode_surviving_faults(engine: PagedEngine, requests: list[GenRequest]
                            ) -> list[GenRequest]:
    """One decode step of ``requests`` (their slots reserved by this step's plan) in which a
    fault in the model step costs only the requests whose own decode fails. Every request
    that decodes emits its greedy token (``argmax`` of its logits), once. When
    ``engine.decode(requests)`` raises, each request still running is decoded again on its
    own; one whose own decode raises is aborted (``abort``, its branches with it), the
    exception kept in its ``error``. Returns every request aborted, in any order."""
    ### BEGIN SOLUTION
    try:
        logits = engine.decode(requests)
    except Exception:  # a decode writes only each request's reserved slot: retrying is safe
        logits = None
    if logits is not None:
        for request, row in zip(requests, logits, strict=True):
            request.emit(int(row.argmax()), row)
        return []
    aborted: list[GenRequest] = []
    for request in requests:
        if not any(r is request for r in engine.scheduler.running):
            continue  # aborted above, with the request it was forked from
        try:
            row = engine.decode([request])[0]
        except Exception as error:
            request.error = error
            aborted += abort(engine, request)
            continue
        request.emit(int(row.argmax()), row)
    return aborted
    ### END SOLUTION
