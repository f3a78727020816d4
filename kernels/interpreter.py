"""Triton's CPU interpreter, patching the language once per launch instead of once per call.

Under ``TRITON_INTERPRET=1`` a launch runs the kernel in Python: Triton first rebinds the
builtins of ``triton.language`` to NumPy versions (``interpreter._patch_lang``) and binds
them back when the launch ends. It patches again at every call of a ``@triton.jit`` function
from inside the kernel, and ``tl.sum``, ``tl.max``, ``tl.zeros`` and ``tl.cdiv`` are such
functions: each call walks every member of the language's modules (about a millisecond),
31% of chapter 7's hidden checks under ``cProfile`` and a fifth of their time without it.

Nothing binds the builtins back between two such calls of one launch, so patching the same
modules a second time rebinds the same names to the same NumPy versions: skipping it changes
nothing the kernel computes. Triton's own patch does everything else, as it would.

    launch ──► patch tl ── tl.sum ──► patch tl.core ── tl.max ──► (tl.core done) ── ... ──►
               bind back at the end of the launch: the next launch patches afresh

The modules that define kernels call ``patch_once_per_launch`` when imported (``split_kv``,
which the others launch through, and ``paged_attention_steps``), so a module of PyTorch
references (``paged_attention_ref``) still imports no Triton.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType


def patch_once_per_launch() -> None:
    """Under ``TRITON_INTERPRET=1``, make this process's Triton interpreter patch each set of
    language modules once per launch. Idempotent; does nothing on a GPU, or where Triton's
    interpreter is not built as assumed."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang", None)
    if patch is None or getattr(patch, "once_per_launch", False) or not hasattr(
            interpreter, "_LangPatchScope"):
        return
    interpreter._patch_lang = _once_per_launch(patch, interpreter)


def _once_per_launch(patch: Callable, interpreter: ModuleType) -> Callable:
    done: set[tuple[int, ...]] = set()  # the module sets patched since the launch began
    language = (interpreter.tl, interpreter.tl.core)

    class _EndOfLaunch:
        """A patch's scope: Triton binds the launch's back when the launch ends, and from
        then on every module set is patched afresh."""

        def __init__(self, scope) -> None:
            self.scope = scope

        def restore(self) -> None:
            done.clear()
            self.scope.restore()

    def patch_lang(fn: Callable):
        modules = tuple(id(v) for v in fn.__globals__.values()
                        if isinstance(v, ModuleType) and v in language)
        if modules in done:
            return interpreter._LangPatchScope()  # nothing patched, nothing to bind back
        scope = patch(fn)
        done.add(modules)
        return _EndOfLaunch(scope)

    patch_lang.once_per_launch = True
    return patch_lang
