"""``python -m course.experiments.bench``: operations per second of a BlockManager.

An append-heavy trace (sequences arrive with short prompts, grow a token at a time, and
leave) runs against pools of 1k, 10k and 100k blocks, with the BlockManager's O(1) free pool
(a deque) and with a naive free list whose every take is ``list.pop(0)``, which shifts the
whole list. The trace is the same length at every pool size, so a flat row means the cost per
operation does not grow with the pool. The two run in pairs, one after the other on the same
seeded trace, so that a load on the machine slows both runs of a pair: the median of the
pairs' ratios keeps its side of 1 where the rates, timed apart, would not. Chapter 3's
notebook times the learner's BlockManager; the command line times the course's own.
"""

from __future__ import annotations

import random
import statistics
import time
from collections import deque

from course.language import aligned, tr
from course.v0.block_manager import BlockManager


class _ListFreePool(list):
    """A free pool kept as a plain list: taking from the front shifts every block after it."""

    def popleft(self) -> int:
        return self.pop(0)


def naive(manager_class: type) -> type:
    """``manager_class`` with its free pool (the skeleton's ``free_blocks`` deque) replaced by
    a plain list taken from the front: O(pool) per take."""

    class NaiveFreeList(manager_class):  # type: ignore[misc, valid-type]
        def __init__(self, num_blocks: int, block_size: int) -> None:
            super().__init__(num_blocks, block_size)
            self.free_blocks = _ListFreePool(self.free_blocks)

    NaiveFreeList.__name__ = NaiveFreeList.__qualname__ = f"NaiveFreeList{manager_class.__name__}"
    return NaiveFreeList


NaiveFreeListManager = naive(BlockManager)
"""The course's BlockManager with its free pool as a plain list taken from the front."""

PAIRS = 7  # pairs of runs at each pool size: their median ratio holds on a busy machine
# per run: main() takes about 8 s on a 2-core machine, most of it in filling the list of 100k
# blocks half full (untimed) before each of its runs
OPERATIONS = 15_000


def trace_ops_per_second(manager_class: type, num_blocks: int, operations: int = 100_000,
                         block_size: int = 4, seed: int = 0) -> float:
    """Run a seeded append-heavy trace that keeps the pool about half full."""
    rng = random.Random(seed)
    manager = manager_class(num_blocks, block_size)
    live: deque[int] = deque()
    next_id = done = 0
    target = num_blocks // 2
    # fill the pool to its working level first (not timed)
    while num_blocks - manager.num_free_blocks() < target:
        manager.allocate(next_id, rng.randint(1, 4 * block_size))
        live.append(next_id)
        next_id += 1
    start = time.perf_counter()
    while done < operations:
        if num_blocks - manager.num_free_blocks() >= target:
            manager.free(live.popleft())
        else:
            manager.allocate(next_id, rng.randint(1, 4 * block_size))
            live.append(next_id)
            next_id += 1
        recent = [live[-i] for i in range(1, min(64, len(live)) + 1)]  # O(1) each, at the end
        for seq in rng.sample(recent, min(8, len(recent))):
            manager.append_slot(seq)
        done += 9
    return done / (time.perf_counter() - start)


def paired_runs(manager_class: type, num_blocks: int, pairs: int = PAIRS,
                operations: int = OPERATIONS) -> tuple[float, float, float]:
    """Operations per second of ``manager_class`` and of its ``naive`` copy, each the best of
    ``pairs`` runs (the least disturbed by the rest of the machine), and the median of the
    pairs' ratios of the one to the other: a pair's two runs are timed one after the other on
    the same seeded trace, so a load on the machine slows both."""
    slow_class = naive(manager_class)
    fast, slow = [], []
    for seed in range(pairs):
        fast.append(trace_ops_per_second(manager_class, num_blocks, operations, seed=seed))
        slow.append(trace_ops_per_second(slow_class, num_blocks, operations, seed=seed))
    return max(fast), max(slow), statistics.median(f / s for f, s in zip(fast, slow, strict=True))


def main(manager_class: type = BlockManager) -> None:
    """Print operations per second of ``manager_class`` (its deque free pool) and of the same
    class with a list for a free pool, and how many times faster the deque is, at three pool
    sizes."""
    print(tr(f"BlockManager, append-heavy trace (block size 4, pool half full): operations per "
             f"second, best of {PAIRS} (higher is better)"))
    print(tr(f"deque / list: the median of {PAIRS} ratios, each of a deque run and a list run "
             f"timed in turn on the same trace (above 1: the deque is faster)"))
    print(aligned(tr("pool (blocks)"), 14) + aligned(tr("free pool: deque"), 20)
          + aligned(tr("naive (list.pop(0))"), 22) + aligned(tr("deque / list"), 15))
    for size in [1_000, 10_000, 100_000]:
        fast, slow, ratio = paired_runs(manager_class, size)
        print(f"{size:>14,}{fast:>20,.0f}{slow:>22,.0f}{ratio:>15.2f}")


if __name__ == "__main__":
    main()
