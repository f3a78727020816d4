"""Chapter 7's library beyond its checks: split-KV through the wrapper, the GPU compile of
every kernel, the benchmark's refusal on the CPU and its byte count, the GPU-only runs, and
one wrong TODO costing that TODO alone."""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import json
import os
import subprocess
import sys
import types
from typing import Any

import alternatives.ch07 as alternative
import pytest
import torch
import triton
import triton.language as tl
from mutants.ch07 import MUTANTS
from one_wrong_todo import names_read

from autograder import borrowing
from autograder.answers import chapter_answers
from autograder.arming import install_tripwires
from autograder.checks.ch07_wrapper import BAD_INPUTS
from autograder.hidden import ch07 as hidden
from autograder.hidden.ch07 import reference
from autograder.table import PARTS
from course.notebook.paged_cases import KernelCase, on_gpu
from kernels import paged_attention as course_kernels
from kernels.bench import bytes_moved, lengths_for
from kernels.split_kv import run_on_grid, run_split_kv, splits_for


@triton.jit
def _not_written_kernel(out_ptr, SIZE: tl.constexpr):
    # YOUR CODE HERE
    raise NotImplementedError()


@pytest.mark.parametrize("num_splits", [2, 3, 7, 40])
@pytest.mark.parametrize("kernels", ["course", "alternative"])
def test_split_kv_equals_one_pass(kernels, num_splits):
    case = KernelCase([1, 37, 200, 16], 8 if not on_gpu() else 16, 8, 2, seed=11)
    args = (case.query, case.k_cache, case.v_cache, case.tables, case.seq_lens, case.scale)
    one_pass = course_kernels.paged_attention(*args, num_splits=1)
    module = course_kernels if kernels == "course" else alternative
    split = run_split_kv(module.split_kv_kernel, module.merge_splits_kernel, *args, num_splits)
    torch.testing.assert_close(split, one_pass, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(split.cpu(), reference(case), atol=1e-5, rtol=1e-4)


def test_a_kernel_not_written_yet_raises_not_implemented_error():
    # the interpreter wraps the kernel's NotImplementedError and a GPU compiler refuses its
    # raise; either way the launch says what an unwritten Python function says
    with pytest.raises(NotImplementedError, match="_not_written_kernel is not written yet"):
        run_on_grid(_not_written_kernel, (1,), torch.empty(4, device="cuda" if on_gpu() else
                                                          "cpu"), SIZE=4)


def test_split_counts_fill_the_gpu_without_tiny_splits():
    assert splits_for(programs=8, multiprocessors=132, max_blocks=2048) == 33  # 264 programs
    assert splits_for(programs=8, multiprocessors=132, max_blocks=64) == 4  # 16 blocks each
    assert splits_for(programs=8, multiprocessors=132, max_blocks=10) == 1
    assert splits_for(programs=512, multiprocessors=132, max_blocks=2048) == 1


def test_the_wrapper_returns_bf16_computed_in_fp32_on_the_interpreter():
    case = KernelCase([37, 5], 4 if not on_gpu() else 16, 4, 1, dtype=torch.bfloat16)
    out = course_kernels.paged_attention(case.query, case.k_cache, case.v_cache, case.tables,
                                         case.seq_lens, case.scale)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu().float(), reference(case).float(), atol=2e-2,
                               rtol=5e-2)


def test_every_kernel_compiles_for_sm80_and_sm90_without_a_gpu():
    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    environment["TRITON_DEFAULT_FP_FUSION"] = "1"
    done = subprocess.run([sys.executable, "-m", "kernels.compile_check", "--quick"],
                          capture_output=True, text=True, env=environment, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every configuration compiled" in done.stdout
    assert done.stdout.count("ok   sm_90") == done.stdout.count("ok   sm_80") \
        == done.stdout.count("ok   sm_75") >= 16


@pytest.mark.parametrize("head_dim", [40, 72, 80, 96, 112])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_head_sizes_that_are_not_powers_of_two_run(head_dim, num_splits):
    case = KernelCase([5, 17, 0], 4 if not on_gpu() else 16, 4, 2, head_dim=head_dim)
    out = course_kernels.paged_attention(*case.arguments(), num_splits=num_splits)
    torch.testing.assert_close(out.cpu(), reference(case), atol=1e-5, rtol=1e-4)
    assert out[2].abs().max() == 0  # a sequence of length 0 gets zeros


_ARGUMENTS = ("query", "k_cache", "v_cache", "block_tables", "seq_lens", "scale", "num_splits",
              "num_q_heads", "block_size")


@pytest.mark.parametrize("what", list(BAD_INPUTS))
def test_every_bad_input_is_refused_with_a_message_naming_the_argument(what):
    case = KernelCase([5, 9, 8, 0], 4 if not on_gpu() else 16, 6, 2, head_dim=24)
    build, error, _ = BAD_INPUTS[what]
    args, options = build(case)
    with pytest.raises(error) as raised:
        course_kernels.paged_attention(*args, **options)
    assert any(name in str(raised.value) for name in _ARGUMENTS), str(raised.value)


def test_the_compile_check_refuses_the_interpreter():
    done = subprocess.run([sys.executable, "-m", "kernels.compile_check", "--quick"],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, TRITON_INTERPRET="1"))
    assert done.returncode == 2 and "unset TRITON_INTERPRET" in done.stdout


@pytest.mark.skipif(on_gpu(), reason="this machine has a GPU: the benchmark would run")
@pytest.mark.parametrize("interpret", ["1", None], ids=["interpreter", "plain-cpu"])
def test_the_benchmark_refuses_without_a_gpu(interpret, tmp_path):
    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        environment["TRITON_INTERPRET"] = interpret
    done = subprocess.run([sys.executable, "-m", "kernels.bench", "--out",
                           str(tmp_path / "r.json")], capture_output=True, text=True,
                          env=environment, timeout=120)
    assert done.returncode == 2
    assert ("TRITON_INTERPRET=1 is set" if interpret else "no CUDA GPU here") in done.stderr
    assert not (tmp_path / "r.json").exists()


def test_bytes_moved_counts_kv_once_per_kv_head_plus_rows_tables_and_lengths():
    # 36 tokens x 8 KV heads x 128 x 2 bytes, for K and V; 2 query/output rows of 32 x 128;
    # 1 + 2 table entries and 2 lengths of 4 bytes
    expected = 2 * 36 * 8 * 128 * 2 + 2 * 2 * 32 * 128 * 2 + 4 * 3 + 4 * 2
    assert bytes_moved([16, 20], 32, 8, 128, 16, 2) == expected


def test_skewed_lengths_are_reproducible_and_reach_the_context():
    lengths = lengths_for(64, 4096, "skewed")
    assert lengths == lengths_for(64, 4096, "skewed")
    assert lengths[0] == 4096 and all(1 <= n <= 4096 for n in lengths)
    assert sorted(lengths)[32] < 4096 / 2  # most are far shorter
    assert lengths_for(3, 512, "uniform") == [512, 512, 512]


@pytest.mark.gpu
@pytest.mark.skipif(not on_gpu(), reason="needs a CUDA GPU (the interpreter runs the small "
                    "shapes in test_checks.py)")
def test_production_shapes_on_the_gpu():
    from autograder.hidden.ch07_gpu import check_production_shapes

    check_production_shapes(course_kernels.paged_attention)
    check_production_shapes(alternative.paged_attention)


# --- one bug costs one TODO ----------------------------------------------------------------

_CHAPTER = "07_triton_paged_attention"
_TODOS = PARTS[_CHAPTER].answers  # grade id -> the module of its answer
_ONE_WRONG_TODO = [(todo, mutant) for todo, found in MUTANTS.items() for mutant, _ in found]


def _in_namespace(function: types.FunctionType, namespace: dict[str, Any]) -> types.FunctionType:
    """``function`` as a notebook cell defines it: its global names looked up in
    ``namespace``."""
    copy = types.FunctionType(function.__code__, namespace, function.__name__,
                              function.__defaults__, function.__closure__)
    copy.__kwdefaults__ = function.__kwdefaults__
    return copy


_WRAPPER = (course_kernels.validate_inputs, course_kernels.paged_attention)
# the names the wrapper's cell reads from the notebook: the kernels it launches among them
_READ_BY_WRAPPER = set().union(*(names_read(function.__code__) for function in _WRAPPER))


def _notebook(todo: str | None, mutant: Any) -> dict[str, Any]:
    """A notebook's namespace after Run All: the course's answer to every TODO but ``todo``,
    which is ``mutant``. The wrapper's cell (``validate_inputs`` and ``paged_attention``)
    finds the kernels by name there, as in a notebook; where it never reads ``todo``'s name,
    it is the course notebook's own (one object, so its hidden check runs once)."""
    namespace = dict(vars(course_kernels))  # the imports of the notebook's first cells
    namespace.update({name: getattr(importlib.import_module(module), name)
                      for name, module in _TODOS.items()})
    reads_todo = todo is None or todo in _READ_BY_WRAPPER
    for function in _WRAPPER:
        namespace[function.__name__] = (_in_namespace(function, namespace) if reads_todo
                                        else _course_notebook()[function.__name__])
    if todo is not None:
        namespace[todo] = mutant
    return namespace


@functools.cache
def _course_notebook() -> dict[str, Any]:
    """The namespace of a notebook with every TODO the course's answer."""
    return _notebook(None, None)


@functools.cache  # only a pass is kept: a check of the same object is the same check
def _passes_its_hidden_check(todo: str, subject: Any) -> None:
    getattr(hidden, f"check_{todo}_thoroughly")(subject)


@pytest.mark.one_wrong_todo
@pytest.mark.parametrize(("todo", "mutant"), _ONE_WRONG_TODO,
                         ids=[f"{todo}-{m.__name__.strip('_')}" for todo, m in _ONE_WRONG_TODO])
def test_one_wrong_todo_costs_that_todo_alone(todo, mutant):
    """A notebook right but for one TODO: every other TODO's hidden check passes. The wrapper
    launches the kernels of TODOs 4 to 6 by name; its hidden check lends the course's where
    the notebook's fail it (the wrapper's visible check, which runs them, may fail)."""
    notebook = _notebook(todo, mutant)
    for other in _TODOS:
        if other != todo:
            _passes_its_hidden_check(other, notebook[other])


@contextlib.contextmanager
def _in_a_graded_test_cell(monkeypatch):
    """As while a notebook is graded, in a test cell: chapter 7's answers are tripwires
    wherever the library binds them (undone on leaving)."""
    answers = {id(vars(importlib.import_module(module))[qualname])
               for module, qualname in chapter_answers(_CHAPTER)}
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").split(".")[0] in ("course", "kernels"):
            for name, value in list(vars(module).items()):
                if id(value) in answers:
                    monkeypatch.setattr(module, name, value)  # restored when the test ends
    install_tripwires(_CHAPTER)
    borrowing.entering_test()
    try:
        yield
    finally:
        borrowing.leaving_test()


def test_a_wrong_kernel_costs_the_wrapper_nothing_while_graded(monkeypatch):
    """The lending above, with the course's kernels as grading makes them (tripwires) and the
    wrapper written in a notebook cell (so its launches are the learner's)."""
    tail_dropped = next(m for m, _ in MUTANTS["paged_attention_kernel"]
                        if m.__name__ == "tail_dropped")
    notebook = _notebook("paged_attention_kernel", tail_dropped)
    for function in (course_kernels.validate_inputs, course_kernels.paged_attention):
        exec(compile(inspect.getsource(function), "<notebook cell>", "exec"), notebook)
    with _in_a_graded_test_cell(monkeypatch):
        hidden.check_paged_attention_thoroughly(notebook["paged_attention"])


def test_the_compile_checks_process_keeps_nothing_of_one_kernel_for_the_next():
    """``compile_check.inspect_anywhere`` asks one process per kernel process, which imported
    Triton once and forks a child for each kernel: what a kernel's module does as it loads
    (here, a mark left on Triton) is gone for the next."""
    from kernels import compile_check

    kernel = course_kernels.paged_attention_kernel
    text = compile_check.source_of(kernel)
    names = list(inspect.signature(compile_check._function(kernel)).parameters)
    constants = json.dumps(compile_check.constants_for(names, dtype="fp16"), sort_keys=True)
    arguments = ("paged_attention_kernel", "fp16", constants, "sm_80 (A100)", False)
    leaves = "import triton\ntriton.left_behind = True\n" + text
    looks = "import triton\nassert not hasattr(triton, 'left_behind'), 'left behind'\n" + text
    first = json.loads(compile_check._inspect_source(leaves, *arguments))
    server = compile_check._Compiler._process.pid
    second = json.loads(compile_check._inspect_source(looks, *arguments))
    assert compile_check._Compiler._process.pid == server  # the same process answered both
    for answer in (first, second):
        assert not answer["error"] and answer["products"][0]["int64"], answer
