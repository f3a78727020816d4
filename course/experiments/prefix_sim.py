"""Workloads with shared prefixes, and a serving loop that measures what prefix caching saves.

Token ids are synthetic (seeded random integers); only which tokens repeat matters. Lengths follow
the log-normal convention of ``course.experiments.workloads``; the shapes of the three mixes (how
long the shared parts are, how many turns) are this course's assumptions, stated with each.

* chat: every request starts with the same system prompt, then its own user message;
* few-shot: each request picks one of a few tasks, whose prompts share that task's fixed
  instruction and worked examples, then asks its own question;
* multi-turn: conversations whose every turn resends the whole history so far (earlier
  prompts and answers) plus a new message; a turn starts when the previous one has finished.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from course.language import aligned, tr, tr_later
from course.v0.block_manager import NoFreeBlocksError
from course.v0.prefix_cache import PrefixCachingBlockManager


@dataclass(frozen=True)
class PrefixRequest:
    prompt: list[int]
    output: list[int]
    after: int | None = None  # index of the request that must finish before this one starts


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(32_000) for _ in range(n)]


def _length(rng: random.Random, mean: float, sigma: float = 0.6) -> int:
    if sigma == 0:
        return max(1, round(mean))
    return max(1, round(rng.lognormvariate(math.log(mean) - sigma**2 / 2, sigma)))


def chat(count: int, system_prompt: int = 500, mean_user: float = 80,
         mean_output: float = 120, seed: int = 0, sigma: float = 0.6) -> list[PrefixRequest]:
    """``count`` requests sharing one ``system_prompt``-token system prompt (``sigma=0``: every
    user message and answer exactly its mean length)."""
    rng = random.Random(seed)
    system = _tokens(rng, system_prompt)
    return [PrefixRequest(system + _tokens(rng, _length(rng, mean_user, sigma)),
                          _tokens(rng, _length(rng, mean_output, sigma)))
            for _ in range(count)]


def few_shot(count: int, tasks: int = 4, examples: int = 5, mean_example: float = 60,
             mean_question: float = 40, mean_output: float = 30,
             seed: int = 0) -> list[PrefixRequest]:
    """``count`` requests over ``tasks`` tasks, each with a fixed instruction and examples."""
    rng = random.Random(seed)
    prefixes = [_tokens(rng, 40) + [t for _ in range(examples)
                                    for t in _tokens(rng, _length(rng, mean_example))]
                for _ in range(tasks)]
    return [PrefixRequest(rng.choice(prefixes) + _tokens(rng, _length(rng, mean_question)),
                          _tokens(rng, _length(rng, mean_output))) for _ in range(count)]


def multi_turn(conversations: int, turns: int = 4, mean_message: float = 60,
               mean_output: float = 150, seed: int = 0) -> list[PrefixRequest]:
    """``conversations`` conversations of ``turns`` turns; each turn resends the history."""
    rng = random.Random(seed)
    requests: list[PrefixRequest] = []
    for _ in range(conversations):
        history: list[int] = []
        previous = None
        for _ in range(turns):
            prompt = history + _tokens(rng, _length(rng, mean_message))
            output = _tokens(rng, _length(rng, mean_output))
            requests.append(PrefixRequest(prompt, output, previous))
            previous = len(requests) - 1
            history = prompt + output
    return requests


@dataclass(frozen=True)
class CacheReport:
    prompt_tokens: int
    hit_tokens: int
    mean_blocks_cached: float  # blocks held by requests, with prefix sharing
    mean_blocks_unshared: float  # the blocks the same requests would hold without it

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens

    @property
    def memory_saved(self) -> float:
        return 1 - self.mean_blocks_cached / self.mean_blocks_unshared


def serve(requests: list[PrefixRequest], block_size: int, num_blocks: int,
          max_running: int = 16, manager_class: type = PrefixCachingBlockManager
          ) -> CacheReport:
    """Run ``requests`` in order, at most ``max_running`` at a time, each generating one token
    per step; a request waits for the one it follows, and for room in the pool. The manager is
    a ``manager_class`` (the notebook passes the learner's, once it agrees with the course's
    own on ``probe``)."""
    manager = manager_class(num_blocks, block_size)
    waiting = list(range(len(requests)))
    running: dict[int, int] = {}  # request -> output tokens still to generate
    done: set[int] = set()
    prompt_tokens = hit_tokens = steps = 0
    held = unshared = 0
    while waiting or running:
        for index in [i for i in waiting if len(running) < max_running]:
            request = requests[index]
            if request.after is not None and request.after not in done:
                continue
            try:
                hits = manager.allocate(index, request.prompt)
            except NoFreeBlocksError:
                break  # first come, first served: wait for room
            waiting.remove(index)
            running[index] = len(request.output)
            prompt_tokens += len(request.prompt)
            hit_tokens += hits
        for index in list(running):
            request = requests[index]
            step = len(request.output) - running[index]
            manager.append_slot(index, request.output[step])
            running[index] -= 1
        steps += 1
        held += num_blocks - manager.num_free_blocks()  # free = unreferenced (incl. cached)
        unshared += sum(-(-manager.seq_len(i) // block_size) for i in running)
        for index in [i for i, left in running.items() if left == 0]:
            manager.free(index)
            del running[index]
            done.add(index)
    return CacheReport(prompt_tokens, hit_tokens, held / steps, unshared / steps)


def probe(manager_class: type) -> list[tuple]:
    """What a prefix-caching manager reports along three short scripts in tight pools (blocks of
    2): prompts that share a prefix, a decoded block cached once full, prompts that do not fit
    (one only because the cached blocks it would revive leave the free queue too), revivals
    and evictions, and a prompt whose first block was evicted while the next is still cached.
    After each step: what the step returned (hit tokens, a slot, or the error it raised), the
    block tables, the free blocks and the evictable blocks. The contract (LRU
    eviction, tail first) fixes all of them, so a notebook compares the learner's class with
    the course's on it before serving through the learner's."""
    scripts = [(6, [("allocate", 0, [1, 2, 3, 4, 5]), ("append", 0, 6),
                    ("allocate", 1, [1, 2, 3, 4, 9]), ("free", 0, None), ("allocate", 2, [7] * 7),
                    ("allocate", 3, [7, 7, 7]), ("free", 1, None),
                    ("allocate", 4, [1, 2, 3, 4, 5, 6, 8]), ("free", 3, None),
                    ("allocate", 5, [9, 9, 9]), ("free", 4, None), ("free", 5, None),
                    ("allocate", 6, [1, 2, 3, 4]), ("allocate", 7, [8, 8, 8])]),
               (3, [("allocate", 0, [1, 2, 3, 4, 5]), ("free", 0, None),
                    ("allocate", 1, [9, 9, 9]), ("allocate", 2, [1, 2, 7]), ("free", 1, None),
                    ("allocate", 2, [1, 2, 7])]),
               (7, [("allocate", 0, [1, 2, 3]), ("allocate", 1, [1]), ("append", 1, 2),
                    ("append", 1, 3), ("append", 1, 4), ("free", 0, None),
                    ("allocate", 2, [7] * 9), ("free", 1, None), ("free", 2, None),
                    ("allocate", 3, [1, 2, 3, 4, 5])])]
    seen: list[tuple] = []
    for num_blocks, script in scripts:
        manager = manager_class(num_blocks, 2)
        live: list[int] = []
        for kind, seq, tokens in script:
            try:
                if kind == "allocate":
                    result = manager.allocate(seq, tokens)
                    live.append(seq)
                elif kind == "append":
                    result = tuple(manager.append_slot(seq, tokens))
                else:
                    result = manager.free(seq)
                    live.remove(seq)
            except NoFreeBlocksError:
                result = "NoFreeBlocksError"
            seen.append((result, {s: manager.block_table(s) for s in live},
                         manager.num_free_blocks(), list(manager.evictable_blocks())))
    return seen


WORKLOADS = {
    tr_later("chat, 500-token system prompt"): lambda: chat(60),
    tr_later("few-shot, 4 tasks"): lambda: few_shot(100),
    tr_later("multi-turn, 4 turns"): lambda: multi_turn(15),
}


def main(block_sizes: tuple[int, ...] = (1, 16, 64, 256), pool_tokens: int = 32768,
         manager_class: type = PrefixCachingBlockManager) -> dict[str, dict[int, CacheReport]]:
    """Print hit rate and memory saved for each workload and block size; return them."""
    reports: dict[str, dict[int, CacheReport]] = {}
    print(aligned(tr("workload"), -32) + aligned(tr("block size"), 11)
          + aligned(tr("prefill saved (hit rate)"), 26) + aligned(tr("memory saved"), 14))
    for name, make in WORKLOADS.items():
        requests = make()
        reports[name] = {}
        for block_size in block_sizes:
            report = serve(requests, block_size, pool_tokens // block_size,
                           manager_class=manager_class)
            reports[name][block_size] = report
            print(aligned(tr(name), -32) + f"{block_size:>11}{report.hit_rate:>26.1%}"
                                            f"{report.memory_saved:>14.1%}")
    return reports


if __name__ == "__main__":
    main()
