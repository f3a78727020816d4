"""Compile the course's kernels, or your own, for NVIDIA GPUs on any machine.

The course's: chapters 7 and 9 (chapter 9's with chapter 10's window), and chapter 13's MLA
decode over plain and FP8 records at DeepSeek-V3's shapes.

Triton's interpreter runs a kernel as NumPy and accepts code that NVIDIA's compiler rejects (a
``tl.dot`` whose reduced dimension K is under 16 for 16-bit inputs, say). Compiling for a
target needs no GPU, only the compiler in Triton's wheel, so this checks on a CPU that a
kernel builds for Colab's T4 (sm_75), the A100 (sm_80) and the H100/H200 (sm_90)::

    python -m kernels.compile_check            # the course's kernels, every configuration
    python -m kernels.compile_check --quick    # one shape per kernel and dtype (about a minute)
    python -m kernels.compile_check --module my_kernels.py [--kernel NAME ...]   # your own
        [--dtype fp16] [--block-size 16] [--head-dim 80] [--group 4]

and from a notebook, where kernels run on the interpreter (the compile runs in another
process, which loads each kernel in a fresh child of its own)::

    from kernels import compile_check
    compile_check.check(paged_attention_kernel)                    # fp16, blocks of 16
    compile_check.check(paged_attention_kernel, dtype="fp32", block_size=8)
    compile_check.check(mla_decode_kernel, dtype="fp8", block_size=64)   # DeepSeek-V3's

Each line names the target, kernel, dtype and constants, then what ``tl.dot`` became (tensor
-core ``mma`` instructions, or plain FMA where the GPU has none for that dtype), the shared
memory used, and whether the kernel multiplies a block number by ``stride_kv_block`` in int64
(``block x stride`` in int32 wraps past 2^31 elements, a pool of 4 GiB in fp16).

The course's own configurations refuse to run with ``TRITON_INTERPRET=1`` (its kernels would
be defined as interpreted); ``check`` runs anywhere.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import traceback
import types
from pathlib import Path

TARGETS = {"sm_75 (T4)": ("cuda", 75, 32), "sm_80 (A100)": ("cuda", 80, 32),
           "sm_90 (H100/H200)": ("cuda", 90, 32)}
DTYPES = ("fp32", "fp16", "bf16")

# The chapter's three kernel contracts, by position: (name, Triton type or a role).
DECODE = ("out_ptr:data", "query_ptr:data", "k_cache_ptr:data", "v_cache_ptr:data",
          "block_tables_ptr:index", "seq_lens_ptr:index", "scale:fp32", "stride_q_seq:i32",
          "stride_q_head:i32", "stride_kv_block:i32", "stride_kv_token:i32",
          "stride_kv_head:i32", "stride_table_seq:i32", "GROUP:constexpr",
          "GROUP_PAD:constexpr", "BLOCK_SIZE:constexpr", "HEAD_DIM:constexpr",
          "HEAD_PAD:constexpr")
SPLIT = ("max_ptr:*fp32", "sum_ptr:*fp32", "acc_ptr:*fp32", "query_ptr:data",
         "k_cache_ptr:data", "v_cache_ptr:data", "block_tables_ptr:index",
         "seq_lens_ptr:index", "scale:fp32", "stride_q_seq:i32", "stride_q_head:i32",
         "stride_kv_block:i32", "stride_kv_token:i32", "stride_kv_head:i32",
         "stride_table_seq:i32", "blocks_per_split:i32", "GROUP:constexpr",
         "GROUP_PAD:constexpr", "BLOCK_SIZE:constexpr", "HEAD_DIM:constexpr",
         "HEAD_PAD:constexpr")
MERGE = ("out_ptr:data", "max_ptr:*fp32", "sum_ptr:*fp32", "acc_ptr:*fp32",
         "stride_out_seq:i32", "stride_out_head:i32", "num_splits:i32", "HEAD_DIM:constexpr",
         "HEAD_PAD:constexpr", "SPLITS_PAD:constexpr")
CONTRACTS = {len(c): c for c in (DECODE, SPLIT, MERGE)}
# Chapter 9's attention over packed queries: known by its parameter names. Its FIRST_KEY is
# a jit function, named here by its name in FIRST_KEYS (JSON carries it to a compile process).
VARLEN = ("out_ptr:data", "query_ptr:data", "k_cache_ptr:data", "v_cache_ptr:data",
          "query_start_loc_ptr:index", "seq_lens_ptr:index", "block_tables_ptr:index",
          "token_seqs_ptr:index", "scale:fp32", "window:i32", "stride_q_token:i32",
          "stride_q_head:i32", "stride_kv_block:i32", "stride_kv_token:i32",
          "stride_kv_head:i32", "stride_table_seq:i32", "GROUP:constexpr",
          "GROUP_PAD:constexpr", "BLOCK_SIZE:constexpr", "BLOCK_PAD:constexpr",
          "HEAD_DIM:constexpr", "HEAD_PAD:constexpr", "FIRST_KEY:constexpr")
FIRST_KEYS = {"all_keys": ("kernels.varlen_attention", "all_keys"),
              "window_first_key": ("kernels.sliding_window_attention", "window_first_key")}
# Chapter 13's decode over a paged MLA cache: known by its parameter names too. Its dtype is
# the query's and a plain cache's ("bf16"), or "fp8": FP8 records (a uint8 cache, its scales
# read as float32 and its rotary key as bfloat16) under a bf16 query. Its DECODE is a jit
# function named in DECODERS.
MLA = ("out_ptr:data", "query_ptr:data", "cache_ptr:cache", "scales_ptr:*fp32",
       "rope_ptr:*bf16", "block_tables_ptr:index", "seq_lens_ptr:index", "scale:fp32",
       "stride_q_seq:i32", "stride_q_head:i32", "stride_out_seq:i32", "stride_out_head:i32",
       "stride_kv_block:i32", "stride_kv_token:i32", "stride_table_seq:i32",
       "NUM_HEADS:constexpr", "HEAD_TILE:constexpr", "BLOCK_SIZE:constexpr",
       "BLOCK_PAD:constexpr", "RANK:constexpr", "RANK_PAD:constexpr", "ROPE:constexpr",
       "ROPE_PAD:constexpr", "FP8:constexpr", "TILE:constexpr", "SCALES_AT:constexpr",
       "ROPE_AT:constexpr", "DECODE:constexpr")
DECODERS = {"e4m3_to_float": ("kernels.mla_decode", "e4m3_to_float")}


def _contract(names: list[str]) -> tuple[str, ...]:
    for contract in (VARLEN, MLA):
        if list(names) == [role.split(":")[0] for role in contract]:
            return contract
    if len(names) not in CONTRACTS:
        raise ValueError(f"a chapter-7 kernel takes {sorted(CONTRACTS)} arguments; this one "
                         f"takes {len(names)}: {', '.join(names)}")
    return CONTRACTS[len(names)]


def head_pad(head_dim: int) -> int:
    return max(16, 1 << (head_dim - 1).bit_length())


def constants_for(names: list[str], block_size: int = 16, head_dim: int = 128,
                  group: int = 4, splits: int = 4, first_key: str = "all_keys",
                  dtype: str | None = None) -> dict[str, int | str]:
    """The constexpr values of a kernel with parameter ``names`` at these sizes (a varlen
    kernel's ``FIRST_KEY`` by its name in ``FIRST_KEYS``); an MLA kernel's are
    ``mla_constants`` at DeepSeek-V3's shapes with blocks of ``block_size``, its records FP8
    where ``dtype`` is "fp8"."""
    if _contract(names) == MLA:
        return mla_constants(dtype == "fp8", block_size)
    values = {"GROUP": group, "GROUP_PAD": 1 << (group - 1).bit_length(),
              "BLOCK_SIZE": block_size, "BLOCK_PAD": head_pad(block_size),
              "HEAD_DIM": head_dim, "HEAD_PAD": head_pad(head_dim),
              "SPLITS_PAD": 1 << (splits - 1).bit_length(), "FIRST_KEY": first_key}
    if _contract(names) == VARLEN:  # launch_varlen pads the group to 16 rows
        values["GROUP_PAD"] = head_pad(group)
    return {name: values[role.split(":")[0]] for name, role in zip(names, _contract(names),
                                                                     strict=True)
            if role.endswith(":constexpr")}


def mla_constants(fp8: bool, block_size: int = 64, num_heads: int = 128, head_tile: int = 16,
                  rank: int = 512, rope: int = 64, tile: int = 128,
                  decode: str = "e4m3_to_float") -> dict[str, int | str]:
    """The constexpr values of chapter 13's MLA decode kernel as ``mla_decode`` launches it,
    by default at DeepSeek-V3's shapes (128 heads, rank 512, rope 64, FP8 tiles of 128: a
    656-byte record); ``decode`` by its name in ``DECODERS``."""
    scales_at, rope_at = (rank, rank + 4 * (rank // tile)) if fp8 else (0, rank)
    return {"NUM_HEADS": num_heads, "HEAD_TILE": head_tile, "BLOCK_SIZE": block_size,
            "BLOCK_PAD": head_pad(block_size), "RANK": rank, "RANK_PAD": head_pad(rank),
            "ROPE": rope, "ROPE_PAD": head_pad(rope), "FP8": fp8, "TILE": tile if fp8 else 1,
            "SCALES_AT": scales_at, "ROPE_AT": rope_at, "DECODE": decode}


def signature_for(names: list[str], dtype: str) -> dict[str, str]:
    """Triton types by position: the data pointers ``*dtype``, partials ``*fp32``, tables
    and lengths ``*i32``, an fp32 scale, i32 strides and counts; an MLA cache ``*dtype``,
    or ``*u8`` with the dtype "fp8" (then a bf16 query and output)."""
    data = "bf16" if dtype == "fp8" else dtype
    cache = "u8" if dtype == "fp8" else dtype
    types_ = {}
    for name, role in zip(names, _contract(names), strict=True):
        kind = role.split(":")[1]
        types_[name] = {"data": f"*{data}", "cache": f"*{cache}", "index": "*i32"}.get(kind,
                                                                                     kind)
    return types_


# --- what the compiler made of it ------------------------------------------------------------


def _target(name: str):
    from triton.backends.compiler import GPUTarget

    return GPUTarget(*TARGETS[name])


def _source(kernel, dtype: str, constants: dict[str, int] | None):
    from triton.compiler import ASTSource

    names = [p.name for p in kernel.params]
    constants = constants if constants is not None else constants_for(names, dtype=dtype)
    constants = {name: _jit_constant(value) if isinstance(value, str) else value
                 for name, value in constants.items()}
    return ASTSource(fn=kernel, signature=signature_for(names, dtype), constexprs=constants)


def _jit_constant(name: str):
    """The jit function ``FIRST_KEYS`` or ``DECODERS`` names, imported as compiled (not
    interpreted)."""
    import importlib

    module, function = {**FIRST_KEYS, **DECODERS}[name]
    return getattr(importlib.import_module(module), function)


def compile_one(kernel, dtype: str, constants: dict[str, int] | None, target):
    """``kernel`` (a ``triton.jit`` function, not interpreted) compiled for ``target``."""
    import triton

    return triton.compile(_source(kernel, dtype, constants), target=target)


def ttir(kernel, dtype: str, constants: dict[str, int] | None, target) -> str:
    """The kernel's Triton IR as the front end builds it, helper functions inlined: the
    types it computes in, before any optimisation. Raises what the compiler raises (a
    ``tl.dot`` too small for ``target``, say)."""
    from triton._C.libtriton import ir, passes
    from triton.compiler.compiler import make_backend

    backend = make_backend(target)
    options = backend.parse_options({})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = _source(kernel, dtype, constants).make_ir(
        target, options, backend.get_codegen_implementation(options),
        backend.get_module_map(), context)
    manager = ir.pass_manager(module.context)
    passes.common.add_inliner(manager)
    manager.run(module, "inline")
    return str(module)


_DEFINITION = re.compile(r"^\s*((?:%[\w.$-]+(?::\d+)?)(?:\s*,\s*%[\w.$-]+(?::\d+)?)*)\s*=\s*"
                         r"(\"?[\w.]+\"?)(.*)$")
_VALUE = re.compile(r"%[\w.$-]+")


def _graph(text: str) -> tuple[dict[str, tuple[str, list[str], str, str]], list[str]]:
    """SSA value -> (op, operands, result type, location), and the function's arguments."""
    values = {}
    arguments = []
    for line in text.splitlines():
        if "tt.func" in line and "@" in line and not arguments:
            head = line.split("(", 1)[1] if "(" in line else ""
            arguments = re.findall(r"(%[\w.$-]+)\s*:", head)
            continue
        found = _DEFINITION.match(line)
        if not found:
            continue
        results, op, rest = found.groups()
        location = re.search(r"loc\((#loc\d+)\)\s*$", rest)
        typed = re.search(r":\s*([^:]+?)\s+loc\(", rest)
        operands = [name for name in _VALUE.findall(rest.split(" loc(")[0])]
        for result in results.split(","):
            name = result.strip().split(":")[0]
            values[name] = (op.strip('"'), operands, typed.group(1).strip() if typed else "",
                            location.group(1) if location else "")
    return values, arguments


def _forward(values, seeds: set[str], through_loads: bool) -> set[str]:
    """Everything computed from ``seeds`` (not through a load's result unless
    ``through_loads``)."""
    found = set(seeds)
    changed = True
    while changed:
        changed = False
        for name, (op, operands, _, _) in values.items():
            if name in found or (op == "tt.load" and not through_loads):
                continue
            if any(o.split("#")[0] in found for o in operands):
                found.add(name)
                changed = True
    return found


def _lines(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(r"^(#loc\d*) = loc\((.*)\)$", text,
                                                          re.M)}


def _place(text: str, location: str) -> tuple[str, int] | None:
    """(file, line) of an IR location, following its aliases."""
    table = _lines(text)
    seen = set()
    while location and location not in seen:
        seen.add(location)
        body = table.get(location, "")
        found = re.search(r'"([^"]+)":(\d+):\d+', body)
        if found:
            return found.group(1), int(found.group(2))
        inner = re.findall(r"#loc\d*", body)
        location = inner[-1] if inner else ""
    return None


def block_products(text: str, names: list[str]) -> list[dict]:
    """Each product of a block number (a value loaded from the block table) by
    ``stride_kv_block`` in the kernel's IR: its result type and where it is in the source."""
    contract = _contract(names)
    if "stride_kv_block:i32" not in contract:
        return []
    values, arguments = _graph(text)
    roles = [r.split(":")[0] for r in contract if not r.endswith(":constexpr")]
    if len(arguments) != len(roles):
        return []
    table = arguments[roles.index("block_tables_ptr")]
    stride = arguments[roles.index("stride_kv_block")]
    pointers = _forward(values, {table}, through_loads=False)
    loaded = {name for name, (op, operands, _, _) in values.items()
              if op == "tt.load" and operands and operands[0] in pointers}
    numbers = _forward(values, loaded, through_loads=False)
    strides = _forward(values, {stride}, through_loads=False)
    found = []
    for op, operands, type_, location in values.values():
        if op != "arith.muli" or len(operands) < 2:
            continue
        a, b = (o.split("#")[0] for o in operands[:2])
        if (a in numbers and b in strides) or (b in numbers and a in strides):
            place = _place(text, location)
            found.append({"type": type_, "int64": bool(re.search(r"\bi64\b|xi64>", type_)),
                          "file": place[0] if place else None,
                          "line": place[1] if place else None})
    return found


def _dot_instructions(ptx: str) -> str:
    mma = sorted({line.split()[0] for line in ptx.splitlines()
                  if line.strip().startswith(("mma.", "wgmma."))})
    if mma:
        return "tensor cores: " + ", ".join(mma)
    return "no tensor-core instruction (tl.dot as FMA)"


def inspect_kernel(kernel, dtype: str = "fp16", constants: dict[str, int] | None = None,
                   target: str = "sm_80 (A100)", full: bool = False) -> dict:
    """What compiling ``kernel`` (not interpreted) for ``target`` gives: ``error`` (the
    compiler's first line) or None; ``products`` (``block_products``); with ``full``, the
    whole compile: ``dot`` (which instructions ``tl.dot`` became) and ``shared`` bytes."""
    names = [p.name for p in kernel.params]
    result = {"kernel": kernel.__name__, "target": target, "dtype": dtype,
              "constants": (constants if constants is not None
                            else constants_for(names, dtype=dtype)),
              "error": None, "products": []}
    try:
        text = ttir(kernel, dtype, result["constants"], _target(target))
        result["products"] = block_products(text, names)
        if full:
            compiled = compile_one(kernel, dtype, result["constants"], _target(target))
            result["dot"] = _dot_instructions(compiled.asm["ptx"])
            result["shared"] = compiled.metadata.shared
    except Exception as exc:  # the learner's code: its first line is the verdict
        message = str(exc).strip()
        lines = [line for line in message.splitlines() if line.strip()]
        result["error"] = f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:400]
    return result


# --- a kernel defined anywhere (a notebook's cell), compiled in a fresh process --------------


def _function(kernel):
    return getattr(kernel, "fn", kernel)


def _is_kernel(value) -> bool:
    return hasattr(value, "fn") and callable(value.fn) and \
        type(value).__name__ in ("JITFunction", "InterpretedFunction")


def source_of(kernel) -> str:
    """A module that defines ``kernel`` again, with the jit functions it calls, the numbers
    and modules its code names, imported without ``TRITON_INTERPRET``."""
    header = ["import triton", "import triton.language as tl", ""]
    bodies: list[str] = []
    done: set[str] = set()

    def add(fn: types.FunctionType) -> None:
        if fn.__name__ in done:
            return
        done.add(fn.__name__)
        lines = textwrap.dedent(inspect.getsource(fn)).splitlines()
        while lines and not lines[0].lstrip().startswith("def "):
            lines.pop(0)  # the decorators
        for name in _names(fn.__code__):
            value = fn.__globals__.get(name)
            if value is None or name in ("triton", "tl"):
                continue
            if _is_kernel(value) and getattr(value.fn, "__module__", "").startswith("triton."):
                continue
            if _is_kernel(value):
                add(value.fn)
            elif isinstance(value, types.ModuleType):
                header.append(f"import {value.__name__} as {name}")
            elif type(value).__name__ == "constexpr":
                header.append(f"{name} = tl.constexpr({value.value!r})")
            elif isinstance(value, bool | int | float):
                header.append(f"{name} = {value!r}")
        bodies.append("@triton.jit\n" + "\n".join(lines))

    add(_function(kernel))
    return "\n".join(header) + "\n\n\n" + "\n\n\n".join(bodies) + "\n"


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _names(constant)
    return names


@functools.lru_cache(maxsize=256)
def _inspect_source(text: str, name: str, dtype: str, constants: str, target: str,
                    full: bool) -> str:
    arguments = ["--kernel", name, "--dtype", dtype, "--constants", constants, "--target",
                 target, "--json"] + (["--full"] if full else [])
    said = _Compiler.asked(text, arguments)
    for line in reversed(said.splitlines()):
        if line.startswith("{"):
            return line
    lines = said.strip().splitlines()
    return json.dumps({"kernel": name, "target": target, "dtype": dtype,
                       "error": f"the compile process failed: {lines[-1] if lines else ''}",
                       "products": [], "internal": True})


class _Compiler:
    """A process that has imported Triton to compile for GPUs (not for the interpreter) and
    forks a child for each kernel it is asked about: the child writes the kernel's source to
    a folder of its own, loads it and compiles it as ``--module`` does, and ends. No kernel's
    source runs in the process itself, so nothing one does reaches the next; Triton's import,
    most of a fresh process's time, is paid once per process that asks."""

    _process: subprocess.Popen | None = None

    @classmethod
    def asked(cls, text: str, arguments: list[str]) -> str:
        """What ``main`` prints for ``--module`` (the kernel's ``text``) and ``arguments``,
        with its errors; an interrupted question ends the process (the next starts another)."""
        try:
            process = cls._process
            if process is None or process.poll() is not None:
                environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
                environment.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
                process = cls._process = subprocess.Popen(
                    [sys.executable, "-m", "kernels.compile_check", "--serve"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                    text=True, env=environment, cwd=tempfile.gettempdir(),
                    start_new_session=True)
            process.stdin.write(json.dumps({"text": text, "arguments": arguments}) + "\n")
            process.stdin.flush()
            answer = process.stdout.readline()
            if answer:
                return json.loads(answer)
        except BaseException:
            cls.end()
            raise
        cls.end()
        return "the compile process ended"

    @classmethod
    def end(cls) -> None:
        if cls._process is not None:
            with contextlib.suppress(OSError):
                os.killpg(cls._process.pid, signal.SIGKILL)
            cls._process.wait()
            cls._process = None


def _serve() -> None:
    """``--serve``: answer each question on stdin (a JSON line: the kernel's source and
    ``main``'s arguments) with what ``main`` printed, as a JSON line, from a child forked
    for that kernel alone."""
    import triton  # noqa: F401 - imported once, for every child
    from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401

    for line in sys.stdin:
        asked = json.loads(line)
        with tempfile.TemporaryDirectory(prefix="kv-compile-") as folder:
            path = Path(folder) / "learner_kernel.py"
            path.write_text(asked["text"], encoding="utf-8")
            printed = Path(folder) / "printed"
            child = os.fork()
            if child == 0:  # the questions stay the server's; what it prints, the answer
                os.chdir(folder)
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                out = open(printed, "w", encoding="utf-8")  # noqa: SIM115 - kept to the exit
                os.dup2(out.fileno(), 1)
                os.dup2(out.fileno(), 2)
                sys.stdin, sys.stdout, sys.stderr = open(os.devnull), out, out  # noqa: SIM115
                try:
                    main(["--module", str(path), *asked["arguments"]])
                except SystemExit as stopped:  # a message, as a fresh process would print it
                    if not isinstance(stopped.code, int | None):
                        print(stopped.code)
                except BaseException:
                    traceback.print_exc()
                finally:
                    out.flush()
                    os._exit(0)
            os.waitpid(child, 0)
            said = printed.read_text(encoding="utf-8") if printed.exists() else ""
        sys.stdout.write(json.dumps(said) + "\n")
        sys.stdout.flush()


def inspect_anywhere(kernel, dtype: str = "fp16", constants: dict[str, int] | None = None,
                     target: str = "sm_80 (A100)", full: bool = False) -> dict:
    """``inspect_kernel`` for a kernel defined anywhere, also under the interpreter (then in
    a fresh process, from the kernel's source); the same question answered once per
    process. ``products``' lines count from the kernel's ``def`` line (1)."""
    fn = _function(kernel)
    text = source_of(kernel)
    names = list(inspect.signature(fn).parameters)
    constants = constants if constants is not None else constants_for(names, dtype=dtype)
    answer = json.loads(_inspect_source(text, fn.__name__, dtype,
                                        json.dumps(constants, sort_keys=True), target, full))
    start = next((i for i, line in enumerate(text.splitlines(), 1)
                  if line.startswith(f"def {fn.__name__}(")), 1)
    code = inspect.getsource(fn).splitlines()
    first = next((i for i, line in enumerate(code) if line.lstrip().startswith("def ")), 0)
    for product in answer.get("products", []):
        if product.get("line") is not None and product.get("file", "").endswith(
                "learner_kernel.py"):
            offset = product["line"] - start
            product["line"] = offset + 1
            within = first + offset
            product["code"] = code[within].strip() if 0 <= within < len(code) else ""
    return answer


def describe(result: dict) -> str:
    """One line for ``inspect_kernel``'s result."""
    label = (f"{result['target']:18} {result['kernel']:22} {result['dtype']:5} "
             + " ".join(f"{k}={v}" for k, v in result["constants"].items()))
    if result["error"]:
        return f"FAIL {label}: {result['error']}"
    wide = [p for p in result["products"] if not p["int64"]]
    addresses = ("block x stride_kv_block in int32: wraps past 2^31 elements" if wide else
                 "block x stride_kv_block in int64" if result["products"] else
                 "no block x stride_kv_block product found")
    parts = [addresses]
    if "dot" in result:
        parts = [result["dot"], f"shared memory {result['shared']} B", addresses]
    return f"{'ok  ' if not wide else 'WARN'} {label}: " + "; ".join(parts)


def check(kernel, dtype: str = "fp16", block_size: int = 16, head_dim: int = 128,
          group: int = 4, targets: tuple[str, ...] = tuple(TARGETS), full: bool = True
          ) -> bool:
    """Compile your ``kernel`` (any chapter-7 kernel, or chapter 13's MLA decode at
    DeepSeek-V3's shapes, FP8 records with ``dtype="fp8"``; defined in a notebook or a
    module) for each GPU target at these sizes, print one line per target, and return
    whether it compiled everywhere with block offsets in int64. Works on the interpreter
    too: the compile runs in a fresh process, from the kernel's source."""
    names = list(inspect.signature(_function(kernel)).parameters)
    constants = constants_for(names, block_size, head_dim, group, dtype=dtype)
    good = True
    for target in targets:
        found = inspect_anywhere(kernel, dtype, constants, target, full)
        found.setdefault("constants", constants)
        print(describe(found))
        good = good and not found["error"] and all(p["int64"] for p in found["products"])
    return good


# --- the course's own kernels ----------------------------------------------------------------


def configurations(quick: bool = False):
    """(kernel, dtype, constants) for every kernel at the benchmark's shapes and the head
    sizes of production models, chapter 13's MLA decode at DeepSeek-V3's (bf16 records and
    FP8 ones); ``quick``: one shape per kernel and dtype, a head size of 80, and the largest
    head for the final kernel."""
    from kernels.paged_attention import paged_attention_kernel
    from kernels.paged_attention_steps import block_loop_kernel, gqa_kernel, one_block_kernel
    from kernels.split_kv import merge_splits_kernel, split_kv_kernel

    decode = (one_block_kernel, block_loop_kernel, gqa_kernel, paged_attention_kernel,
              split_kv_kernel)
    shapes = ((128, 16, 4),) if quick else itertools.product(
        (64, 80, 96, 112, 128, 256), (16, 32), (1, 4, 5, 8))
    for (head_dim, block_size, group), kernel, dtype in itertools.product(shapes, decode,
                                                                          DTYPES):
        names = [p.name for p in kernel.params]
        yield kernel, dtype, constants_for(names, block_size, head_dim, group)
    if quick:
        for head_dim, block_size in ((80, 16), (256, 32)):
            names = [p.name for p in paged_attention_kernel.params]
            yield paged_attention_kernel, "bf16", constants_for(names, block_size, head_dim, 8)
        yield paged_attention_kernel, "fp32", constants_for(names, 8, 128, 4)
    from kernels.varlen_attention import varlen_attention_kernel

    names = [p.name for p in varlen_attention_kernel.params]
    varlen = ((128, 16, 4),) if quick else itertools.product((64, 96, 128), (1, 16), (1, 8))
    for (head_dim, block_size, group), dtype in itertools.product(varlen, DTYPES):
        yield varlen_attention_kernel, dtype, constants_for(names, block_size, head_dim, group)
    windowed = ((64, 16, 8),) if quick else itertools.product((64, 128, 256), (16, 32), (1, 8))
    for (head_dim, block_size, group), dtype in itertools.product(windowed, DTYPES):
        yield varlen_attention_kernel, dtype, constants_for(names, block_size, head_dim, group,
                                                            first_key="window_first_key")
    merges = ((128, 16),) if quick else itertools.product((64, 80, 128, 256), (2, 16, 64))
    for (head_dim, splits), dtype in itertools.product(merges, DTYPES):
        names = [p.name for p in merge_splits_kernel.params]
        yield merge_splits_kernel, dtype, constants_for(names, head_dim=head_dim,
                                                        splits=splits)
    from kernels.mla_decode import mla_decode_kernel

    # DeepSeek-V3's blocks of 64 (FlashMLA's) and chapter 7's 16, 16 heads per program
    for block_size, dtype in itertools.product((64,) if quick else (16, 64), ("bf16", "fp8")):
        yield mla_decode_kernel, dtype, mla_constants(dtype == "fp8", block_size)


def _load(path: str) -> types.ModuleType:
    import importlib.util

    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _known(kernel) -> bool:
    """Whether ``kernel``'s parameters follow one of the contracts above."""
    try:
        _contract([p.name for p in kernel.params])
    except ValueError:
        return False
    return True


def _kernels_of(module: types.ModuleType, wanted: list[str]) -> list:
    found = [v for n, v in vars(module).items() if _is_kernel(v)
             and getattr(v.fn, "__module__", None) == module.__name__
             and _known(v) and (not wanted or n in wanted)]
    missing = set(wanted) - {k.__name__ for k in found}
    if missing:
        raise SystemExit(f"no chapter-7 kernel named {', '.join(sorted(missing))} in "
                         f"{module.__file__}")
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one shape per kernel and dtype")
    parser.add_argument("--module", help="compile the kernels of this Python file instead")
    parser.add_argument("--kernel", action="append", default=[], help="only this kernel")
    parser.add_argument("--dtype", choices=(*DTYPES, "fp8"),
                        help="only this dtype (--module: fp16; fp8: chapter 13's FP8 records)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--constants", help=argparse.SUPPRESS)  # JSON, from inspect_anywhere
    parser.add_argument("--target", action="append", choices=list(TARGETS), default=[])
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--full", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("kernels.compile_check compiles for GPUs: unset TRITON_INTERPRET and rerun.")
        return 2
    targets = args.target or list(TARGETS)
    if args.module:
        jobs = []
        for kernel in _kernels_of(_load(args.module), args.kernel):
            names = [p.name for p in kernel.params]
            constants = (json.loads(args.constants) if args.constants else
                         constants_for(names, args.block_size, args.head_dim, args.group,
                                       dtype=args.dtype))
            jobs.append((kernel, args.dtype or "fp16", constants))
        full = args.full or not args.json
    else:
        jobs = [job for job in configurations(args.quick)
                if args.dtype in (None, job[1])]
        full = True
    failures = 0
    for target in targets:
        for kernel, dtype, constants in jobs:
            result = inspect_kernel(kernel, dtype, constants, target, full=full)
            if args.json:
                print(json.dumps(result))
                continue
            print(describe(result))
            failures += bool(result["error"]) or any(not p["int64"]
                                                     for p in result["products"])
    if args.json:
        return 0
    print(f"{failures} configuration(s) failed" if failures else "every configuration compiled")
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        _serve()
    else:
        sys.exit(main(sys.argv[1:]))
