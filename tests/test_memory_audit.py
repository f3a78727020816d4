"""autograder.checks._memory_audit: on the interpreter, a wild store is written down and,
where it would land outside the tensor it writes, dropped; the arguments it would have
overwritten keep their values."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from autograder.checks._memory_audit import MemoryAudit
from course.notebook.paged_cases import on_gpu

pytestmark = pytest.mark.skipif(on_gpu(), reason="the audit records the CPU interpreter only")


@triton.jit
def _spills(out_ptr, lengths_ptr, spill: tl.constexpr, into: tl.constexpr):
    """Stores 8 lanes into out; ``spill`` more lanes ``into`` elements further on."""
    lanes = tl.arange(0, 16)
    offsets = tl.where(lanes < 8, lanes, into + lanes)
    tl.store(out_ptr + offsets, tl.full([16], 7, tl.int32), mask=lanes < 8 + spill)
    tl.store(lengths_ptr, tl.load(lengths_ptr))  # the lengths are an argument too


def _launch(spill: int, into: int | None = None):
    out = torch.zeros(8, dtype=torch.int32)
    lengths = torch.full((4,), 3, dtype=torch.int32)
    into = (lengths.data_ptr() - out.data_ptr()) // 4 - 8 if into is None else into
    with MemoryAudit() as audit:
        _spills[(1,)](out, lengths, spill, into)
    return out, lengths, audit


@pytest.mark.parametrize("spill", [0, 4, 7], ids=["none", "half-the-lengths", "seven-lanes"])
def test_a_store_is_performed_only_inside_the_argument_that_holds_most_of_its_lanes(spill):
    """Lanes that spill from out into another argument (the requests' lengths, as a launcher
    may allocate them next) are written down but dropped: the lengths stay as they were."""
    out, lengths, audit = _launch(spill)
    assert out.tolist() == [7] * 8
    assert lengths.tolist() == [3] * 4
    stores = [a for a in audit.accesses if a.kind == "store"]
    assert len(stores[0].addresses) == 8 + spill  # every lane written down, spilled or not
    assert len(audit.stray_loads([out], "store")) == (1 if spill else 0) + 1  # + lengths'


def test_a_store_past_every_argument_is_dropped():
    out, lengths, audit = _launch(4, into=1 << 20)
    assert out.tolist() == [7] * 8 and lengths.tolist() == [3] * 4
    assert audit.stray_loads([out, lengths], "store")
