"""What a sliding window costs prefix caching: chapter 4's workloads served by a hybrid model's
cache, against the same model with every layer full attention.

A sliding-window group gives its blocks back as the window leaves them, so they reach the
free queue long before the request ends, and a pool under pressure evicts them first. A later
request that shares the prefix then finds its full-attention blocks cached but not the
window's last blocks before the hit point: the hit every group accepts is shorter. With room
to spare, nothing is evicted and the two caches hit alike; the hybrid cache holds fewer
blocks all along.

No model runs here: a request's prompt is computed in one step, then one token per step, and
only the blocks are followed (``HybridKVCacheCoordinator``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from course.experiments.prefix_sim import PrefixRequest
from course.v1.chunked_scheduler import ChunkedRequest
from course.v1.hybrid_coordinator import HybridKVCacheCoordinator
from course.v1.kv_coordinator import KVCacheCoordinator


@dataclass(frozen=True)
class HybridCacheReport:
    prompt_tokens: int  # of every request, when it first starts
    hit_tokens: int  # of those, the ones its prefix hit spared
    mean_blocks_held: float  # blocks some request holds, per step (the null block aside)
    preemptions: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens


def serve_hybrid(requests: list[PrefixRequest], windows: Sequence[int | None], block_size: int,
                 num_blocks: int, max_running: int = 16,
                 kv_cache: type[KVCacheCoordinator] = HybridKVCacheCoordinator
                 ) -> HybridCacheReport:
    """Run ``requests`` in order, at most ``max_running`` at a time: each starts from its
    prefix hit and computes the rest of its prompt in one step, then one output token per
    step; a request waits for the one it follows and for room in the pool (first come, first
    served); where a step finds no room, its newest request is preempted (freed, to start
    again from its hit). ``kv_cache``: the KV cache's class (one finding hits or skipping
    blocks with a learner's functions, ``course.notebook.hybrid_demo.learners_kv_cache``)."""
    kv = kv_cache(num_blocks, block_size, windows)
    live = [ChunkedRequest(i, list(r.prompt), len(r.output)) for i, r in enumerate(requests)]
    waiting = list(range(len(requests)))
    running: list[int] = []  # oldest first
    done: set[int] = set()
    admitted: set[int] = set()
    prompt_tokens = hit_tokens = held = steps = preemptions = 0

    while waiting or running:
        for index in list(waiting):
            request, after = live[index], requests[index].after
            if len(running) >= max_running:
                break
            if after is not None and after not in done:
                continue
            hit = request.num_computed_tokens = kv.get_computed_tokens(request)
            if not kv.allocate_slots(request, request.num_tokens - hit):
                request.num_computed_tokens = 0
                if not running:  # the whole pool is free, and too small
                    raise ValueError(f"request {index} ({request.num_tokens} tokens) needs "
                                     "more blocks than the pool holds")
                break  # first come, first served: wait for room
            waiting.remove(index)
            running.append(index)
            request.num_computed_tokens = request.num_tokens
            kv.cache_blocks(request)
            if index not in admitted:  # a preempted request's hits on its own blocks not counted
                admitted.add(index)
                prompt_tokens += len(request.prompt)
                hit_tokens += hit
        for index in list(running):
            if index not in running:  # preempted earlier in this step
                continue
            request = live[index]
            request.output.append(requests[index].output[len(request.output)])
            while not kv.allocate_slots(request, 1):
                newest = live[running.pop()]
                kv.free(newest)
                newest.num_computed_tokens = 0
                newest.output.clear()  # it starts again from its prompt
                waiting.insert(0, newest.id)
                preemptions += 1
                if newest is request:
                    break
            if index in running:
                request.num_computed_tokens += 1  # the cache reads the computed tokens' blocks
                kv.cache_blocks(request)
        steps += 1
        held += kv.num_held()  # a block two requests share counts once
        for index in [i for i in running if live[i].done]:
            kv.free(live[index])
            running.remove(index)
            done.add(index)
    return HybridCacheReport(prompt_tokens, hit_tokens, held / max(steps, 1), preemptions)


def main(window: int = 128, block_size: int = 16, pools: tuple[int, ...] = (4000, 400, 200),
         count: int = 40) -> None:
    """Print chapter 4's workloads' hit rates and blocks held (``count`` requests each, in
    ``count // 4`` conversations for multi-turn), a model with a sliding window of ``window``
    tokens in half its layers against the same model all full attention, in pools of
    ``pools`` blocks of ``block_size`` tokens."""
    from course.experiments.prefix_sim import chat, few_shot, multi_turn

    workloads = {"chat": chat(count), "few-shot": few_shot(count),
                 "multi-turn": multi_turn(count // 4)}
    print(f"hit rate and mean blocks held, window {window}, blocks of {block_size}: "
          f"`python -m course.experiments.hybrid_sim`")
    print(f"{'workload':<12}{'blocks':>8}{'full: hits':>12}{'held':>8}"
          f"{'hybrid: hits':>14}{'held':>8}")
    for name, requests in workloads.items():
        for pool in pools:
            full = serve_hybrid(requests, [None, None], block_size, pool)
            hybrid = serve_hybrid(requests, [window, None], block_size, pool)
            print(f"{name:<12}{pool:>8}{full.hit_rate:>12.1%}{full.mean_blocks_held:>8.0f}"
                  f"{hybrid.hit_rate:>14.1%}{hybrid.mean_blocks_held:>8.0f}")


if __name__ == "__main__":
    main()
