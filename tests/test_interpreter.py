"""kernels.interpreter: Triton's interpreter patches its language once per launch and builds
no overflow check that nothing reads, and the kernels compute what they computed without
it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO

# A kernel that calls Triton's own @triton.jit functions (tl.zeros, tl.cdiv, tl.sum, tl.max)
# in every program and does 32-bit index arithmetic, launched before and after importing a
# module of kernels lightens the interpreter. Every patch Triton makes is counted, and every
# overflow check handed to device_assert (which drops it: the interpreter never debugs); the
# results are compared with torch's.
SCRIPT = '''
import json, os
import torch, triton, triton.language as tl
from triton.language.semantic import TritonSemantic
from triton.runtime import interpreter

patched, asserted = [], []
triton_patch = interpreter._patch_lang
interpreter._patch_lang = lambda fn: patched.append(fn.__name__) or triton_patch(fn)
triton_assert = TritonSemantic.device_assert
TritonSemantic.device_assert = lambda self, *a: asserted.append(a[1]) or triton_assert(self, *a)


@triton.jit
def row_stats(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for step in range(0, tl.cdiv(n, BLOCK)):
        offsets = step * BLOCK + cols
        acc += tl.load(x_ptr + row * n + offsets, mask=offsets < n, other=0.0)
    tl.store(out_ptr + 2 * row, tl.sum(acc, axis=0))
    tl.store(out_ptr + 2 * row + 1, tl.max(acc, axis=0))


def expected(x, block):
    rows, n = x.shape
    padded = torch.nn.functional.pad(x, (0, -n % block)).reshape(rows, -1, block).sum(1)
    return torch.stack([padded.sum(1), padded.max(1).values], 1).flatten()


def launches(times):
    found = []
    for seed in range(times):
        x = torch.randn(3, 37, generator=torch.Generator().manual_seed(seed))
        out = torch.empty(6)
        patched.clear()
        asserted.clear()
        row_stats[(3,)](x, out, 37, BLOCK=8)
        found.append({"patches": len(patched), "overflow checks": len(asserted),
                      "right": torch.allclose(out, expected(x, 8), atol=1e-5)})
    return found


debugging = interpreter.interpreter_builder.options.debug
before = launches(2)
import kernels.split_kv  # noqa: E402,F401  (a module of kernels: it applies kernels.interpreter)
after = launches(2)
print(json.dumps({"before": before, "after": after, "debugging": debugging}))
'''


def test_the_interpreter_drops_no_work_whose_result_it_reads(tmp_path):
    """The language patched once per launch, no overflow check built, the same results."""
    script = tmp_path / "row_stats.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.splitlines()[-1])
    # Triton alone: the launch, then each program's calls of its @triton.jit functions; an
    # overflow check for each 32-bit + and *, handed to a device_assert that drops it
    assert found["debugging"] is False
    assert all(launch["right"] and launch["patches"] > 3 * 4
               and launch["overflow checks"] > 3 * 3 for launch in found["before"])
    # patched once: the kernel's module (tl), once Triton's own functions' (tl.core), and
    # again at the next launch, which begins with the language bound back; no overflow check
    assert found["after"] == [{"patches": 2, "overflow checks": 0, "right": True}] * 2


def test_a_module_of_pytorch_references_imports_no_triton():
    """Chapters 6 and 8 use the PyTorch references alone: importing them loads no Triton
    (about a second), interpreter or not."""
    script = ("import sys, course\ncourse.setup(quiet=True)\n"
              "import kernels.paged_attention_ref\nprint('triton' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False"]


def test_overflow_checks_stay_where_the_interpreter_would_debug():
    """Where the options ask for debugging, device_assert raises on an overflow: the checks
    are kept. Without, they are turned off."""
    import dataclasses
    import types

    from triton.runtime.interpreter import InterpreterOptions

    from kernels.interpreter import _no_unread_overflow_checks

    for debug in (True, False):
        builder = types.SimpleNamespace(options=InterpreterOptions(debug=debug))
        _no_unread_overflow_checks(types.SimpleNamespace(interpreter_builder=builder))
        assert builder.options.sanitize_overflow is debug
        assert builder.options == dataclasses.replace(InterpreterOptions(debug=debug),
                                                      sanitize_overflow=debug)
