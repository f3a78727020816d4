"""Wrong chapter 7 kernels: each is the reference with one mistake learners make, and the
hint it must get.

A Triton kernel is compiled from its source file, so each mutant is written to a file of its
own (the reference's source with one edit) and imported from there.
"""

from __future__ import annotations

import importlib.util
import inspect
import tempfile
import textwrap
from pathlib import Path

import torch

from autograder.checks.ch07 import on_gpu
from kernels import paged_attention as final
from kernels import paged_attention_steps as steps
from kernels import split_kv
from kernels.split_kv import run_split_kv

_FOLDER = Path(tempfile.mkdtemp(prefix="ch07-mutants-"))


def _mutant(kernel, name: str, old: str, new: str):
    """``kernel`` with ``old`` (which must occur once) replaced by ``new``, renamed ``name``."""
    source = textwrap.dedent(inspect.getsource(kernel.fn))
    assert source.count(old) == 1, f"{old!r} is not in {kernel.__name__} exactly once"
    source = source.replace(old, new).replace(f"def {kernel.__name__}(", f"def {name}(")
    path = _FOLDER / f"{name}.py"
    path.write_text("import triton\nimport triton.language as tl\n\n\n" + source)
    spec = importlib.util.spec_from_file_location(f"ch07_mutants.{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


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


_WRAPPER = [(_skips_validation, "expected TypeError"),
            (_never_splits, "without launching any grid of num_splits"),
            (_head_dim_strides_accepted, "head dimension is contiguous"),
            (_unchecked_block_ids, "names a block of the pool"),
            (_attributes_first, "types are checked before any attribute")]
if not on_gpu():  # a GPU computes in bf16: only the interpreter needs the upcast
    _WRAPPER.append((_bf16_on_the_interpreter, "no bf16 arithmetic"))

_LOOP = "for index in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):"
_BLOCK = "block = tl.load(block_tables_ptr + seq * stride_table_seq + index).to(tl.int64)"

MUTANTS = {
    "one_block_kernel": [
        (_mutant(steps.one_block_kernel, "no_scale", "axis=1) * scale", "axis=1)"),
         "without the scale"),
        (_mutant(steps.one_block_kernel, "head_padding_stored",
                 "out.to(out_ptr.dtype.element_ty), mask=in_head)",
                 "out.to(out_ptr.dtype.element_ty))"), "columns past HEAD_DIM"),
    ],
    "block_loop_kernel": [
        (_mutant(steps.block_loop_kernel, "loop_without_rescaling",
                 "acc = acc * rescale +", "acc = acc +"), "rescales the running sum but not"),
        (_mutant(steps.block_loop_kernel, "loop_row_stride_missing",
                 "block_tables_ptr + seq * stride_table_seq + index",
                 "block_tables_ptr + index"), "sequence 0's blocks"),
        (_mutant(steps.block_loop_kernel, "loop_one_short",
                 "range(0, seq_len // BLOCK_SIZE)", "range(0, seq_len // BLOCK_SIZE - 1)"),
         "runs one block short"),
        (_mutant(steps.block_loop_kernel, "loop_one_too_many",
                 "range(0, seq_len // BLOCK_SIZE)", "range(0, seq_len // BLOCK_SIZE + 1)"),
         "one block too many"),
    ],
    "gqa_kernel": [
        (_mutant(steps.gqa_kernel, "heads_interleaved", "heads = kv_head * GROUP + rows",
                 "heads = kv_head + rows * tl.num_programs(1)"), "h % num_kv_heads"),
        (_mutant(steps.gqa_kernel, "group_masked_by_all_heads", "real = rows < GROUP",
                 "real = heads < GROUP * tl.num_programs(1)"), "padding rows past GROUP"),
    ],
    "paged_attention_kernel": [
        (_mutant(final.paged_attention_kernel, "tail_not_masked",
                 "kv_mask = valid[:, None] & in_head[None, :]", "kv_mask = in_head[None, :]"),
         "NaN x 0 is still NaN"),
        (_mutant(final.paged_attention_kernel, "no_online_rescaling",
                 "total = total * rescale +", "total = total +"),
         "rescales the accumulator but not the running sum"),
        (_mutant(final.paged_attention_kernel, "query_heads_strided",
                 "heads = kv_head * GROUP + rows", "heads = kv_head + rows * tl.num_programs(1)"),
         "h % num_kv_heads"),
        (_mutant(final.paged_attention_kernel, "table_row_stride_missing",
                 "block_tables_ptr + seq * stride_table_seq + index",
                 "block_tables_ptr + index"), "sequence 0's blocks"),
        (_mutant(final.paged_attention_kernel, "one_block_short", _LOOP,
                 "for index in range(0, tl.cdiv(seq_len, BLOCK_SIZE) - 1):"),
         "runs one block short"),
        (_mutant(final.paged_attention_kernel, "one_block_too_many", _LOOP,
                 "for index in range(0, tl.cdiv(seq_len, BLOCK_SIZE) + 1):"),
         "outside the entries it needs"),
        (_mutant(final.paged_attention_kernel, "tail_dropped", _LOOP,
                 "for index in range(0, seq_len // BLOCK_SIZE):"), "whole blocks only"),
        (_mutant(final.paged_attention_kernel, "group_masked_by_all_heads",
                 "real = rows < GROUP", "real = heads < GROUP * tl.num_programs(1)"),
         "padding rows past GROUP"),
        (_mutant(final.paged_attention_kernel, "empty_sequence_nan",
                 "out = acc / tl.where(total > 0, total, 1.0)[:, None]",
                 "out = acc / total[:, None]"), "has length 0 and got NaN"),
        (_mutant(final.paged_attention_kernel, "block_id_int32", _BLOCK,
                 "block = tl.load(block_tables_ptr + seq * stride_table_seq + index)"),
         "wraps once the pool holds more than 2^31 elements"),
    ],
    "split_kv_kernel": [
        (_mutant(split_kv.split_kv_kernel, "split_not_clipped",
                 "last = tl.minimum(first + blocks_per_split, tl.cdiv(seq_len, BLOCK_SIZE))",
                 "last = tl.minimum(first + blocks_per_split, seq_len // BLOCK_SIZE + 1)"),
         "outside the entries it needs"),
        (_mutant(split_kv.split_kv_kernel, "split_normalised",
                 "tl.store(acc_ptr + partial[:, None] * HEAD_DIM + dims[None, :], acc,",
                 "tl.store(acc_ptr + partial[:, None] * HEAD_DIM + dims[None, :], "
                 "acc / total[:, None],"), "acc is stored undivided"),
    ],
    "merge_splits_kernel": [
        (_mutant(split_kv.merge_splits_kernel, "merge_without_rescaling",
                 "weight = tl.exp(m - top)", "weight = tl.where(live, 1.0, 0.0)"),
         "without rescaling"),
        (_mutant(split_kv.merge_splits_kernel, "merge_empty_nan",
                 "top = tl.where(top == float(\"-inf\"), 0.0, top)", ""),
         "whose splits are all empty"),
    ],
    "paged_attention": _WRAPPER,
}
