"""The guard every attention check runs first: the output is a tensor, of the right shape, in
the query's dtype. One wording for chapters 6, 7 and 9, so one translation."""

from __future__ import annotations

import torch

from course.notebook.paged_cases import dtype_name


def _what(out: object) -> str:
    if isinstance(out, torch.Tensor):
        return f"a tensor of shape {tuple(out.shape)}"
    return "None" if out is None else f"an object of type {type(out).__name__}"


def expect_attention_output(out: object, call: str, case: str, query: torch.Tensor,
                            shape: tuple[int, ...] | None = None, layout: str = "",
                            idea: str = "") -> None:
    """Nothing if ``out``, returned by ``call`` (``"paged_attention(...)"``) on the case
    ``case`` describes, is a tensor of ``shape`` (the query's by default) in the query's
    dtype; otherwise an AssertionError that says what came back. ``layout`` says what the shape
    holds (``" (one row per packed query token)"``); ``idea`` closes the shape's hint."""
    shape = tuple(query.shape) if shape is None else shape
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != shape:
        raise AssertionError(f"{call} on {case} returned {_what(out)}, expected a tensor of "
                             f"shape {shape}{layout}." + (f" {idea}" if idea else ""))
    if out.dtype != query.dtype:
        raise AssertionError(f"{call} on {case} returned {dtype_name(out.dtype)} for a "
                             f"{dtype_name(query.dtype)} query: the output is in the query's "
                             "dtype (the arithmetic in between is fp32).")
