"""Paged batches with known contents, for trying attention over a block table (chapters 6, 7,
9 and 10; their checks grade on the same batches).

A case holds sequences of given lengths whose K/V sit slot by slot in a pool of physical
blocks, shuffled so no sequence's blocks are in order, every unused slot NaN: an attention
that reads a slot it should not gets NaN, not a plausible number.

    PagedCase([5, 2], block_size=4, ...): 3 blocks used, 3 spare, tables padded with 0

    pool   block 0         block 1        block 2      blocks 3-5
           [s1 t0 t1 . .]  [s0 t4 . . .]  [s0 t0..t3]  [. . . .]      . = NaN
    tables seq 0: [2, 1, 0]   seq 1: [0, 0, 0]

The keys and values of sequence ``s`` are also kept whole (``keys[s]``, ``values[s]``:
[length, kv_heads, head_dim]), for comparing against contiguous attention.
"""

from __future__ import annotations

import math
import os

import torch

PAGED_SEED = 2026  # chapter 6's cases
KERNEL_SEED = 2027  # chapter 7's
VARLEN_SEED = 2031  # chapter 9's
WINDOW_SEED = 2033  # chapter 10's


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float16`` -> ``"float16"``: how a case names its dtype."""
    return str(dtype).split(".")[-1]


def on_gpu() -> bool:
    """Whether Triton kernels compile for a CUDA GPU (rather than run on the interpreter)."""
    return torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"


def kernel_device() -> str:
    """Where kernels read their tensors: ``"cuda"`` on a GPU, else ``"cpu"``."""
    return "cuda" if on_gpu() else "cpu"


class PagedCase:
    """Sequences of the given lengths in a NaN-filled pool with shuffled physical blocks, and
    one decode query per sequence. ``query_scale`` > 1 sharpens the softmax (large scores),
    where fp16 arithmetic shows."""

    def __init__(self, lengths, block_size, q_heads, kv_heads, head_dim=16,
                 dtype=torch.float32, seed=PAGED_SEED, *, query_scale=1.0):
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        gen = torch.Generator().manual_seed(seed)
        self.lengths, self.block_size = list(lengths), block_size
        self.q_heads, self.kv_heads, self.dtype = q_heads, kv_heads, dtype
        self.head_dim, self.seed = head_dim, seed
        per_seq = [-(-n // block_size) for n in self.lengths]
        num_blocks = sum(per_seq) + 3
        order = torch.randperm(num_blocks, generator=gen).tolist()
        self.k_cache = torch.full((num_blocks, block_size, kv_heads, head_dim), float("nan"),
                                  dtype=dtype)
        self.v_cache = self.k_cache.clone()
        max_blocks = max(per_seq) + 1
        self.tables = torch.zeros(len(self.lengths), max_blocks, dtype=torch.int32)
        self.keys, self.values = [], []
        for seq, (length, count) in enumerate(zip(self.lengths, per_seq, strict=True)):
            blocks = [order.pop() for _ in range(count)]
            self.tables[seq, :count] = torch.tensor(blocks, dtype=torch.int32)
            keys = torch.randn(length, kv_heads, head_dim, generator=gen).to(dtype)
            values = torch.randn(length, kv_heads, head_dim, generator=gen).to(dtype)
            for p in range(length):
                self.k_cache[blocks[p // block_size], p % block_size] = keys[p]
                self.v_cache[blocks[p // block_size], p % block_size] = values[p]
            self.keys.append(keys)
            self.values.append(values)
        self.query_scale = query_scale
        self.query = (torch.randn(len(self.lengths), q_heads, head_dim, generator=gen)
                      * query_scale).to(dtype)
        self.scale = 1 / math.sqrt(head_dim)
        self.seq_lens = torch.tensor(self.lengths, dtype=torch.int32)

    def spec(self) -> dict:
        """The arguments that build this case again."""
        spec = dict(lengths=self.lengths, block_size=self.block_size, q_heads=self.q_heads,
                    kv_heads=self.kv_heads, head_dim=self.head_dim,
                    dtype=dtype_name(self.dtype), seed=self.seed)
        return spec | ({} if self.query_scale == 1.0 else {"query_scale": self.query_scale})

    def describe(self) -> str:
        return (f"lengths {self.lengths}, block size {self.block_size}, {self.q_heads} query "
                f"heads over {self.kv_heads} KV heads, {dtype_name(self.dtype)}"
                + ("" if self.query_scale == 1.0 else
                   f", queries scaled by {self.query_scale:g} (a sharp softmax)"))


class KernelCase(PagedCase):
    """A ``PagedCase`` on the device the kernels run on, laid out to catch a kernel's address
    arithmetic: its block tables a strided view into a wider buffer (every other entry names a
    decoy block of finite values) and its pool a view with a poisoned (NaN) block before it
    and two after it. A kernel that reads the table with the wrong stride, or a block one too
    many, gets wrong numbers rather than a crash."""

    def __init__(self, lengths, block_size, q_heads, kv_heads, head_dim=16,
                 dtype=torch.float32, seed=KERNEL_SEED):
        super().__init__(lengths, block_size, q_heads, kv_heads, head_dim, dtype, seed)
        dtype = self.dtype
        used = set()
        for seq, length in enumerate(self.lengths):
            used |= set(self.tables[seq, :-(-length // block_size)].tolist())
        decoy = max(set(range(self.k_cache.shape[0])) - used)
        gen = torch.Generator().manual_seed(seed + 1)
        self.k_cache[decoy] = torch.randn(self.k_cache[decoy].shape, generator=gen).to(dtype)
        self.v_cache[decoy] = torch.randn(self.v_cache[decoy].shape, generator=gen).to(dtype)
        self.decoy = decoy
        rows, width = self.tables.shape
        wide = torch.full((max(rows, width) + 1, width + 3), decoy, dtype=torch.int32)
        for seq, length in enumerate(self.lengths):
            count = -(-length // block_size)
            wide[seq, :count] = self.tables[seq, :count]
        device = kernel_device()
        self.wide = wide.to(device)
        self.tables = self.wide[:rows, :width]  # row stride width + 3
        for name in ("k_cache", "v_cache"):
            pool = getattr(self, name)
            buffer = torch.full((pool.shape[0] + 3, *pool.shape[1:]), float("nan"), dtype=dtype)
            buffer[1:1 + pool.shape[0]] = pool
            setattr(self, name, buffer.to(device)[1:1 + pool.shape[0]])
        for name in ("seq_lens", "query"):
            setattr(self, name, getattr(self, name).to(device))

    def arguments(self) -> tuple:
        """query, k_cache, v_cache, block_tables, seq_lens, scale: a decode call's arguments."""
        return self.query, self.k_cache, self.v_cache, self.tables, self.seq_lens, self.scale

    def blocks(self, seq: int) -> int:
        """How many table entries sequence ``seq`` uses."""
        return -(-self.lengths[seq] // self.block_size)

    def describe(self) -> str:
        return (super().describe() + f", head size {self.head_dim}, block table row stride "
                f"{self.tables.stride(0)}")


class VarlenCase(PagedCase):
    """Requests with contexts ``seq_lens`` (their K/V in a NaN-filled pool, shuffled
    blocks) and ``q_lens`` new query tokens each, packed: request ``i``'s queries are rows
    ``query_start_loc[i]`` to ``query_start_loc[i + 1] - 1`` of ``query``, the last
    ``q_lens[i]`` tokens of its context. With ``from_key``, each query sees its keys from key
    ``from_key`` on (its own key alone where that is later than its position): a first key
    other than 0, for trying where a kernel's block loop starts."""

    def __init__(self, q_lens, seq_lens, block_size, q_heads, kv_heads, head_dim=16,
                 dtype=torch.float32, seed=VARLEN_SEED, device="cpu", from_key=None):
        super().__init__(seq_lens, block_size, q_heads, kv_heads, head_dim, dtype, seed)
        self.q_lens, self.from_key = list(q_lens), from_key
        gen = torch.Generator().manual_seed(seed + 7)
        self.query = torch.randn(sum(self.q_lens), q_heads, head_dim, generator=gen
                                 ).to(self.dtype)
        starts = [0]
        for q_len in self.q_lens:
            starts.append(starts[-1] + q_len)
        self.query_start_loc = torch.tensor(starts, dtype=torch.int32)
        self.device = device
        for name in ("k_cache", "v_cache", "tables", "seq_lens", "query", "query_start_loc"):
            setattr(self, name, getattr(self, name).to(device))

    def first_key(self, position: int) -> int:
        """The first key the query at ``position`` sees."""
        return 0 if self.from_key is None else min(self.from_key, position)

    def positions(self) -> list[tuple[int, int]]:
        """(request, position) of each packed query token, in order."""
        return [(r, seq_len - q_len + j) for r, (q_len, seq_len)
                in enumerate(zip(self.q_lens, self.lengths, strict=True)) for j in range(q_len)]

    def spec(self) -> dict:
        spec = super().spec()
        spec["seq_lens"] = spec.pop("lengths")
        spec = dict(q_lens=self.q_lens, **spec)
        return spec | ({} if self.from_key is None else {"from_key": self.from_key})

    def arguments(self) -> tuple:
        """query, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale."""
        return (self.query, self.k_cache, self.v_cache, self.query_start_loc, self.seq_lens,
                self.tables, self.scale)

    def describe(self) -> str:
        return (f"query lengths {self.q_lens}, seq_lens {self.lengths}, blocks of "
                f"{self.block_size}, {self.q_heads} query heads over {self.kv_heads} KV heads, "
                f"head_dim {self.head_dim}, {dtype_name(self.dtype)}"
                + ("" if self.from_key is None else
                   f", each query seeing its keys from key {self.from_key} on"))


class WindowCase(VarlenCase):
    """A ``VarlenCase`` whose queries see their last ``window`` keys, as a hybrid cache holds
    them: each table entry before the block of the first key a request's first query sees
    names the null block (an unused block of NaN), the blocks a sliding-window group gave
    back; so do the tables' padding and the entries laid out before the first row, so that
    a loop that starts before a row's first entry reads NaN, not another request's keys."""

    def __init__(self, q_lens, seq_lens, block_size, q_heads, kv_heads, window, head_dim=16,
                 dtype=torch.float32, seed=WINDOW_SEED, device="cpu"):
        super().__init__(q_lens, seq_lens, block_size, q_heads, kv_heads, head_dim, dtype,
                         seed)
        self.window = window
        used = {int(b) for seq, length in enumerate(self.lengths)
                for b in self.tables[seq, :-(-length // block_size)].tolist()}
        self.null_block = min(set(range(self.k_cache.shape[0])) - used)
        rows, width = self.tables.shape
        guard = window // block_size + 2  # entries before row 0: any loop start down to -window
        flat = torch.full((guard + rows * width,), self.null_block, dtype=torch.int32)
        tables = flat[guard:].view(rows, width)
        for seq, length in enumerate(self.lengths):
            first, end = self.first_block(seq), -(-length // block_size)
            tables[seq, first:end] = self.tables[seq, first:end]
        self.tables = flat.to(device)[guard:].view(rows, width)
        for name in ("k_cache", "v_cache", "seq_lens", "query", "query_start_loc"):
            setattr(self, name, getattr(self, name).to(device))
        self.device = device

    def first_key(self, position: int) -> int:
        return max(position + 1 - self.window, 0)

    def first_block(self, seq: int) -> int:
        """The table entry of the block of the first key request ``seq``'s first query sees."""
        q_len, length = self.q_lens[seq], self.lengths[seq]
        return self.first_key(length - q_len) // self.block_size if q_len else 0

    def spec(self) -> dict:
        return super().spec() | {"window": self.window}

    def describe(self) -> str:
        return super().describe() + f", a window of {self.window} tokens"
