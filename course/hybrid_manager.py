"""One pool of blocks for every group of a hybrid model; per request, one block table per group.

vLLM's hybrid KV cache manager puts a model's layers into groups by attention type, and all
groups draw pages of one size from one pool. A request has a block table in each group; a
full-attention group's table grows with the request, a sliding-window group's table frees the
blocks its window has left behind and keeps their places with the null block::

    pool: 10 blocks of 4 tokens (block 0 is the null block, never handed out)

    request 0, 13 tokens computed:
        full attention          [3, 5, 8, 9]
        sliding window of 6     [0, 0, 4, 7]     blocks 0 and 1 freed as the window slid

    free: 1 2 6 (a FIFO queue)

Contracts: ``allocate_slots`` first frees, in each sliding-window group, the blocks the window
no longer sees; then it takes the new blocks that every group needs for the request's next
tokens, all of them or none (``False``: no new block taken). ``free`` gives back every block of
every group, the last ones first, and never the null block; a preempted request is freed so.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from course.hybrid_cache import NULL_BLOCK, free_skipped_blocks


class HybridBlockManager:
    """Blocks for requests of a model whose groups have ``windows`` (None: full attention),
    from one pool of ``num_blocks`` blocks of ``block_size`` tokens."""

    def __init__(self, num_blocks: int, block_size: int, windows: Sequence[int | None]
                 ) -> None:
        if num_blocks < 2 or block_size < 1 or not windows:
            raise ValueError("a pool needs the null block and one more, blocks of at least "
                             "one token, and at least one group")
        if any(window is not None and window < 1 for window in windows):
            raise ValueError(f"a sliding window sees at least its own token, got {windows}")
        self.block_size = block_size
        self.windows = tuple(windows)
        self.free_blocks: deque[int] = deque(range(1, num_blocks))  # block 0: the null block
        self.tables: dict[int, list[list[int]]] = {}  # request -> one block table per group

    def blocks_to_allocate(self, request: int, num_tokens: int) -> list[int]:
        """How many new blocks each group needs for the request to hold ``num_tokens`` tokens:
        a slot of the table, null or not, is a block the group holds."""
        tables = self.tables.get(request) or [[] for _ in self.windows]
        return [max(0, -(-num_tokens // self.block_size) - len(table)) for table in tables]

    def allocate_slots(self, request: int, num_computed: int, num_new: int) -> bool:
        """Room for ``num_new`` more tokens of ``request``, whose first ``num_computed``
        tokens are computed; ``True`` when made.

        1. ``num_computed < 0`` or ``num_new < 1``: ``ValueError``.
        2. In each sliding-window group (``self.windows``: None is full attention), free the
           blocks the window no longer sees once ``num_computed`` tokens are computed
           (``free_skipped_blocks``), giving them back with ``self._give_back(blocks)``.
        3. ``self.blocks_to_allocate(request, num_computed + num_new)`` says how many new
           blocks each group needs. If together they are more than ``self.num_free()``,
           return ``False``: no new block is taken (the blocks step 2 gave back stay given
           back), and a request seen for the first time gets no tables.
        4. Else take them, one ``self._take()`` per block, each appended to its group's
           table (``self.tables[request]``: one list per group, made empty for a new
           request), and return ``True``.
        """
        ### BEGIN SOLUTION
        if num_computed < 0 or num_new < 1:
            raise ValueError(f"request {request}: {num_computed} tokens computed and {num_new} "
                             "new; a step computes at least one token after those computed")
        tables = self.tables.get(request) or [[] for _ in self.windows]
        for table, window in zip(tables, self.windows, strict=True):
            if window is not None:
                self._give_back(free_skipped_blocks(table, num_computed, window,
                                                    self.block_size))
        needed = self.blocks_to_allocate(request, num_computed + num_new)
        if sum(needed) > self.num_free():
            return False
        self.tables[request] = tables
        for table, count in zip(tables, needed, strict=True):
            table.extend(self._take() for _ in range(count))
        return True
        ### END SOLUTION

    def free(self, request: int) -> None:
        """Give back every block ``request`` holds, in every group."""
        for table in self.tables.pop(request, []):
            self._give_back([b for b in reversed(table) if b != NULL_BLOCK])

    # the pool itself: a prefix cache (``course.hybrid_prefix``) keeps blocks here longer

    def num_free(self) -> int:
        return len(self.free_blocks)

    def _take(self) -> int:
        return self.free_blocks.popleft()

    def _give_back(self, blocks: list[int]) -> None:
        self.free_blocks.extend(blocks)
