"""What a sliding window costs prefix caching: chapter 4's workloads served by a hybrid model's
cache, against the same model with every layer full attention.

A sliding-window group gives its blocks back as the window leaves them, so they reach the
free queue long before the request ends, and a pool under pressure evicts them first. A later
request that shares the prefix then finds its full-attention blocks cached but not the
window's last blocks before the hit point: the hit every group accepts is shorter. With room
to spare, nothing is evicted and the two caches hit alike; the hybrid cache holds fewer
blocks all along.

No model runs here: a request's prompt is computed in one step, then one token per step, and
only the blocks are followed (``HybridPrefixCache``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from course.hybrid_prefix import HybridPrefixCache
from course.prefix_sim import PrefixRequest


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
                 manager_class: type[HybridPrefixCache] = HybridPrefixCache
                 ) -> HybridCacheReport:
    """Run ``requests`` in order, at most ``max_running`` at a time: each starts from its
    prefix hit and computes the rest of its prompt in one step, then one output token per
    step; a request waits for the one it follows and for room in the pool (first come, first
    served); where a step finds no room, its newest request is preempted (freed, to start
    again from its hit). ``manager_class``: the prefix cache (a learner's hit or allocation in
    a subclass)."""
    manager = manager_class(num_blocks, block_size, windows)
    waiting = list(range(len(requests)))
    computed: dict[int, int] = {}  # running request -> tokens computed
    done: set[int] = set()
    admitted: set[int] = set()
    prompt_tokens = hit_tokens = held = steps = preemptions = 0

    while waiting or computed:
        for index in [i for i in waiting if len(computed) < max_running]:
            request = requests[index]
            if request.after is not None and request.after not in done:
                continue
            hit = manager.allocate_prefix(index, request.prompt)
            if not manager.allocate_slots(index, hit, len(request.prompt) - hit):
                manager.free(index)
                if not computed:  # the whole pool is free, and too small
                    raise ValueError(f"request {index} ({len(request.prompt)} tokens) needs "
                                     "more blocks than the pool holds")
                break  # first come, first served: wait for room
            waiting.remove(index)
            computed[index] = len(request.prompt)
            manager.cache_full_blocks(index, request.prompt, len(request.prompt))
            if index not in admitted:  # a preempted request's hits on its own blocks not counted
                admitted.add(index)
                prompt_tokens += len(request.prompt)
                hit_tokens += hit
        for index in list(computed):
            if index not in computed:  # preempted earlier in this step
                continue
            while not manager.allocate_slots(index, computed[index], 1):
                newest = max(computed)
                manager.free(newest)
                del computed[newest]
                waiting.insert(0, newest)
                preemptions += 1
                if newest == index:
                    break
            if index in computed:
                computed[index] += 1  # the cache reads the computed tokens' blocks alone
                request = requests[index]
                manager.cache_full_blocks(index, request.prompt + request.output,
                                          computed[index])
        steps += 1
        held += num_blocks - 1 - manager.num_free()  # a block two requests share counts once
        for index in [i for i, n in computed.items()
                      if n >= len(requests[i].prompt) + len(requests[i].output)]:
            manager.free(index)
            del computed[index]
            done.add(index)
    return HybridCacheReport(prompt_tokens, hit_tokens, held / max(steps, 1), preemptions)


def main(window: int = 128, block_size: int = 16, pools: tuple[int, ...] = (4000, 400, 200),
         count: int = 40) -> None:
    """Print chapter 4's workloads' hit rates and blocks held (``count`` requests each, in
    ``count // 4`` conversations for multi-turn), a model with a sliding window of ``window``
    tokens in half its layers against the same model all full attention, in pools of
    ``pools`` blocks of ``block_size`` tokens."""
    from course.prefix_sim import chat, few_shot, multi_turn

    workloads = {"chat": chat(count), "few-shot": few_shot(count),
                 "multi-turn": multi_turn(count // 4)}
    print(f"hit rate and mean blocks held, window {window}, blocks of {block_size}: "
          f"`python -m course.hybrid_sim`")
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
