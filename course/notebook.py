"""Helpers for notebook cells that use the learner's own code when it is ready."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def grading() -> bool:
    """True while nbgrader executes the notebook: animations and heavy plots skip themselves."""
    return bool(os.environ.get("NBGRADER_EXECUTION"))


def learner_or_reference(
    learner: Callable[..., Any], reference: Callable[..., Any], **probe: Any
) -> Callable[..., Any]:
    """The learner's function if it runs and agrees with the reference on ``probe``.

    Otherwise the reference, with a printed note, so a picture never breaks because a TODO
    is unfinished (and never shows a wrong picture without saying so).
    """
    name = getattr(learner, "__name__", "your function")
    try:
        agrees = _same(learner(**probe), reference(**probe))
    except NotImplementedError:
        print(f"Note: {name} is not written yet, so this uses the course's reference version.")
        return reference
    except Exception as exc:
        print(f"Note: {name} raised {type(exc).__name__} ({exc}), "
              "so this uses the course's reference version.")
        return reference
    if not agrees:
        print(f"Note: {name} disagrees with the reference (see its test cell), "
              "so this uses the course's reference version.")
        return reference
    print(f"Using your {name}.")
    return learner


def _same(a: Any, b: Any) -> bool:
    """Equal values; tensors equal within float tolerance."""
    if hasattr(a, "shape") and hasattr(b, "shape"):
        import torch

        return a.shape == b.shape and bool(torch.allclose(a.double(), b.double(), atol=1e-4,
                                                          rtol=1e-3, equal_nan=True))
    return bool(a == b)
