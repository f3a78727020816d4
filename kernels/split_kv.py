"""Split-KV decode (flash-decoding): one sequence's blocks shared among several programs.

With a small batch, ``num_seqs x num_kv_heads`` programs leave most of a GPU's
multiprocessors idle while each program walks a long sequence alone. Splitting the blocks
into ``num_splits`` contiguous ranges gives every range its own program; each writes its
softmax partial, and a second kernel merges them (chapter 6's ``merge_partials``)::

    blocks of one sequence:  [0 1 2 3 | 4 5 6 7 | 8 9 . . | . . . .]   blocks_per_split = 4
                               split 0   split 1   split 2   split 3 (empty)
    split_kv_kernel      -> per (seq, query head, split): m, l, acc   (acc not yet divided)
    merge_splits_kernel  -> out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s,  M = max m_s

An empty split writes l = 0 and acc = 0 (and m = -inf), so it weighs nothing in the merge.
Partials are fp32 and laid out [num_seqs, num_q_heads, num_splits(, head_dim)], contiguous.

Answers are the bodies between ``### BEGIN SOLUTION`` and ``### END SOLUTION``: chapter 7's
notebook renders its cells from them, and a learner edition replaces them with stubs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.interpreter import lighten

lighten()  # under the interpreter: see kernels.interpreter

MIN_BLOCKS_PER_SPLIT = 16
"""Fewer blocks than this per program and the merge's extra traffic outweighs the gain."""


@triton.jit
def split_kv_kernel(
    max_ptr, sum_ptr, acc_ptr, query_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr,
    seq_lens_ptr, scale,
    stride_q_seq, stride_q_head, stride_kv_block, stride_kv_token, stride_kv_head,
    stride_table_seq, blocks_per_split,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr,
):
    """Program (seq, kv_head, split): the softmax partial (m, l, acc) of the group's query
    heads over blocks [split x blocks_per_split, (split + 1) x blocks_per_split) of the
    sequence, clipped to its cdiv(seq_len, BLOCK_SIZE) blocks (table entries outside that
    range are never read); an empty range writes m = -inf, l = 0, acc = 0."""
    ### BEGIN SOLUTION
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_q_heads = tl.num_programs(1) * GROUP
    num_splits = tl.num_programs(2)
    rows = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + rows
    real = rows < GROUP
    tokens = tl.arange(0, BLOCK_SIZE)
    dims = tl.arange(0, HEAD_PAD)
    in_head = dims < HEAD_DIM

    q_offsets = seq * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :]
    q_mask = real[:, None] & in_head[None, :]
    q = tl.load(query_ptr + q_offsets, mask=q_mask, other=0.0)
    seq_len = tl.load(seq_lens_ptr + seq)
    first = split * blocks_per_split
    last = tl.minimum(first + blocks_per_split, tl.cdiv(seq_len, BLOCK_SIZE))

    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    total = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_PAD], tl.float32)
    for index in range(first, last):
        block = tl.load(block_tables_ptr + seq * stride_table_seq + index).to(tl.int64)
        valid = index * BLOCK_SIZE + tokens < seq_len
        kv_offsets = (block * stride_kv_block + tokens[:, None] * stride_kv_token
                      + kv_head * stride_kv_head + dims[None, :])
        kv_mask = valid[:, None] & in_head[None, :]
        k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k)) * scale
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        rescale = tl.exp(m - m_new)
        weights = tl.exp(scores - m_new[:, None])
        total = total * rescale + tl.sum(weights, axis=1)
        acc = acc * rescale[:, None] + tl.dot(weights.to(v.dtype), v)
        m = m_new

    partial = (seq * num_q_heads + heads) * num_splits + split  # [GROUP_PAD]
    tl.store(max_ptr + partial, m, mask=real)
    tl.store(sum_ptr + partial, total, mask=real)
    tl.store(acc_ptr + partial[:, None] * HEAD_DIM + dims[None, :], acc, mask=q_mask)
    ### END SOLUTION


@triton.jit
def merge_splits_kernel(
    out_ptr, max_ptr, sum_ptr, acc_ptr, stride_out_seq, stride_out_head, num_splits,
    HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr,
):
    """Program (seq, query head): merge its ``num_splits`` partials into the output row;
    where every split is empty (a sequence of length 0), the row is zeros."""
    ### BEGIN SOLUTION
    seq = tl.program_id(0)
    head = tl.program_id(1)
    num_q_heads = tl.num_programs(1)
    splits = tl.arange(0, SPLITS_PAD)
    live = splits < num_splits
    dims = tl.arange(0, HEAD_PAD)
    in_head = dims < HEAD_DIM

    partial = (seq * num_q_heads + head) * num_splits + splits
    m = tl.load(max_ptr + partial, mask=live, other=float("-inf"))
    total = tl.load(sum_ptr + partial, mask=live, other=0.0)
    acc = tl.load(acc_ptr + partial[:, None] * HEAD_DIM + dims[None, :],
                  mask=live[:, None] & in_head[None, :], other=0.0)
    top = tl.max(m, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)  # every split empty: weights all 0
    weight = tl.exp(m - top)  # an empty split: e^(-inf) = 0
    denominator = tl.sum(weight * total, axis=0)
    out = tl.sum(weight[:, None] * acc, axis=0) / tl.where(denominator > 0, denominator, 1.0)
    tl.store(out_ptr + seq * stride_out_seq + head * stride_out_head + dims,
             out.to(out_ptr.dtype.element_ty), mask=in_head)
    ### END SOLUTION


def run_on_grid(kernel, grid: tuple[int, ...], *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)``; a kernel whose body is not written yet (it raises
    ``NotImplementedError``, which the interpreter wraps and a GPU compiler refuses) raises
    ``NotImplementedError``, as an unwritten Python function does."""
    try:
        kernel[grid](*args, **kwargs)
    except NotImplementedError:
        raise
    except Exception as exc:
        if "NotImplementedError" not in f"{type(exc).__name__}: {exc}":
            raise
        name = getattr(kernel, "__name__", "this kernel")
        raise NotImplementedError(f"{name} is not written yet") from exc


def head_pad(head_dim: int) -> int:
    """HEAD_PAD: the head dimension rounded up to a power of two (``tl.arange`` needs one),
    at least 16 (``tl.dot`` reduces Q.K^T over it, and NVIDIA GPUs need K >= 16 for 16-bit
    inputs). Head size 80 -> 128, 64 -> 64, 8 -> 16."""
    return max(16, triton.next_power_of_2(head_dim))


def table_layout(block_tables: torch.Tensor, seq_lens: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``block_tables`` and ``seq_lens`` as the kernels read them: a table row's entries
    adjacent (the kernels are given the row stride only) and the lengths contiguous; copies
    where they are not (a few bytes per sequence), the inputs themselves where they are."""
    if block_tables.dim() == 2 and block_tables.shape[1] > 1 and block_tables.stride(1) != 1:
        block_tables = block_tables.contiguous()
    return block_tables, seq_lens.contiguous()


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_blocks: int,
                      device: torch.device) -> int:
    """How many splits per sequence on ``device``: 1 off a GPU, else ``splits_for`` its
    multiprocessor count."""
    if device.type != "cuda":
        return 1
    multiprocessors = torch.cuda.get_device_properties(device).multi_processor_count
    return splits_for(num_seqs * num_kv_heads, multiprocessors, max_blocks)


def splits_for(programs: int, multiprocessors: int, max_blocks: int) -> int:
    """Enough splits for about two programs per multiprocessor, each with at least
    ``MIN_BLOCKS_PER_SPLIT`` blocks; 1 when the batch alone fills the GPU."""
    if programs >= multiprocessors:
        return 1
    wanted = triton.cdiv(2 * multiprocessors, programs)
    return max(1, min(wanted, max_blocks // MIN_BLOCKS_PER_SPLIT))


def run_split_kernel(kernel, query: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                     scale: float, num_splits: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch a split kernel on (num_seqs, num_kv_heads, num_splits) programs; return the
    partials (m, l, acc): fp32, contiguous, [num_seqs, num_q_heads, num_splits] (and
    [..., head_dim] for acc), filled by the kernel."""
    query = query.contiguous()
    block_tables, seq_lens = table_layout(block_tables, seq_lens)
    num_seqs, num_q_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    # NaN until the kernel stores a partial: one it never stores (a split with no block to
    # cover still stores m = -inf, l = 0, acc = 0) shows, rather than whatever memory held
    partial_max = torch.full((num_seqs, num_q_heads, num_splits), float("nan"),
                             dtype=torch.float32, device=query.device)
    partial_sum = torch.full_like(partial_max, float("nan"))
    partial_acc = torch.full((num_seqs, num_q_heads, num_splits, head_dim), float("nan"),
                             dtype=torch.float32, device=query.device)
    run_on_grid(
        kernel, (num_seqs, num_kv_heads, num_splits),
        partial_max, partial_sum, partial_acc, query, k_cache, v_cache, block_tables,
        seq_lens, scale,
        query.stride(0), query.stride(1), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), block_tables.stride(0), triton.cdiv(block_tables.shape[1], num_splits),
        GROUP=group, GROUP_PAD=triton.next_power_of_2(group), BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim, HEAD_PAD=head_pad(head_dim),
    )
    return partial_max, partial_sum, partial_acc


def run_merge_kernel(kernel, partial_max: torch.Tensor, partial_sum: torch.Tensor,
                     partial_acc: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Launch a merge kernel on (num_seqs, num_q_heads) programs; return the output."""
    num_seqs, num_q_heads, num_splits, head_dim = partial_acc.shape
    out = torch.empty(num_seqs, num_q_heads, head_dim, dtype=dtype, device=partial_acc.device)
    run_on_grid(
        kernel, (num_seqs, num_q_heads),
        out, partial_max, partial_sum, partial_acc, out.stride(0), out.stride(1), num_splits,
        HEAD_DIM=head_dim, HEAD_PAD=head_pad(head_dim),
        SPLITS_PAD=triton.next_power_of_2(num_splits),
    )
    return out


def run_split_kv(split_kernel, merge_kernel, query: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                 scale: float, num_splits: int) -> torch.Tensor:
    """Split-KV decode attention: the split kernel on (num_seqs, num_kv_heads, num_splits)
    programs, then the merge kernel on (num_seqs, num_q_heads); returns the output in the
    query's dtype."""
    partials = run_split_kernel(split_kernel, query, k_cache, v_cache, block_tables, seq_lens,
                                scale, num_splits)
    return run_merge_kernel(merge_kernel, *partials, query.dtype)
