"""Chapter 10 solved another way: bytes counted layer by layer, slots tested position by
position, hits found by trying every length from the longest down, a step's blocks counted
before anything changes but the freed ones, and the window's first key as the keys it has
left behind."""

from __future__ import annotations

import triton
import triton.language as tl

from course.hybrid_cache import NULL_BLOCK, full_attention_hit


def request_bytes(model, num_tokens, bytes_per_element=2):
    elements = 0
    for group in model.groups:
        for _layer in range(group.num_layers):
            if group.state_elements:  # a state layer: one state, once a token is seen
                elements += group.state_elements if num_tokens > 0 else 0
                continue
            seen = num_tokens if group.window is None else min(num_tokens, group.window)
            elements += seen * group.num_kv_heads * group.head_dim * 2
    return elements * bytes_per_element


def free_skipped_blocks(table, num_computed, window, block_size):
    oldest_seen = num_computed - window + 1  # the next token's window starts here
    freed = []
    for index, block in enumerate(table):
        if (index + 1) * block_size > oldest_seen:
            break
        if block != NULL_BLOCK:
            freed.append(block)
            table[index] = NULL_BLOCK
    return freed


def sliding_window_hit(cached, max_length, block_size, window):
    for length in range(max_length - max_length % block_size, 0, -block_size):
        first_needed = max(0, length - (window - 1)) // block_size
        if all(block in cached for block in range(first_needed, length // block_size)):
            return length
    return 0


def hybrid_hit(groups, num_tokens, block_size):
    longest = (num_tokens - 1) - (num_tokens - 1) % block_size
    for length in range(longest, 0, -block_size):
        accepted = True
        for cached, window in groups:
            hit = (full_attention_hit(cached, length, block_size) if window is None
                   else sliding_window_hit(cached, length, block_size, window))
            accepted = accepted and hit == length
        if accepted:
            return length
    return 0


class HybridBlockManager:
    """The pool as a list of free blocks and, per request, one table per group; a step's
    blocks counted before any is taken."""

    def __init__(self, num_blocks, block_size, windows):
        self.block_size, self.windows = block_size, tuple(windows)
        self.free_blocks = list(range(1, num_blocks))
        self.tables = {}

    def blocks_to_allocate(self, request, num_tokens):
        blocks = -(-num_tokens // self.block_size)
        return [max(0, blocks - len(table))
                for table in self.tables.get(request, [[]] * len(self.windows))]

    def allocate_slots(self, request, num_computed, num_new):
        if not (num_computed >= 0 and num_new >= 1):
            raise ValueError(f"a step computes 1 or more tokens, got {num_new} after "
                             f"{num_computed}")
        tables = self.tables[request] if request in self.tables else [[] for _ in self.windows]
        for group, window in enumerate(self.windows):
            if window is not None:
                freed = free_skipped_blocks(tables[group], num_computed, window, self.block_size)
                self._give_back(freed)
        blocks = -(-(num_computed + num_new) // self.block_size)
        wanted = [max(0, blocks - len(table)) for table in tables]
        if sum(wanted) > self.num_free():
            return False
        new_blocks = [self._take() for _ in range(sum(wanted))]
        for table, count in zip(tables, wanted, strict=True):
            table += new_blocks[:count]
            del new_blocks[:count]
        self.tables[request] = tables
        return True

    def free(self, request):
        for table in self.tables.pop(request, []):
            self._give_back([block for block in table[::-1] if block != NULL_BLOCK])

    def num_free(self):
        return len(self.free_blocks)

    def _take(self):
        return self.free_blocks.pop(0)

    def _give_back(self, blocks):
        self.free_blocks.extend(blocks)


ALTERNATIVES = [HybridBlockManager]


@triton.jit
def window_first_key(context, window):
    # the keys the window has left behind: none while the request is no longer than it
    return context - tl.minimum(context, window)
