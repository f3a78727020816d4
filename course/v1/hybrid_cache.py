"""What a sliding-window layer still needs, and prefix hits that hold in every group.

A sliding-window layer's query at position ``p`` sees the keys of positions ``p - window + 1``
to ``p``. So once a request has computed ``n`` tokens, the next one (at position ``n``) no
longer needs the first ``n - window + 1`` of them, and a block all of whose tokens are that
old can go back to the pool. Its slot in the block table keeps its place with the null
block, so that a logical block index still names the same tokens (vLLM's hybrid KV cache
manager: ``SlidingWindowManager.get_num_skipped_tokens``, ``remove_skipped_blocks``)::

    window 6, block size 4, 13 tokens computed: the next token (position 13) sees 8..13

    tokens      0  1  2  3 | 4  5  6  7 | 8  9 10 11 |12
    needed                 |            | x  x  x  x | x
    table      [  null     ,   null     ,  block 7   , block 2]

A prefix hit reuses a cached prefix of ``L`` tokens (``L`` a whole number of blocks) and
computes from token ``L`` on. Full attention needs every block before ``L`` cached: the
longest run from the first block, found left to right. A sliding window needs only the
``window - 1`` tokens before ``L``: enough cached blocks just before it, found right to left.
A hybrid model's hit is the longest ``L`` every group accepts. The last token of a request is
always computed (its logits give the next token), so a hit stops short of it.
"""

from __future__ import annotations

from course.v1.kv_coordinator import NULL_BLOCK, full_attention_hit


def skipped_tokens(num_computed: int, window: int) -> int:
    """How many of a request's first tokens the next token's sliding window no longer sees,
    once ``num_computed`` tokens are computed."""
    return max(0, num_computed - window + 1)


def free_skipped_blocks(table: list[int], num_computed: int, window: int,
                        block_size: int) -> list[int]:
    """Once ``num_computed`` tokens of a request are computed, put ``NULL_BLOCK`` in its
    sliding-window group's block ``table`` in place of every block whose tokens the window no
    longer sees (``skipped_tokens(num_computed, window)`` first tokens; a block is skipped
    when all its ``block_size`` tokens are), changing the list itself; return the blocks
    taken out, in table order, for the pool to take back. A slot that already holds the null
    block gives nothing back; the table keeps its length, so a logical block's index still
    names the same tokens."""
    ### BEGIN SOLUTION
    whole = min(skipped_tokens(num_computed, window) // block_size, len(table))
    freed = [block for block in table[:whole] if block != NULL_BLOCK]
    table[:whole] = [NULL_BLOCK] * whole
    return freed
    ### END SOLUTION


def blocks_needed(num_tokens: int, window: int | None, block_size: int) -> range:
    """The logical blocks a request of ``num_tokens`` tokens (the one being computed last)
    must hold: all of them under full attention (``window`` None), from the first one its last
    token's window sees under a sliding window."""
    last = -(-num_tokens // block_size)
    if window is None:
        return range(last)
    return range(skipped_tokens(num_tokens - 1, window) // block_size, last)


def sliding_window_hit(cached: set[int], max_length: int, block_size: int,
                       window: int) -> int:
    """The longest prefix hit, in tokens (a whole number of blocks, at most ``max_length``),
    that a sliding-window group accepts. ``cached``: the indices of the request's logical
    blocks whose K/V the cache holds. A hit of ``L`` tokens needs the window of token ``L``,
    its ``window - 1`` tokens before it: the ``ceil((window - 1) / block_size)`` blocks just
    before ``L`` cached, found by reading the blocks right to left from the last whole block
    within ``max_length``. A run of cached blocks that reaches block 0 is a hit too, however
    short: nothing before it is missing. With a window of one token, nothing before ``L`` is
    needed."""
    ### BEGIN SOLUTION
    needed = -(-(window - 1) // block_size)
    if needed == 0:  # a window of one token: each token sees itself alone
        return max_length // block_size * block_size
    run = 0
    for block in range(max_length // block_size - 1, -1, -1):
        run = run + 1 if block in cached else 0
        if run == needed:
            return (block + needed) * block_size
    return run * block_size  # the run that reached block 0, if any
    ### END SOLUTION


def hybrid_hit(groups: list[tuple[set[int], int | None]], num_tokens: int,
               block_size: int) -> int:
    """The longest prefix hit, in tokens, that every group accepts, for a request of
    ``num_tokens`` tokens. ``groups``: for each group, its cached block indices and its window
    (None: full attention, whose hit is ``full_attention_hit``; else ``sliding_window_hit``).
    The last token is always computed, so the hit starts at most at the last whole block
    before it; each group in turn shortens the hit to what it accepts at that length, until
    a whole pass over the groups shortens it no more."""
    ### BEGIN SOLUTION
    length = (num_tokens - 1) // block_size * block_size
    while True:
        shortest = length
        for cached, window in groups:
            shortest = (full_attention_hit(cached, shortest, block_size) if window is None
                        else sliding_window_hit(cached, shortest, block_size, window))
        if shortest == length:
            return length
        length = shortest
    ### END SOLUTION
