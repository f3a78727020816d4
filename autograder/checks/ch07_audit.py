"""What the interpreter saw a chapter 7 kernel do wrong, as a hint: a store into another
program's output, a block-table entry read past what a sequence needs, an address outside
every argument (``_memory_audit`` records them). Chapter 9's varlen kernel is audited with the
same findings.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable

import numpy as np
import torch

from autograder.checks._memory_audit import MemoryAudit, nearest
from course.notebook.paged_cases import KernelCase, PagedCase


@contextlib.contextmanager
def quiet():
    """NumPy's floating-point warnings off: a wrong kernel's NaN arithmetic on the
    interpreter would print them to stderr, which nbgrader scores as a failed cell."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


# --- what the interpreter saw ------------------------------------------------------------------


def _program(program: tuple[int, ...], per_query_head: bool) -> str:
    return (f"program (seq {program[0]}, {'query' if per_query_head else 'KV'} head "
            f"{program[1]})")


def store_finding(audit: MemoryAudit, out: torch.Tensor, owns: Callable, who: Callable,
                  label: str, rows: int, columns: int) -> str:
    """The first store into ``out`` (a contiguous tensor named ``label``) outside the storing
    program's own elements (``owns(program, index) -> bool array``), or a store that writes
    one element twice; '' if none. ``rows``/``columns``: the real rows and columns of a
    program's tile, to say which padding spilled."""
    for access, offsets, inside in audit.touching(out, "store"):
        where = offsets[inside]
        if ((where < 0) | (where >= out.numel())).any():
            return f"{who(access.program)} wrote outside {label}"
        index = np.unravel_index(where, tuple(out.shape))
        own = owns(access.program, index)
        values, counts = np.unique(where, return_counts=True)
        culprit = ~own if not own.all() else np.isin(where, values[counts > 1])
        if not culprit.any():
            continue
        first = int(np.argmax(culprit))
        element = "[" + ", ".join(str(int(i[first])) for i in index) + "]"
        lanes = [lane[inside] for lane in access.lanes]
        spill = ""
        if lanes and (lanes[-1][culprit] >= columns).any():
            spill = (": the tile's columns past HEAD_DIM (its padding) ran into the next "
                     "head's row; only the HEAD_DIM real columns are stored")
        elif len(lanes) == 2 and (lanes[0][culprit] >= rows).any():
            spill = (": the tile's padding rows past GROUP were stored into another group's "
                     "heads; only the GROUP real rows are stored")
        if not own.all():
            return (f"{who(access.program)} wrote {label}{element}, which belongs to another "
                    f"program{spill} (the interpreter runs programs one after another, so "
                    "that program overwrote it here; on a GPU the two race)")
        return f"{who(access.program)} wrote {label}{element} twice in one store{spill}"
    return ""


def _table_finding(audit: MemoryAudit, case: KernelCase, allowed: Callable, who: Callable
                   ) -> str:
    """The first block-table read outside ``allowed(program) -> (row, first, stop)``."""
    stride = case.tables.stride(0)
    width = case.tables.shape[1]
    for access, offsets, inside in audit.touching(case.tables, "load"):
        row, first, stop = allowed(access.program)
        for offset in offsets[inside]:
            r, c = divmod(int(offset), stride)
            if r == row and first <= c < stop:
                continue
            length = case.lengths[row]
            if r == row and c < first:
                return (f"{who(access.program)} read block_tables[{r}, {c}], before the "
                        f"entries it needs ({first} to {stop - 1}): the query of sequence {r} "
                        "never reads those blocks, whose entries may name the null block")
            if r != row:
                return (f"{who(access.program)} read block_tables[{r}, {c}], in sequence {r}'s "
                        f"row: sequence {row}'s row starts {row} x stride_table_seq entries in")
            past = "past the end of the row, " if c >= width else ""
            return (f"{who(access.program)} read block_tables[{r}, {c}], {past}outside the "
                    f"entries it needs ({first} to {stop - 1}; sequence {row} has length "
                    f"{length}, {case.blocks(row)} block(s) of {case.block_size}): the table "
                    "may end after a sequence's last block (the K/V loads of an extra block "
                    "are masked, so the output does not show it)")
    return ""


def _stray_finding(audit: MemoryAudit, case: PagedCase, who: Callable,
                   extra: dict[str, torch.Tensor]) -> str:
    """The first store, then load, at an address in none of the case's tensors and
    ``extra``'s (a kernel's other arguments), as a hint; '' if none."""
    tensors = {"query": case.query, "k_cache": case.k_cache, "v_cache": case.v_cache,
               "block_tables": case.tables, "seq_lens": case.seq_lens} | extra
    for kind in ("store", "load"):
        found = audit.stray_loads(list(tensors.values()), kind)
        if found:
            access, address = found[0]
            program, near = who(access.program), nearest(tensors, address)
            if kind == "store":
                return f"{program} wrote memory outside every argument ({near})"
            return f"{program} read memory outside every argument ({near})"
    return ""


def decode_audit(audit: MemoryAudit, case: KernelCase, out, per_query_head: bool,
                 first_block: Callable[[int], int] = lambda seq: 0) -> Callable[[], str]:
    """What the interpreter saw a decode kernel do wrong, as a hint ('' if nothing); a
    sequence's table entries before ``first_block(seq)`` are not its to read (a sliding
    window's)."""
    def seen() -> str:
        if not audit.active or not isinstance(out, torch.Tensor) or \
                out.shape != case.query.shape or not out.is_contiguous():
            return ""
        group = case.q_heads // case.kv_heads

        def who(program):
            return _program(program, per_query_head)

        def owns(program, index):
            seq, head = index[0], index[1]
            first, count = (program[1], 1) if per_query_head else (program[1] * group, group)
            return (seq == program[0]) & (head >= first) & (head < first + count)

        return (store_finding(audit, out, owns, who, "out", group, case.head_dim)
                or _table_finding(audit, case,
                                  lambda p: (p[0], first_block(p[0]), case.blocks(p[0])), who)
                or _stray_finding(audit, case, who, {"out": out}))
    return seen


def split_audit(audit: MemoryAudit, case: KernelCase, partials, num_splits: int
                ) -> Callable[[], str]:
    """What the interpreter saw a split kernel do wrong, as a hint ('' if nothing)."""
    def seen() -> str:
        if not audit.active or not isinstance(partials, tuple) or len(partials) != 3:
            return ""
        group = case.q_heads // case.kv_heads
        per_split = -(-case.tables.shape[1] // num_splits)

        def who(program):
            return f"program (seq {program[0]}, KV head {program[1]}, split {program[2]})"

        def owns(program, index):
            seq, head, split = index[0], index[1], index[2]
            return ((seq == program[0]) & (head // group == program[1])
                    & (split == program[2]))

        def allowed(program):
            first = program[2] * per_split
            return program[0], first, min(first + per_split, case.blocks(program[0]))

        for label, tensor in zip(("the m partials", "the l partials", "the acc partials"),
                                 partials, strict=True):
            found = store_finding(audit, tensor, owns, who, label, group, case.head_dim)
            if found:
                return found
        return (_table_finding(audit, case, allowed, who)
                or _stray_finding(audit, case, who, dict(zip("mla", partials, strict=True))))
    return seen


def merge_audit(audit: MemoryAudit, out) -> Callable[[], str]:
    def seen() -> str:
        if not audit.active or not isinstance(out, torch.Tensor) or out.dim() != 3:
            return ""

        def owns(program, index):
            return (index[0] == program[0]) & (index[1] == program[1])

        return store_finding(audit, out, owns,
                              lambda p: f"program (seq {p[0]}, query head {p[1]})", "out", 1,
                              out.shape[2])
    return seen


