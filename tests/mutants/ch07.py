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

from autograder.checks.ch07 import on_gpu
from kernels import paged_attention as final
from kernels import paged_attention_steps as steps
from kernels import split_kv

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


def _skips_validation(query, k_cache, v_cache, block_tables, seq_lens, scale, num_splits=None):
    return final.launch(final.paged_attention_kernel, query, k_cache, v_cache, block_tables,
                        seq_lens, scale)


def _bf16_on_the_interpreter(query, k_cache, v_cache, block_tables, seq_lens, scale,
                             num_splits=None):
    final.validate_inputs(query, k_cache, v_cache, block_tables, seq_lens)
    return final.launch(final.paged_attention_kernel, query, k_cache, v_cache, block_tables,
                        seq_lens, scale)


_TAIL_LOADS = """        k = tl.load(k_cache_ptr + kv_offsets, mask=valid[:, None], other=0.0)
        v = tl.load(v_cache_ptr + kv_offsets, mask=valid[:, None], other=0.0)
"""
_WRAPPER = [(_skips_validation, "expected TypeError")]
if not on_gpu():  # a GPU computes in bf16: only the interpreter needs the upcast
    _WRAPPER.append((_bf16_on_the_interpreter, "upcast bf16"))

MUTANTS = {
    "one_block_kernel": [
        (_mutant(steps.one_block_kernel, "no_scale", "axis=1) * scale", "axis=1)"),
         "without the scale"),
    ],
    "block_loop_kernel": [
        (_mutant(steps.block_loop_kernel, "loop_without_rescaling",
                 "acc = acc * rescale +", "acc = acc +"), "rescale the running sum"),
    ],
    "gqa_kernel": [
        (_mutant(steps.gqa_kernel, "heads_interleaved", "heads = kv_head * GROUP + rows",
                 "heads = kv_head + rows * tl.num_programs(1)"), "h % num_kv_heads"),
    ],
    "paged_attention_kernel": [
        (_mutant(final.paged_attention_kernel, "tail_not_masked", _TAIL_LOADS,
                 "        k = tl.load(k_cache_ptr + kv_offsets)\n"
                 "        v = tl.load(v_cache_ptr + kv_offsets)\n"), "Mask the tail"),
        (_mutant(final.paged_attention_kernel, "no_online_rescaling",
                 "total = total * rescale +", "total = total +"), "rescale the running sum"),
        (_mutant(final.paged_attention_kernel, "query_heads_strided",
                 "heads = kv_head * GROUP + rows", "heads = kv_head + rows * tl.num_programs(1)"),
         "h % num_kv_heads"),
        (_mutant(final.paged_attention_kernel, "table_row_stride_missing",
                 "block_tables_ptr + seq * stride_table_seq + index",
                 "block_tables_ptr + index"), "Sequence 0 is right and later ones are not"),
    ],
    "split_kv_kernel": [
        (_mutant(split_kv.split_kv_kernel, "split_not_clipped",
                 "last = tl.minimum(first + blocks_per_split, tl.cdiv(seq_len, BLOCK_SIZE))",
                 "last = tl.minimum(first + blocks_per_split, seq_len // BLOCK_SIZE + 1)"),
         "Clip the split's block range"),
        (_mutant(split_kv.split_kv_kernel, "split_normalised",
                 "tl.store(acc_ptr + partial[:, None] * HEAD_DIM + dims[None, :], acc,",
                 "tl.store(acc_ptr + partial[:, None] * HEAD_DIM + dims[None, :], "
                 "acc / total[:, None],"), "store acc undivided"),
    ],
    "merge_splits_kernel": [
        (_mutant(split_kv.merge_splits_kernel, "merge_without_rescaling",
                 "weight = tl.exp(m - tl.max(m, axis=0))", "weight = tl.where(live, 1.0, 0.0)"),
         "without rescaling"),
    ],
    "paged_attention": _WRAPPER,
}
