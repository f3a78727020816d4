"""Compile chapter 7's kernels for NVIDIA GPUs ahead of time, on any machine.

Triton's interpreter runs a kernel as NumPy and accepts code that NVIDIA's compiler rejects
(a ``tl.dot`` under 16 rows, say). Compiling for a target needs no GPU, only the compiler
in Triton's wheel, so this checks on a CPU that every kernel builds to a cubin for the
shapes the benchmark runs::

    python -m kernels.compile_check            # every configuration, one line each (minutes)
    python -m kernels.compile_check --quick    # one shape per kernel and dtype (seconds)

It refuses to run with ``TRITON_INTERPRET=1`` (kernels would be defined as interpreted).
"""

from __future__ import annotations

import itertools
import os
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TARGETS = {"sm_80 (A100)": GPUTarget("cuda", 80, 32),
           "sm_90 (H100/H200)": GPUTarget("cuda", 90, 32)}
DTYPES = ("fp32", "fp16", "bf16")


def _signature(kernel, dtype: str, index_type: str) -> dict[str, str]:
    """Triton types for the kernel's arguments: pointers to ``dtype`` (fp32 for partials,
    ``index_type`` for tables and lengths), i32 strides and counts, an fp32 scale."""
    types = {}
    for param in kernel.params:
        name = param.name
        if param.is_constexpr:
            types[name] = "constexpr"
        elif name in ("max_ptr", "sum_ptr", "acc_ptr"):
            types[name] = "*fp32"
        elif name in ("block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr",
                      "token_seqs_ptr"):
            types[name] = f"*{index_type}"
        elif name.endswith("_ptr"):
            types[name] = f"*{dtype}"
        elif name == "scale":
            types[name] = "fp32"
        else:  # strides and counts
            types[name] = "i32"
    return types


def configurations(quick: bool = False):
    """(kernel, dtype, constants) for every kernel at the benchmark's shapes; ``quick``: one
    shape per kernel and dtype, and the largest head dimension for the final kernel."""
    from kernels.paged_attention import paged_attention_kernel
    from kernels.paged_attention_steps import block_loop_kernel, gqa_kernel, one_block_kernel
    from kernels.split_kv import merge_splits_kernel, split_kv_kernel

    decode = (one_block_kernel, block_loop_kernel, gqa_kernel, paged_attention_kernel,
              split_kv_kernel)
    shapes = ((128, 16, 4),) if quick else itertools.product((64, 128, 256), (16, 32),
                                                             (1, 4, 8))
    for (head_dim, block_size, group), kernel, dtype in itertools.product(shapes, decode,
                                                                          DTYPES):
        yield kernel, dtype, {"GROUP": group, "GROUP_PAD": max(16, group),
                              "BLOCK_SIZE": block_size, "HEAD_DIM": head_dim}
    if quick:
        yield paged_attention_kernel, "bf16", {"GROUP": 8, "GROUP_PAD": 16, "BLOCK_SIZE": 32,
                                               "HEAD_DIM": 256}
    from kernels.varlen_attention import varlen_attention_kernel

    varlen = ((128, 16, 4),) if quick else itertools.product((64, 96, 128), (1, 16), (1, 8))
    for (head_dim, block_size, group), dtype in itertools.product(varlen, DTYPES):
        yield varlen_attention_kernel, dtype, {
            "GROUP": group, "GROUP_PAD": max(16, group), "BLOCK_SIZE": block_size,
            "BLOCK_PAD": max(16, block_size), "HEAD_DIM": head_dim,
            "HEAD_PAD": max(16, 1 << (head_dim - 1).bit_length())}
    merges = ((128, 16),) if quick else itertools.product((64, 128, 256), (2, 16, 64))
    for (head_dim, splits), dtype in itertools.product(merges, DTYPES):
        yield merge_splits_kernel, dtype, {"HEAD_DIM": head_dim, "SPLITS_PAD": splits}


def compile_one(kernel, dtype: str, constants: dict[str, int], target: GPUTarget):
    source = ASTSource(fn=kernel, signature=_signature(kernel, dtype, "i32"),
                       constexprs=constants)
    return triton.compile(source, target=target)


def main(argv: list[str]) -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("kernels.compile_check compiles for GPUs: unset TRITON_INTERPRET and rerun.")
        return 2
    failures = 0
    for target_name, target in TARGETS.items():
        for kernel, dtype, constants in configurations(quick="--quick" in argv):
            label = (f"{target_name:18} {kernel.__name__:22} {dtype:5} "
                     + " ".join(f"{k}={v}" for k, v in constants.items()))
            try:
                compiled = compile_one(kernel, dtype, constants, target)
            except Exception as exc:  # report every failing configuration, not just the first
                failures += 1
                print(f"FAIL {label}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
                continue
            print(f"ok   {label}  shared memory {compiled.metadata.shared} B")
    print(f"{failures} configuration(s) failed" if failures else "every configuration compiled")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
