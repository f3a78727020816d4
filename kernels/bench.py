"""Benchmark of chapter 7's kernel on a GPU: time per decode step and achieved bandwidth.

    python -m kernels.bench [--quick] [--validate] [--out kernels/results/NAME.json]

Llama-3-8B attention (32 query heads over 8 KV heads, head dim 128, bf16), batch 1 to 256,
context 512 to 32k, block sizes 16 and 32, two length mixes ("uniform": every sequence at
the context length; "skewed": log-normal lengths with median a quarter of the context, one
sequence at the full context). For each shape it prints and saves:

- the median time of one call (``paged_attention``, split-KV chosen automatically, input
  validation off unless ``--validate``: its checks of lengths and block ids read values back
  from the GPU, one synchronisation per call, which a serving engine that builds its own
  tables skips), after
  warm-up, with a cold L2: calls rotate over enough copies of the inputs to exceed twice the
  L2 cache, and the GPU is kept busy while each timed call is queued, so the events time the
  kernels and not Python's launch overhead;
- the bytes a decode step must move: K and V once per KV head for every token, queries,
  outputs, the block-table entries read and the lengths (``bytes_moved``);
- achieved bandwidth (bytes / time), the device-to-device copy bandwidth measured in the same
  run, and their ratio;
- the speed-up over a PyTorch gather reference (``torch_gather_attention``), where its
  gathered copy fits in memory.

It refuses to run on the CPU or under ``TRITON_INTERPRET=1``: interpreter timings measure
NumPy, not the kernel.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import torch

HEADS = {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128}  # Llama-3-8B
RESULTS = Path(__file__).parent / "results"
BATCHES = (1, 8, 32, 64, 128, 256)
CONTEXTS = (512, 2048, 4096, 8192, 16384, 32768)
BLOCK_SIZES = (16, 32)
MIXES = ("uniform", "skewed")
POOL_LIMIT = 24 * 2**30
"""Largest KV pool one shape may use (bytes): batch 256 at 32k would need 34 GiB."""


def lengths_for(batch: int, context: int, mix: str, seed: int = 0) -> list[int]:
    """Sequence lengths of one shape: all ``context``, or log-normal (sigma 1) with median
    context / 4, clipped to [1, context], the first at the full context."""
    if mix == "uniform":
        return [context] * batch
    gen = torch.Generator().manual_seed(seed + batch)
    draws = torch.exp(torch.randn(batch, generator=gen)) * (context / 4)
    lengths = draws.clamp(1, context).round().int().tolist()
    lengths[0] = context
    return lengths


def bytes_moved(lengths: list[int], num_q_heads: int, num_kv_heads: int, head_dim: int,
                block_size: int, element_size: int) -> int:
    """Bytes a decode step must read or write at least: K and V once per KV head and token,
    each query and output row, the block-table entries used (int32) and the lengths."""
    tokens = sum(lengths)
    blocks = sum(-(-n // block_size) for n in lengths)
    kv = 2 * tokens * num_kv_heads * head_dim * element_size
    rows = 2 * len(lengths) * num_q_heads * head_dim * element_size
    return kv + rows + 4 * blocks + 4 * len(lengths)


def torch_gather_attention(query, k_cache, v_cache, block_tables, seq_lens, scale):
    """The PyTorch way without a kernel: gather every sequence's blocks into a padded
    contiguous tensor, mask past each length, softmax, weighted sum (fp32)."""
    num_seqs, num_q_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    keys = k_cache[block_tables.long()].flatten(1, 2).float()  # [seqs, tokens, kv, dim]
    values = v_cache[block_tables.long()].flatten(1, 2).float()
    group = num_q_heads // num_kv_heads
    q = query.float().view(num_seqs, num_kv_heads, group, head_dim)
    scores = torch.einsum("skgd,stkd->skgt", q, keys) * scale
    positions = torch.arange(keys.shape[1], device=query.device)
    scores.masked_fill_((positions >= seq_lens[:, None].long())[:, None, None, :],
                        float("-inf"))
    out = torch.einsum("skgt,stkd->skgd", scores.softmax(dim=-1), values)
    return out.reshape(num_seqs, num_q_heads, head_dim).to(query.dtype)


def _inputs(lengths, block_size, copies, dtype, seed=0):
    """``copies`` independent pools (shuffled blocks) with their tables, lengths, queries."""
    gen = torch.Generator("cuda").manual_seed(seed)
    per_seq = [-(-n // block_size) for n in lengths]
    shape = (sum(per_seq), block_size, HEADS["num_kv_heads"], HEADS["head_dim"])
    made = []
    for _ in range(copies):
        k_cache = torch.randn(shape, generator=gen, device="cuda", dtype=dtype)
        v_cache = torch.randn(shape, generator=gen, device="cuda", dtype=dtype)
        order = torch.randperm(shape[0], generator=gen, device="cuda").int()
        tables = torch.zeros(len(lengths), max(per_seq), dtype=torch.int32, device="cuda")
        start = 0
        for seq, count in enumerate(per_seq):
            tables[seq, :count] = order[start:start + count]
            start += count
        query = torch.randn((len(lengths), HEADS["num_q_heads"], HEADS["head_dim"]),
                            generator=gen, device="cuda", dtype=dtype)
        seq_lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
        made.append((query, k_cache, v_cache, tables, seq_lens))
    return made


def median_ms(fn, inputs, repeats: int = 50, warmup: int = 10) -> float:
    """Median GPU time of ``fn(*inputs[i % len(inputs)])`` in milliseconds."""
    for i in range(warmup):
        fn(*inputs[i % len(inputs)])
    times = []
    for i in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1_000_000)  # keep the GPU busy while the next call is queued
        start.record()
        fn(*inputs[i % len(inputs)])
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth(size: int = 2**30) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second) of ``size`` bytes."""
    src = torch.empty(size, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * size / (median_ms(lambda s, d: d.copy_(s), [(src, dst)]) / 1e3)


def _environment() -> dict:
    import triton

    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,"
                                 "noheader"], capture_output=True, text=True).stdout.strip()
    except OSError:
        driver = "unknown"
    properties = torch.cuda.get_device_properties(0)
    return {"date": datetime.date.today().isoformat(), "gpu": properties.name,
            "multiprocessors": properties.multi_processor_count,
            "l2_bytes": getattr(properties, "L2_cache_size", 50 * 2**20), "driver": driver,
            "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version()}


def shapes(quick: bool):
    """(batch, context, block size, mix) to run; ``quick``: a dozen of them."""
    if quick:
        return [(b, c, 16, m) for b, c in [(1, 32768), (8, 4096), (64, 4096), (256, 2048)]
                for m in MIXES] + [(1, 32768, 32, "uniform"), (8, 4096, 32, "uniform")]
    return [(b, c, s, m) for b in BATCHES for c in CONTEXTS for s in BLOCK_SIZES for m in MIXES]


def run(quick: bool, validate: bool = False) -> dict:
    from kernels.paged_attention import paged_attention
    from kernels.split_kv import choose_num_splits

    env = _environment()
    copy = copy_bandwidth()
    scale = 1 / math.sqrt(HEADS["head_dim"])
    rows = []
    print(f"{env['gpu']}, driver {env['driver']}, torch {env['torch']}, triton "
          f"{env['triton']}; copy bandwidth {copy / 1e9:.0f} GB/s")
    print(f"{'batch':>5} {'context':>7} {'block':>5} {'mix':>8} {'splits':>6} {'time us':>9} "
          f"{'GB/s':>7} {'of copy':>8} {'vs torch':>9}")
    for batch, context, block_size, mix in shapes(quick):
        lengths = lengths_for(batch, context, mix)
        moved = bytes_moved(lengths, **HEADS, block_size=block_size, element_size=2)
        pool = 2 * sum(lengths) * HEADS["num_kv_heads"] * HEADS["head_dim"] * 2
        if pool > POOL_LIMIT:
            continue
        copies = max(1, min(16, math.ceil(2 * env["l2_bytes"] / pool)))
        inputs = _inputs(lengths, block_size, copies, torch.bfloat16)
        kernel_ms = median_ms(lambda *a: paged_attention(*a, scale, validate=validate), inputs)
        gathered = 4 * 2 * batch * max(lengths) * HEADS["num_kv_heads"] * HEADS["head_dim"]
        torch_ms = (median_ms(lambda *a: torch_gather_attention(*a, scale), inputs[:1], 10, 2)
                    if gathered * 3 < POOL_LIMIT else None)
        splits = choose_num_splits(batch, HEADS["num_kv_heads"], inputs[0][3].shape[1],
                                   torch.device("cuda"))
        achieved = moved / (kernel_ms / 1e3)
        row = {"batch": batch, "context": context, "block_size": block_size, "mix": mix,
               "tokens": sum(lengths), "num_splits": splits, "bytes": moved,
               "time_us": kernel_ms * 1e3, "bandwidth": achieved,
               "fraction_of_copy": achieved / copy,
               "speedup_vs_torch": None if torch_ms is None else torch_ms / kernel_ms}
        rows.append(row)
        speedup = "-" if torch_ms is None else f"{torch_ms / kernel_ms:.1f}x"
        print(f"{batch:>5} {context:>7} {block_size:>5} {mix:>8} {splits:>6} "
              f"{kernel_ms * 1e3:>9.1f} {achieved / 1e9:>7.0f} {achieved / copy:>8.0%} "
              f"{speedup:>9}")
        del inputs
        torch.cuda.empty_cache()
    return {"environment": env, "heads": HEADS, "dtype": "bfloat16",
            "copy_bandwidth": copy, "rows": rows,
            "validated": validate,
            "command": "python -m kernels.bench" + (" --quick" if quick else "")
            + (" --validate" if validate else "")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a dozen shapes, not all")
    parser.add_argument("--out", type=Path, help="where to write the JSON results")
    parser.add_argument("--validate", action="store_true",
                        help="time paged_attention with its input validation on")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("kernels.bench: TRITON_INTERPRET=1 is set; interpreter timings measure NumPy, "
              "not the kernel. Unset it and run on a GPU.", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("kernels.bench: no CUDA GPU here. The benchmark times the Triton kernel on a "
              "GPU; on the CPU the chapter's checks run on the interpreter instead.",
              file=sys.stderr)
        return 2
    results = run(args.quick, args.validate)
    out = args.out or RESULTS / f"{results['environment']['gpu'].replace(' ', '_')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
