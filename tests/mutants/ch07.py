"""Wrong chapter 7 kernels and wrappers: each is the reference with one mistake learners
make, and the hint it must get. ``RULES``: each rule the notebook states about a TODO, with
the mutants that break it alone.

A Triton kernel is compiled from its source file, so each mutant is written to a file of its
own (the reference's source with one edit) and imported from there.
"""

from __future__ import annotations

import torch

from course.notebook.paged_cases import on_gpu
from kernels import paged_attention as final
from kernels import paged_attention_steps as steps
from kernels import split_kv
from kernels.split_kv import run_split_kv
from mutants import Rule, kernel_mutant


def _skips_validation(query, k_cache, v_cache, block_tables, seq_lens, scale, num_splits=None,
                      validate=True):
    return final.paged_attention(query, k_cache, v_cache, block_tables, seq_lens, scale,
                                 num_splits, validate=False)


def _bf16_on_the_interpreter(query, k_cache, v_cache, block_tables, seq_lens, scale,
                             num_splits=None, validate=True):
    if validate:
        final.validate_inputs(query, k_cache, v_cache, block_tables, seq_lens, scale,
                              num_splits)
    if num_splits and num_splits > 1:
        return run_split_kv(final.split_kv_kernel, final.merge_splits_kernel, query, k_cache,
                            v_cache, block_tables, seq_lens, scale, num_splits)
    return final.launch(final.paged_attention_kernel, query, k_cache, v_cache, block_tables,
                        seq_lens, scale)


def _never_splits(query, k_cache, v_cache, block_tables, seq_lens, scale, num_splits=None,
                  validate=True):
    """Validates, upcasts bf16 on the interpreter, but always takes the one-pass kernel."""
    if validate:
        final.validate_inputs(query, k_cache, v_cache, block_tables, seq_lens, scale,
                              num_splits)
    if query.dtype == torch.bfloat16 and final.interpreted():
        return _never_splits(query.float(), k_cache.float(), v_cache.float(), block_tables,
                             seq_lens, scale, num_splits, validate=False).bfloat16()
    return final.launch(final.paged_attention_kernel, query, k_cache, v_cache, block_tables,
                        seq_lens, scale)


def _head_dim_strides_accepted(query, k_cache, v_cache, block_tables, seq_lens, scale,
                               num_splits=None, validate=True):
    """Validates everything but the caches' head-dimension stride."""
    if validate and k_cache.dim() == 4 and k_cache.stride(3) != 1 and \
            k_cache.stride() == v_cache.stride():
        contiguous = k_cache.contiguous()
        final.validate_inputs(query, contiguous, v_cache.contiguous(), block_tables, seq_lens,
                              scale, num_splits)
        validate = False
    return final.paged_attention(query, k_cache, v_cache, block_tables, seq_lens, scale,
                                 num_splits, validate=validate)


def _unchecked_block_ids(query, k_cache, v_cache, block_tables, seq_lens, scale,
                         num_splits=None, validate=True):
    """Validates everything but the block ids' range."""
    if validate:
        safe = block_tables.clamp(0, max(k_cache.shape[0] - 1, 0)) \
            if isinstance(block_tables, torch.Tensor) and isinstance(k_cache, torch.Tensor) \
            and k_cache.dim() == 4 and not block_tables.is_floating_point() else block_tables
        final.validate_inputs(query, k_cache, v_cache, safe, seq_lens, scale, num_splits)
    return final.paged_attention(query, k_cache, v_cache, block_tables, seq_lens, scale,
                                 num_splits, validate=False)


def _attributes_first(query, k_cache, v_cache, block_tables, seq_lens, scale, num_splits=None,
                      validate=True):
    """Reads seq_lens.shape before checking the types."""
    if validate:
        seq_lens.shape  # noqa: B018 - an AttributeError on a list
    return final.paged_attention(query, k_cache, v_cache, block_tables, seq_lens, scale,
                                 num_splits, validate=validate)


def _head_counts_unchecked(query, k_cache, v_cache, block_tables, seq_lens, scale,
                           num_splits=None, validate=True):
    """Validates every shape but whether num_q_heads is a multiple of num_kv_heads."""
    if validate:
        checked = query
        if isinstance(query, torch.Tensor) and isinstance(k_cache, torch.Tensor) and \
                query.dim() == 3 and k_cache.dim() == 4:
            whole = query.shape[1] // k_cache.shape[2] * k_cache.shape[2]
            checked = query[:, :whole] if whole else query
        final.validate_inputs(checked, k_cache, v_cache, block_tables, seq_lens, scale,
                              num_splits)
    return final.paged_attention(query, k_cache, v_cache, block_tables, seq_lens, scale,
                                 num_splits, validate=False)


def _dtypes_unchecked(query, k_cache, v_cache, block_tables, seq_lens, scale, num_splits=None,
                      validate=True):
    """Validates everything but the dtypes."""
    if validate:
        floats = [t.float() if isinstance(t, torch.Tensor) else t
                  for t in (query, k_cache, v_cache)]
        ints = [t.long() if isinstance(t, torch.Tensor) else t for t in (block_tables, seq_lens)]
        final.validate_inputs(*floats, *ints, scale, num_splits)
    return final.paged_attention(query, k_cache, v_cache, block_tables, seq_lens, scale,
                                 num_splits, validate=False)


def _devices_unchecked(query, k_cache, v_cache, block_tables, seq_lens, scale,
                       num_splits=None, validate=True):
    """Validates everything but the devices: a tensor elsewhere is checked as zeros beside
    the query."""
    if validate:
        here = [torch.zeros_like(t, device=query.device)
                if isinstance(t, torch.Tensor) and isinstance(query, torch.Tensor)
                and t.device != query.device else t
                for t in (k_cache, v_cache, block_tables, seq_lens)]
        final.validate_inputs(query, *here, scale, num_splits)
    return final.paged_attention(query, k_cache, v_cache, block_tables, seq_lens, scale,
                                 num_splits, validate=False)


def _lengths_unchecked(query, k_cache, v_cache, block_tables, seq_lens, scale,
                       num_splits=None, validate=True):
    """Validates everything but the lengths' range."""
    if validate:
        checked = seq_lens
        if all(isinstance(t, torch.Tensor) for t in (k_cache, block_tables, seq_lens)) and \
                k_cache.dim() == 4 and block_tables.dim() == 2 and \
                not seq_lens.is_floating_point():
            checked = seq_lens.clamp(0, block_tables.shape[1] * k_cache.shape[1])
        final.validate_inputs(query, k_cache, v_cache, block_tables, checked, scale,
                              num_splits)
    return final.paged_attention(query, k_cache, v_cache, block_tables, seq_lens, scale,
                                 num_splits, validate=False)


def _whole_rows_checked(query, k_cache, v_cache, block_tables, seq_lens, scale,
                        num_splits=None, validate=True):
    """Validates, then refuses a block id outside the pool anywhere in a row, the padding
    past a sequence's blocks too."""
    if validate:
        final.validate_inputs(query, k_cache, v_cache, block_tables, seq_lens, scale,
                              num_splits)
        covered = block_tables.shape[1] * k_cache.shape[1]
        final.validate_inputs(query, k_cache, v_cache, block_tables,
                              torch.full_like(seq_lens, covered), scale, num_splits)
    return final.paged_attention(query, k_cache, v_cache, block_tables, seq_lens, scale,
                                 num_splits, validate=False)


def _views_refused(query, k_cache, v_cache, block_tables, seq_lens, scale, num_splits=None,
                   validate=True):
    """Refuses caches that are not contiguous, then validates."""
    if validate and isinstance(k_cache, torch.Tensor) and isinstance(v_cache, torch.Tensor) \
            and not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous")
    return final.paged_attention(query, k_cache, v_cache, block_tables, seq_lens, scale,
                                 num_splits, validate=validate)


def _returns_float32(query, k_cache, v_cache, block_tables, seq_lens, scale, num_splits=None,
                     validate=True):
    """Validates, then computes every dtype in float32 and returns that."""
    if validate:
        final.validate_inputs(query, k_cache, v_cache, block_tables, seq_lens, scale,
                              num_splits)
    return final.paged_attention(query.float(), k_cache.float(), v_cache.float(), block_tables,
                                 seq_lens, scale, num_splits, validate=False)


_WRAPPER = [(_skips_validation, "expected TypeError"),
            (_never_splits, "without launching any grid of num_splits"),
            (_head_dim_strides_accepted, "head dimension is contiguous"),
            (_unchecked_block_ids, "names a block of the pool"),
            (_attributes_first, "types are checked before any attribute"),
            (_head_counts_unchecked, "num_q_heads is a multiple of num_kv_heads"),
            (_dtypes_unchecked, "share one float dtype"),
            (_devices_unchecked, "every tensor is on one device"),
            (_lengths_unchecked, "what a table row covers"),
            (_whole_rows_checked, "the rest of a row is padding and never read"),
            (_views_refused, "the kernel is given the caches' block, token and head strides"),
            (_returns_float32, "the output is in the query's dtype")]
if not on_gpu():  # a GPU computes in bf16: only the interpreter needs the upcast
    _WRAPPER.append((_bf16_on_the_interpreter, "no bf16 arithmetic"))

_LOOP = "for index in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):"
_BLOCK = "block = tl.load(block_tables_ptr + seq * stride_table_seq + index).to(tl.int64)"

MUTANTS = {
    "one_block_kernel": [
        (kernel_mutant(steps.one_block_kernel, "no_scale", "axis=1) * scale", "axis=1)"),
         "without the scale"),
        (kernel_mutant(steps.one_block_kernel, "head_padding_stored",
                 "out.to(out_ptr.dtype.element_ty), mask=in_head)",
                 "out.to(out_ptr.dtype.element_ty))"), "columns past HEAD_DIM"),
        (kernel_mutant(steps.one_block_kernel, "one_block_kv_head_modulo",
                       "kv_head = head // GROUP", "kv_head = head % (tl.num_programs(1) // GROUP)"),
         "h % num_kv_heads"),
        (kernel_mutant(steps.one_block_kernel, "one_block_row_stride_missing",
                 "block_tables_ptr + seq * stride_table_seq", "block_tables_ptr + seq"),
         "stride_table_seq entries in"),
        (kernel_mutant(steps.one_block_kernel, "float16_arithmetic", ".to(tl.float32)", "",
                       times=3),
         "float16 arithmetic keeps about three significant digits"),
        (kernel_mutant(steps.one_block_kernel, "max_not_subtracted",
                 "tl.exp(scores - tl.max(scores, axis=0))", "tl.exp(scores)"),
         "unless the largest score is subtracted first"),
    ],
    "block_loop_kernel": [
        (kernel_mutant(steps.block_loop_kernel, "loop_without_rescaling",
                 "acc = acc * rescale +", "acc = acc +"), "rescales the running sum but not"),
        (kernel_mutant(steps.block_loop_kernel, "loop_row_stride_missing",
                 "block_tables_ptr + seq * stride_table_seq + index",
                 "block_tables_ptr + index"), "sequence 0's blocks"),
        (kernel_mutant(steps.block_loop_kernel, "loop_one_short",
                 "range(0, seq_len // BLOCK_SIZE)", "range(0, seq_len // BLOCK_SIZE - 1)"),
         "runs one block short"),
        (kernel_mutant(steps.block_loop_kernel, "loop_one_too_many",
                 "range(0, seq_len // BLOCK_SIZE)", "range(0, seq_len // BLOCK_SIZE + 1)"),
         "one block too many"),
        (kernel_mutant(steps.block_loop_kernel, "running_max_from_zero", 'm = float("-inf")',
                 "m = 0.0"), "the running max starts at -inf, not 0"),
        (kernel_mutant(steps.block_loop_kernel, "physical_blocks", "kv_offsets = (block *",
                 "kv_offsets = (index *"), "physical block j"),
    ],
    "gqa_kernel": [
        (kernel_mutant(steps.gqa_kernel, "heads_interleaved", "heads = kv_head * GROUP + rows",
                 "heads = kv_head + rows * tl.num_programs(1)"), "h % num_kv_heads"),
        (kernel_mutant(steps.gqa_kernel, "gqa_group_masked_by_all_heads", "real = rows < GROUP",
                 "real = heads < GROUP * tl.num_programs(1)"), "padding rows past GROUP"),
    ],
    "paged_attention_kernel": [
        (kernel_mutant(final.paged_attention_kernel, "tail_not_masked",
                 "kv_mask = valid[:, None] & in_head[None, :]", "kv_mask = in_head[None, :]"),
         "NaN x 0 is still NaN"),
        (kernel_mutant(final.paged_attention_kernel, "no_online_rescaling",
                 "total = total * rescale +", "total = total +"),
         "rescales the accumulator but not the running sum"),
        (kernel_mutant(final.paged_attention_kernel, "query_heads_strided",
                 "heads = kv_head * GROUP + rows", "heads = kv_head + rows * tl.num_programs(1)"),
         "h % num_kv_heads"),
        (kernel_mutant(final.paged_attention_kernel, "table_row_stride_missing",
                 "block_tables_ptr + seq * stride_table_seq + index",
                 "block_tables_ptr + index"), "sequence 0's blocks"),
        (kernel_mutant(final.paged_attention_kernel, "one_block_short", _LOOP,
                 "for index in range(0, tl.cdiv(seq_len, BLOCK_SIZE) - 1):"),
         "runs one block short"),
        (kernel_mutant(final.paged_attention_kernel, "one_block_too_many", _LOOP,
                 "for index in range(0, tl.cdiv(seq_len, BLOCK_SIZE) + 1):"),
         "outside the entries it needs"),
        (kernel_mutant(final.paged_attention_kernel, "tail_dropped", _LOOP,
                 "for index in range(0, seq_len // BLOCK_SIZE):"), "whole blocks only"),
        (kernel_mutant(final.paged_attention_kernel, "group_masked_by_all_heads",
                 "real = rows < GROUP", "real = heads < GROUP * tl.num_programs(1)"),
         "padding rows past GROUP"),
        (kernel_mutant(final.paged_attention_kernel, "empty_sequence_nan",
                 "out = acc / tl.where(total > 0, total, 1.0)[:, None]",
                 "out = acc / total[:, None]"), "has length 0 and got NaN"),
        (kernel_mutant(final.paged_attention_kernel, "block_id_int32", _BLOCK,
                 "block = tl.load(block_tables_ptr + seq * stride_table_seq + index)"),
         "wraps once the pool holds more than 2^31 elements"),
        (kernel_mutant(final.paged_attention_kernel, "tail_scores_not_masked",
                 'scores = tl.where(valid[None, :], scores, float("-inf"))', ""),
         "is off by up to"),
        (kernel_mutant(final.paged_attention_kernel, "rows_unmasked", "real = rows < GROUP",
                 "real = rows < GROUP_PAD"), "padding rows past GROUP"),
        (kernel_mutant(final.paged_attention_kernel, "pool_assumed_contiguous",
                 "block * stride_kv_block", "block * BLOCK_SIZE * stride_kv_token"),
         "address the caches with the strides the kernel is given"),
    ],
    "split_kv_kernel": [
        (kernel_mutant(split_kv.split_kv_kernel, "split_not_clipped",
                 "last = tl.minimum(first + blocks_per_split, tl.cdiv(seq_len, BLOCK_SIZE))",
                 "last = tl.minimum(first + blocks_per_split, seq_len // BLOCK_SIZE + 1)"),
         "outside the entries it needs"),
        (kernel_mutant(split_kv.split_kv_kernel, "split_normalised",
                 "tl.store(acc_ptr + partial[:, None] * HEAD_DIM + dims[None, :], acc,",
                 "tl.store(acc_ptr + partial[:, None] * HEAD_DIM + dims[None, :], "
                 "acc / total[:, None],"), "acc is stored undivided"),
        (kernel_mutant(split_kv.split_kv_kernel, "split_stores_nothing_when_empty",
                 "tl.store(max_ptr + partial, m, mask=real)",
                 "if first < last:  # a split with no block stores nothing\n"
                 "        tl.store(max_ptr + partial, m, mask=real)"),
         "an empty range still stores its partial"),
        (kernel_mutant(split_kv.split_kv_kernel, "split_ranges_overlap",
                 "last = tl.minimum(first + blocks_per_split,",
                 "last = tl.minimum(first + blocks_per_split + 1,"),
         "outside the entries it needs"),
        (kernel_mutant(split_kv.split_kv_kernel, "split_heads_miscounted",
                 "num_q_heads = tl.num_programs(1) * GROUP", "num_q_heads = tl.num_programs(1)"),
         "belongs to another program"),
        (kernel_mutant(split_kv.split_kv_kernel, "split_acc_padding_stored", "acc, mask=q_mask)",
                 "acc, mask=real[:, None])"), "columns past HEAD_DIM"),
        (kernel_mutant(split_kv.split_kv_kernel, "split_block_id_int32", _BLOCK,
                 "block = tl.load(block_tables_ptr + seq * stride_table_seq + index)"),
         "wraps once the pool holds more than 2^31 elements"),
    ],
    "merge_splits_kernel": [
        (kernel_mutant(split_kv.merge_splits_kernel, "merge_without_rescaling",
                 "weight = tl.exp(m - top)", "weight = tl.where(live, 1.0, 0.0)"),
         "without rescaling"),
        (kernel_mutant(split_kv.merge_splits_kernel, "merge_empty_nan",
                 "top = tl.where(top == float(\"-inf\"), 0.0, top)", ""),
         "whose splits are all empty"),
        (kernel_mutant(split_kv.merge_splits_kernel, "merge_padding_stored",
                 "out.to(out_ptr.dtype.element_ty), mask=in_head)",
                 "out.to(out_ptr.dtype.element_ty))"), "columns past HEAD_DIM"),
        (kernel_mutant(split_kv.merge_splits_kernel, "merge_reads_past_splits",
                 "live = splits < num_splits", "live = splits <= num_splits"),
         "disagrees with the merged softmax"),
    ],
    "paged_attention": _WRAPPER,
}

_PADDING = ("every load and store of a head's elements carries the mask `dims < HEAD_DIM`: "
            "padding columns load as 0 (they add nothing to q . k) and are never stored (they "
            "would land in the next head's row)")
_ROW_STRIDE = "block_tables [num_seqs, max_blocks] a row's stride may exceed its length"
_RESCALE = ("For each block, with `m_new = max(m, max(scores))`, rescale what you have by "
            "`exp(m - m_new)` and add the block's `exp(scores - m_new)` terms.")
_GROUP = "program `(seq, g)` loads query heads `g x GROUP ... g x GROUP + GROUP - 1`"
_INT64 = ("Cast the block number to int64 before multiplying: a pool of a few GiB has more "
          "than 2^31 elements, and an int32 product would wrap to a wrong address.")

RULES = [
    Rule(_PADDING, "one_block_kernel", ("head_padding_stored",)),
    Rule("the block's keys and values for KV head `head // GROUP`", "one_block_kernel",
         ("one_block_kv_head_modulo",)),
    Rule(_ROW_STRIDE, "one_block_kernel", ("one_block_row_stride_missing",)),
    Rule("scores `scale x (q . k)`", "one_block_kernel", ("no_scale",)),
    Rule("subtract the max, exponentiate, normalise, and sum the weighted values",
         "one_block_kernel", ("max_not_subtracted",)),
    Rule("Compute in fp32 (`.to(tl.float32)`)", "one_block_kernel", ("float16_arithmetic",)),

    Rule("reading block number `block_tables[seq, index]`", "block_loop_kernel",
         ("physical_blocks",)),
    Rule("(row `seq` starts at `seq * stride_table_seq`)", "block_loop_kernel",
         ("loop_row_stride_missing",)),
    Rule(_RESCALE, "block_loop_kernel", ("loop_without_rescaling",)),
    Rule("Start `m` at `-inf` and `l` at 0; divide at the end.", "block_loop_kernel",
         ("running_max_from_zero",)),
    Rule("The loop reads exactly the table entries the sequence uses: a row may end right "
         "after them, and the checks notice a read one entry too far.", "block_loop_kernel",
         ("loop_one_short", "loop_one_too_many")),

    Rule(_GROUP, "gqa_kernel", ("heads_interleaved",)),
    Rule("(rows past GROUP masked to zero, and never stored: they are the next group's heads)",
         "gqa_kernel", ("gqa_group_masked_by_all_heads",)),

    Rule("Loop over `tl.cdiv(seq_len, BLOCK_SIZE)` blocks", "paged_attention_kernel",
         ("tail_dropped", "one_block_short")),
    Rule("table entries past the sequence's blocks are never read", "paged_attention_kernel",
         ("one_block_too_many",)),
    Rule("load K and V with `mask=valid[:, None] & in_head[None, :], other=0.0` (garbage must "
         "never reach the arithmetic: NaN x 0 is still NaN)", "paged_attention_kernel",
         ("tail_not_masked",)),
    Rule("set the invalid scores to `-inf` with `tl.where` so they get zero weight",
         "paged_attention_kernel", ("tail_scores_not_masked",)),
    Rule("A sequence of length 0 runs no iteration: its `l` stays 0 and its output is zeros "
         "(as vLLM's reference returns), not 0 / 0.", "paged_attention_kernel",
         ("empty_sequence_nan",)),
    Rule(_INT64, "paged_attention_kernel", ("block_id_int32",)),
    Rule(_RESCALE, "paged_attention_kernel", ("no_online_rescaling",)),
    Rule(_GROUP, "paged_attention_kernel", ("query_heads_strided",)),
    Rule("Rows past `GROUP` are masked the same way.", "paged_attention_kernel",
         ("group_masked_by_all_heads", "rows_unmasked")),
    Rule(_ROW_STRIDE, "paged_attention_kernel", ("table_row_stride_missing",)),
    Rule("Token t of sequence `seq`, KV head g, element d is at `block_tables[seq, t // "
         "BLOCK_SIZE] * stride_kv_block + (t % BLOCK_SIZE) * stride_kv_token + g * "
         "stride_kv_head + d`.", "paged_attention_kernel", ("pool_assumed_contiguous",)),

    Rule("covers blocks `[split x blocks_per_split, (split + 1) x blocks_per_split)`",
         "split_kv_kernel", ("split_ranges_overlap",)),
    Rule("clipped to `tl.cdiv(seq_len, BLOCK_SIZE)`", "split_kv_kernel",
         ("split_not_clipped",)),
    Rule("a split past the sequence's end covers nothing and must still store "
         "`m = -inf, l = 0, acc = 0`", "split_kv_kernel", ("split_stores_nothing_when_empty",)),
    Rule("writing its partial `(m, l, acc)` (acc not yet divided)", "split_kv_kernel",
         ("split_normalised",)),
    Rule("query head h's partial of split s is at `(seq x num_q_heads + h) x num_splits + s`, "
         "where `num_q_heads = tl.num_programs(1) x GROUP`", "split_kv_kernel",
         ("split_heads_miscounted",)),
    Rule("(and `[..., HEAD_DIM]` for acc: store only the real columns)", "split_kv_kernel",
         ("split_acc_padding_stored",)),
    Rule(_INT64, "split_kv_kernel", ("split_block_id_int32",)),

    Rule("load the `num_splits` partials (a `SPLITS_PAD`-long tile, masked past "
         "`num_splits`)", "merge_splits_kernel", ("merge_reads_past_splits",)),
    Rule("take `M = max(m)`, and return `sum(e^(m - M) acc) / sum(e^(m - M) l)`",
         "merge_splits_kernel", ("merge_without_rescaling",)),
    Rule("When every split is empty (a sequence of length 0), `M = -inf` and `e^(m - M)` is "
         "NaN: that row is zeros.", "merge_splits_kernel", ("merge_empty_nan",)),
    Rule(_PADDING, "merge_splits_kernel", ("merge_padding_stored",)),

    Rule("`TypeError` before any attribute is read: the five tensors are `torch.Tensor`s (a "
         "list for `seq_lens` is refused, not an `AttributeError`)", "paged_attention",
         ("_attributes_first",)),
    Rule("num_q_heads a multiple of num_kv_heads", "paged_attention",
         ("_head_counts_unchecked",)),
    Rule("`TypeError` for dtypes: query float32, float16 or bfloat16, the caches the same "
         "dtype; block_tables and seq_lens int32 or int64.", "paged_attention",
         ("_dtypes_unchecked",)),
    Rule("`ValueError` for devices: one device for all", "paged_attention",
         ("_devices_unchecked",)),
    Rule("`ValueError` for layout: k_cache and v_cache share strides, with `stride(3) == 1`.",
         "paged_attention", ("_head_dim_strides_accepted",)),
    Rule("every length in `[0, max_blocks x block_size]`", "paged_attention",
         ("_lengths_unchecked",)),
    Rule("every block id a sequence uses (its first `cdiv(seq_len, block_size)` entries) in "
         "`[0, num_blocks)`", "paged_attention", ("_unchecked_block_ids",)),
    Rule("Entries past those are padding (vLLM pads with -1 or 0) and are never read.",
         "paged_attention", ("_whole_rows_checked",)),
    Rule("caches that are views such as vLLM's `kv[:, 0]`", "paged_attention",
         ("_views_refused",)),
    Rule("validates unless `validate=False`", "paged_attention", ("_skips_validation",)),
    Rule("or `run_split_kv(split_kv_kernel, merge_splits_kernel, query, k_cache, v_cache, "
         "block_tables, seq_lens, scale, num_splits)` when it is more", "paged_attention",
         ("_never_splits",)),
    Rule("Both return a new tensor shaped and typed like `query`.", "paged_attention",
         ("_returns_float32",)),
]
if not on_gpu():  # the mutant that breaks it is the interpreter's alone
    RULES.append(Rule("on the interpreter, upcasts bf16 to fp32 (the interpreter has no bf16 "
                      "arithmetic) and casts the result back", "paged_attention",
                      ("_bf16_on_the_interpreter",)))
