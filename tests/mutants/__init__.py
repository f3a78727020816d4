"""Wrong implementations, each with the hint its check must give: every check must catch one.

Each chapter's module also holds ``RULES``: every rule the chapter's notebook states about a
TODO, quoted as the notebook words it, with the mutants that break that rule alone (and so
must fail that TODO's checks: ``tests/test_checks.py`` runs every mutant).
"""

from __future__ import annotations

import atexit
import importlib.util
import inspect
import shutil
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

_KERNELS = Path(tempfile.mkdtemp(prefix="kernel-mutants-"))
atexit.register(shutil.rmtree, _KERNELS, ignore_errors=True)  # once no kernel runs


@dataclass(frozen=True)
class Rule:
    """A rule the notebook states (``quote``, words of the English solution notebook), the
    TODO it binds, and the names of the mutants in ``MUTANTS[todo]`` that break it alone."""

    quote: str
    todo: str
    mutants: tuple[str, ...]


def kernel_mutant(kernel, name: str, old: str, new: str, times: int = 1):
    """The Triton ``kernel`` with ``old`` (which must occur ``times`` times in its source)
    replaced by ``new``, renamed ``name``: written to a file of its own and imported from
    there, since Triton compiles a kernel from its source file."""
    source = textwrap.dedent(inspect.getsource(kernel.fn))
    assert source.count(old) == times, f"{old!r} is not in {kernel.__name__} {times} time(s)"
    source = source.replace(old, new).replace(f"def {kernel.__name__}(", f"def {name}(")
    path = _KERNELS / f"{kernel.__name__}__{name}.py"
    path.write_text("import triton\nimport triton.language as tl\n\n\n" + source)
    spec = importlib.util.spec_from_file_location(f"kernel_mutants.{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)
