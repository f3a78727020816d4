"""Triton's CPU interpreter, without two kinds of work whose result it throws away.

**The language, patched once per launch.** Under ``TRITON_INTERPRET=1`` a launch runs the
kernel in Python: Triton first rebinds the builtins of ``triton.language`` to NumPy versions
(``interpreter._patch_lang``) and binds them back when the launch ends. It patches again at
every call of a ``@triton.jit`` function from inside the kernel, and ``tl.sum``, ``tl.max``,
``tl.zeros`` and ``tl.cdiv`` are such functions: each call walks every member of the
language's modules (about a millisecond), 31% of chapter 7's hidden checks under ``cProfile``
and a fifth of their time without it.

Nothing binds the builtins back between two such calls of one launch, so patching the same
modules a second time rebinds the same names to the same NumPy versions: skipping it changes
nothing the kernel computes. Triton's own patch does everything else, as it would.

    launch ──► patch tl ── tl.sum ──► patch tl.core ── tl.max ──► (tl.core done) ── ... ──►
               bind back at the end of the launch: the next launch patches afresh

**No overflow checks that nothing reads.** Triton's front end sanitizes integer overflow:
each 32-bit ``+``, ``-`` and ``*`` (a kernel's index arithmetic, mostly) is done again in 64
bits, compared with the 32-bit bounds, and the comparison handed to ``device_assert``, which
does nothing unless the builder's options ask for debugging (``semantic.device_assert``), and
the interpreter's never do (``InterpreterOptions.debug`` is False; nothing sets it). The
interpreter runs those operations in Python like every other: a third of chapter 7's hidden
checks under ``cProfile``. Where debugging is off, overflow sanitizing is turned off in the
interpreter's options: the operations are not built, and nothing a kernel computes or raises
changes.

The modules that define kernels call ``lighten`` when imported (``split_kv``, which the others
launch through, and ``paged_attention_steps``), so a module of PyTorch references
(``paged_attention_ref``) still imports no Triton.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from types import ModuleType


def lighten() -> None:
    """Under ``TRITON_INTERPRET=1``, make this process's Triton interpreter patch each set of
    language modules once per launch and build no overflow check that nothing reads.
    Idempotent; does nothing on a GPU, nor where Triton's interpreter is not built as
    assumed."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    from triton.runtime import interpreter

    _patch_once_per_launch(interpreter)
    _no_unread_overflow_checks(interpreter)


def _no_unread_overflow_checks(interpreter: ModuleType) -> None:
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if dataclasses.is_dataclass(options) and getattr(options, "debug", True) is False and \
            getattr(options, "sanitize_overflow", False):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)


def _patch_once_per_launch(interpreter: ModuleType) -> None:
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
