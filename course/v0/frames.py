"""What a block manager reports after each operation: the frames chapter 3's animation plays
(``course.notebook.block_animation``) and chapter 8's engine records as it serves."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Frame:
    """The pool after one operation, as the manager reports it."""

    event: str
    tables: dict[int, list[int]]
    lengths: dict[int, int]
    ref_counts: list[int]
    free_blocks: int
    copy: tuple[int, int, int] | None = None  # (src, dst, num_slots) of a copy-on-write
    failed: bool = False  # the operation raised

    @property
    def used_blocks(self) -> int:
        return len(self.ref_counts) - self.free_blocks
