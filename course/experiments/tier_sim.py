"""Chapter 11: what a CPU tier buys on chapter 4's workloads, without a model.

The engine's scheduler and the offloading connector's scheduler half run as they do in the
connector engine (``course.v1.connector_engine``); the worker half moves no KV (``DryRunWorker``)
and each request generates the tokens its workload scripted, so a multi-turn conversation's
next prompt starts with exactly the history the engine computed. Counted at each request's
first admission: the prompt tokens found in the GPU's prefix cache, those loaded from the
tier, and the rest, computed::

    GPU blocks   (few)  <── evicted blocks stay in the tier ──>  CPU tier (many, LRU or ARC)
    admission:   GPU hit | tier hit (loaded) | computed
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from course.experiments.prefix_sim import PrefixRequest
from course.language import tr
from course.v1.chunked_scheduler import ChunkedRequest, Schedule
from course.v1.connector_engine import (
    ConnectorScheduler,
    admit_with_connector,
    connector_round,
    connector_schedule_step,
)
from course.v1.kv_connector import KVConnectorMetadata
from course.v1.offload_tier import CPUTier, Key
from course.v1.offloading_connector import (
    BlockCopy,
    OffloadingConnectorScheduler,
    OffloadingConnectorWorker,
)


class DryRunWorker(OffloadingConnectorWorker):
    """The offloading worker's bookkeeping (loads land ``load_steps`` steps after they start,
    those of ``failing_keys`` reported failed, saves reported done) without a pool to copy to
    or from; a block counts ``block_bytes``."""

    def __init__(self, num_cpu_blocks: int, block_bytes: int, load_steps: int = 1,
                 failing_keys: set[Key] | None = None) -> None:
        super().__init__(num_cpu_blocks, load_steps, failing_keys)
        self.block_bytes = block_bytes

    def load(self, copy: BlockCopy) -> None:
        pass

    def fail(self, copy: BlockCopy) -> None:
        pass

    def save_kv_layer(self, layer: int) -> None:
        pass


class NoTier(OffloadingConnectorScheduler):
    """The offloading scheduler half with its tier switched off: it finds and saves nothing
    (the GPU's prefix cache alone, counted the same way)."""

    def get_num_new_matched_tokens(self, request: ChunkedRequest,
                                   num_computed_tokens: int) -> tuple[int, bool]:
        return 0, False

    def build_connector_meta(self, schedule: Schedule,
                             block_ids: dict[int, list[int]]) -> KVConnectorMetadata:
        return KVConnectorMetadata()


@dataclass(frozen=True)
class TierReport:
    """Each request's first admission (``prompt_tokens``: its prompt; where its hits came
    from), and over the whole run the tokens computed (prefill, decode, and what preemption
    made compute again) and the bytes moved each way."""

    prompt_tokens: int
    gpu_hits: int
    tier_hits: int
    computed_tokens: int
    bytes_loaded: int
    bytes_saved: int
    steps: int

    @property
    def hit_rate(self) -> float:
        """GPU and tier hits together, as a share of the prompt tokens."""
        return (self.gpu_hits + self.tier_hits) / self.prompt_tokens


def tier_name(cpu_blocks: int, policy: str) -> str:
    """How a table names a CPU tier of ``cpu_blocks`` blocks evicting by ``policy`` (none
    where it has no block), in the learner's language."""
    return tr(f"{cpu_blocks} blocks, {policy.upper()}") if cpu_blocks else tr("none")


def serve_tiered(requests: list[PrefixRequest], block_size: int, gpu_blocks: int,
                 cpu_blocks: int, policy: str = "lru", block_bytes: int = 0,
                 max_num_batched_tokens: int = 2048, max_num_seqs: int = 16,
                 max_steps: int = 100_000, admit: Callable = admit_with_connector,
                 scheduler_half: type = OffloadingConnectorScheduler) -> TierReport:
    """Serve ``requests`` (each joining once the one it follows has finished) on a pool of
    ``gpu_blocks`` with a CPU tier of ``cpu_blocks`` (``cpu_blocks=0``: no tier), admitted by
    ``admit``, the tier's scheduler half of class ``scheduler_half``."""
    tier = CPUTier(max(cpu_blocks, 1), policy)
    connector = (scheduler_half if cpu_blocks else NoTier)(tier, block_size)
    worker = DryRunWorker(max(cpu_blocks, 1), block_bytes)
    scheduler = ConnectorScheduler(gpu_blocks, block_size, max_num_batched_tokens, connector,
                                   max_num_seqs)
    live = {i: ChunkedRequest(i, list(r.prompt), len(r.output)) for i, r in enumerate(requests)}
    waiting, done, steps, computed = list(range(len(requests))), set(), 0, 0
    while True:
        for index in [i for i in waiting if requests[i].after in done or
                      requests[i].after is None]:
            waiting.remove(index)
            scheduler.add(live[index])
        if not waiting and not scheduler.busy():
            break
        if steps == max_steps:
            raise RuntimeError(f"requests still unfinished after {max_steps} steps")
        steps += 1
        plan = scheduler.step(lambda s: connector_schedule_step(s, admit=admit))
        connector_round(scheduler, worker, plan, lambda: None)
        for chunk in plan.chunks:
            request = chunk.request
            computed += chunk.num_tokens
            if chunk.end == request.num_tokens:  # the scripted token, as the model would
                request.emit(requests[request.id].output[len(request.output)])
        for request in [r for r in scheduler.running if r.done]:
            scheduler.finish(request)
            done.add(request.id)
    first = {}
    for admission in connector.admissions:
        first.setdefault(admission[0], admission)
    return TierReport(sum(a[1] for a in first.values()), sum(a[2] for a in first.values()),
                      sum(a[3] for a in first.values()), computed, worker.bytes_loaded,
                      worker.bytes_saved, steps)


def main(gpu_blocks: int = 200, tiers: tuple[int, ...] = (0, 400, 2000),
         block_size: int = 16) -> None:
    """Hit rates on chapter 4's workloads: the GPU's prefix cache alone, then with a CPU tier
    of each size evicting by LRU and by ARC."""
    from course.experiments.prefix_sim import WORKLOADS

    print(f"prompt tokens hit at first admission, {gpu_blocks} GPU blocks of {block_size}")
    for name, make in WORKLOADS.items():
        requests = make()
        cells = []
        for cpu_blocks in tiers:
            for policy in ("lru", "arc") if cpu_blocks else ("lru",):
                report = serve_tiered(requests, block_size, gpu_blocks, cpu_blocks, policy)
                label = f"tier {cpu_blocks} {policy.upper()}" if cpu_blocks else "GPU only"
                cells.append(f"{label}: {report.hit_rate:.1%}")
        print(f"{name}: " + ", ".join(cells))


if __name__ == "__main__":
    main()
