"""Chapter 11's workloads and demonstrations for the tiny model."""

from __future__ import annotations

import random

from course.chunked_scheduler import ChunkedRequest


def conversations(count: int, seed: int, num_conversations: int = 4,
                  vocab: int = 128) -> list[ChunkedRequest]:
    """``count`` turns of ``num_conversations`` chats taken in turn, a few steps apart: each
    turn's prompt is its chat's previous prompt and a few new tokens, so it starts with a
    prefix the engine computed before (on the GPU, in a CPU tier, or evicted from both)."""
    rng = random.Random(seed)
    chats = [[rng.randrange(vocab) for _ in range(rng.randint(2, 8))]
             for _ in range(num_conversations)]
    requests = []
    for i in range(count):
        chat = chats[i % num_conversations]
        chat += [rng.randrange(vocab) for _ in range(rng.randint(1, 5))]
        requests.append(ChunkedRequest(i, list(chat), rng.randint(1, 5), 2 * i))
    return requests
