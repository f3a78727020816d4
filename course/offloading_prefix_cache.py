"""Chapter 4's prefix cache with a CPU tier behind it: the cached blocks the GPU pool evicts are
stored in the tier, and a prompt's hit goes on past the GPU's cached blocks into those the tier
holds, loaded into fresh GPU blocks instead of computed (vLLM's offloading connector does this
through ``OffloadingManager``, ``course.offload_tier``)::

    prompt's blocks   0  1  2  3  4  5  6 | 7 (last token: computed)
    GPU cache         x  x  x               hit: 3 blocks, nothing moved
    CPU tier                   x  x         loaded: 2 blocks, copied over PCIe
    computed                         x  x   prefill
"""

from __future__ import annotations

from course.offload_tier import CPUTier
from course.prefix_cache import PrefixCachingBlockManager, prefix_keys


class OffloadingPrefixCache(PrefixCachingBlockManager):
    """A ``PrefixCachingBlockManager`` of ``num_blocks`` GPU blocks whose evicted cached blocks
    go to ``tier`` (a ``CPUTier``), and whose prompts load what the tier holds after their GPU
    hit. ``loaded_tokens`` counts the prompt tokens loaded so far."""

    def __init__(self, num_blocks: int, block_size: int, tier: CPUTier) -> None:
        super().__init__(num_blocks, block_size)
        self.tier = tier
        self.loaded_tokens = 0

    def _take_block(self) -> int:
        if self.free_queue:
            key = self.keys.get(next(iter(self.free_queue)))
            if key is not None:  # a cached block about to be evicted: keep a copy on the CPU
                room = self.tier.prepare_store([key])
                if room is not None:
                    self.tier.complete_store([stored for stored, _ in room[0]])
        return super()._take_block()

    def allocate(self, seq_id: int, tokens: list[int], extra_keys: tuple = ()) -> int:
        """Chapter 4's ``allocate`` (its return: the GPU's hit tokens), then the blocks after
        the GPU hit that the tier holds, up to the block before the last token, are loaded."""
        hits = super().allocate(seq_id, tokens, extra_keys)
        keys = prefix_keys(tokens, self.block_size, extra_keys)
        reachable = keys[hits // self.block_size:(len(tokens) - 1) // self.block_size]
        found = reachable[:self.tier.lookup(reachable)]
        if found:
            self.tier.prepare_load(found)
            self.tier.touch(found)
            self.tier.complete_load(found)
            self.loaded_tokens += len(found) * self.block_size
        return hits
