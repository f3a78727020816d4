"""What block sharing saves: parallel sampling and beam search run through a BlockManager.

Each request is played step by step on a BlockManager (``manager_class``: the notebook passes
the learner's, once it agrees with the course's own on a short probe), and the blocks it holds
are summed over its steps, with sharing (fork and copy-on-write) and without (each sample or
beam holding its own copy of everything). The saving is 1 - shared / unshared, the measure
of the vLLM paper's Fig. 15 (Kwon et al., SOSP 2023, section 6.3), which reports 6.1 to 9.8 %
for parallel sampling and 37.6 to 55.2 % for beam search on the Alpaca trace.

Parallel sampling: the prompt is allocated once and forked into ``n`` samples, each
generating its own number of tokens (drawn from the workload's output distribution).
Beam search: ``width`` beams generate the request's output length; after every step the
surviving beams' parents are drawn at random (each beam has one child on average): beams
without a child are freed, beams with several are forked. That random-survivor model is
this course's assumption; a real beam search keeps the highest-scoring candidates.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from course.experiments.workloads import LengthMix, Request, sample_requests
from course.v0.block_manager import BlockManager


@dataclass(frozen=True)
class Saving:
    shared_block_steps: int
    unshared_block_steps: int

    @property
    def fraction(self) -> float:
        return 1 - self.shared_block_steps / self.unshared_block_steps


def _blocks(length: int, block_size: int) -> int:
    return -(-length // block_size)


def parallel_sampling(requests: list[Request], n: int, mix: LengthMix, block_size: int = 16,
                      seed: int = 0, manager_class: type = BlockManager) -> Saving:
    """Blocks held over time by ``n`` samples per request, with and without sharing."""
    rng = random.Random(seed)
    lengths = [r.output_len for r in sample_requests(mix, len(requests) * n, seed=seed + 1)]
    shared = unshared = 0
    for index, request in enumerate(requests):
        outputs = lengths[index * n:(index + 1) * n]
        rng.shuffle(outputs)
        pool = _blocks(request.prompt_len + max(outputs), block_size) * n + 1
        manager = manager_class(pool, block_size)
        manager.allocate(0, request.prompt_len)
        for child in range(1, n):
            manager.fork(0, child)
        live = dict(enumerate(outputs))
        while live:
            for seq in list(live):
                manager.append_slot(seq)
                live[seq] -= 1
                if live[seq] == 0:
                    manager.free(seq)
                    del live[seq]
            shared += pool - manager.num_free_blocks()
            unshared += sum(_blocks(manager.seq_len(s), block_size) for s in live)
    return Saving(shared, unshared)


def beam_search(requests: list[Request], width: int, block_size: int = 16,
                seed: int = 0, manager_class: type = BlockManager) -> Saving:
    """Blocks held over time by ``width`` beams per request, with and without sharing."""
    rng = random.Random(seed)
    shared = unshared = 0
    for request in requests:
        pool = _blocks(request.final_len, block_size) * width * 2 + 2
        manager = manager_class(pool, block_size)
        manager.allocate(0, request.prompt_len)
        beams, next_id = [0], 1
        for _ in range(1, width):
            manager.fork(0, next_id)
            beams.append(next_id)
            next_id += 1
        for _ in range(request.output_len):
            for beam in beams:
                manager.append_slot(beam)
            shared += pool - manager.num_free_blocks()
            unshared += sum(_blocks(manager.seq_len(b), block_size) for b in beams)
            parents = [rng.choice(beams) for _ in beams]
            survivors = []
            for beam in beams:
                children = parents.count(beam)
                if children == 0:
                    manager.free(beam)
                    continue
                survivors.append(beam)
                for _ in range(children - 1):
                    manager.fork(beam, next_id)
                    survivors.append(next_id)
                    next_id += 1
            beams = survivors
    return Saving(shared, unshared)
