"""Chapter 10: attention for a sliding-window layer, through chapter 9's variable-length paged
kernel.

A sliding-window layer's query at position ``p`` sees only the keys of positions
``p - window + 1`` to ``p``. Chapter 9's kernel already loops over a query's blocks from the
block of the first key it sees, ``FIRST_KEY(context, window)`` (``context = p + 1``), to the
block of its own position, and masks every slot outside that run; a window changes only which
key comes first. A hybrid cache (``course.v1.hybrid_coordinator``) has put the null block in the
table entries before the first query's window, so a loop that starts at the window's first
block never reads one::

    seq_len = 14, q_len = 1, window = 6, block_size = 4: the query (position 13) sees 8..13

    block_tables[seq]   [ 0 | 0 | 7 | 2 ]      0: the null block, never read
    loop                          ^-- starts at block first // 4 = 2, first = 14 - 6 = 8
    valid slots                  8..11, 12..13 (14, 15 masked)

``window_attention`` runs the kernel with ``window_first_key``; ``window_attention_reference``
computes the same in PyTorch, through chapter 9's ``varlen_paged_attention``. Import after
``course.setup()``.

The answer is ``window_first_key``'s body between ``### BEGIN SOLUTION`` and ``### END
SOLUTION``: chapter 10's notebook renders its cell from it, and a learner edition replaces it
with a stub.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels.varlen_attention import varlen_attention
from kernels.varlen_attention_ref import varlen_paged_attention

__all__ = ["check_window", "window_attention", "window_attention_reference",
           "window_first_key"]


@triton.jit
def window_first_key(context, window):
    """The first key a sliding-window query sees, when it sees its request's keys up to its
    own position, ``context`` of them (keys ``0 .. context - 1``), through a window of
    ``window`` keys, its own included: ``context - window``, or 0 while the request is
    shorter than the window. Chapter 9's kernel starts its block loop at this key's block
    and masks the keys before it."""
    ### BEGIN SOLUTION
    return tl.maximum(context - window, 0)
    ### END SOLUTION


def check_window(window: int) -> None:
    """Refuse a window that is not an int (``TypeError``) or under one token (``ValueError``)."""
    if isinstance(window, bool) or not isinstance(window, int):
        raise TypeError(f"window must be an int, got {type(window).__name__}")
    if window < 1:
        raise ValueError(f"window must be at least 1 (the query sees itself), got {window}")


def window_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                     block_tables: torch.Tensor, window: int, scale: float,
                     first_key=None, kernel=None) -> torch.Tensor:
    """Chapter 9's ``varlen_attention`` (its arguments and layout), each query seeing its last
    ``window`` keys up to its own position: the kernel (``kernel``, by default chapter 9's)
    given ``first_key`` (by default ``window_first_key``)."""
    check_window(window)
    return varlen_attention(query, k_cache, v_cache, query_start_loc, seq_lens, block_tables,
                            scale, kernel, window, first_key or window_first_key)


def default_window_attention(device: torch.device):
    """The window's attention an engine uses on ``device``: ``window_attention`` (chapter 9's
    Triton kernel) on a CUDA GPU, else ``window_attention_reference`` in PyTorch."""
    if device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return window_attention
    return window_attention_reference


def window_attention_reference(query: torch.Tensor, k_cache: torch.Tensor,
                               v_cache: torch.Tensor, query_start_loc: torch.Tensor,
                               seq_lens: torch.Tensor, block_tables: torch.Tensor, window: int,
                               scale: float) -> torch.Tensor:
    """The same in PyTorch: each query token becomes a request of its own whose keys are the
    ones its window sees, gathered through its request's block table into a cache of
    one-token blocks, and chapter 9's ``varlen_paged_attention`` attends over them."""
    check_window(window)
    block_size = k_cache.shape[1]
    slots: list[int] = []  # the keys every query sees, query after query
    lengths: list[int] = []
    for seq in range(len(seq_lens)):
        q_len = int(query_start_loc[seq + 1] - query_start_loc[seq])
        length, table = int(seq_lens[seq]), block_tables[seq].tolist()
        for position in range(length - q_len, length):
            seen = range(max(position + 1 - window, 0), position + 1)
            slots += [table[p // block_size] * block_size + p % block_size for p in seen]
            lengths.append(len(seen))
    device = query.device
    index = torch.tensor(slots, dtype=torch.int64, device=device)
    keys = k_cache.flatten(0, 1)[index].unsqueeze(1)  # [keys, 1, kv_heads, head_dim]
    values = v_cache.flatten(0, 1)[index].unsqueeze(1)
    width = max(lengths, default=1)
    starts = torch.tensor([0, *lengths], device=device).cumsum(0)
    tables = (starts[:-1, None] + torch.arange(width, device=device)).clamp(max=len(slots) - 1)
    one_each = torch.arange(len(lengths) + 1, dtype=torch.int32, device=device)
    return varlen_paged_attention(query, keys, values, one_each,
                                  torch.tensor(lengths, dtype=torch.int32, device=device),
                                  tables.to(torch.int32), scale)
