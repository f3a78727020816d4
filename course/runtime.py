"""Where the course's kernels run: a CUDA GPU, or Triton's interpreter on the CPU.

``setup()`` is the first code cell of every notebook. Without a GPU it sets
``TRITON_INTERPRET=1``, which ``@triton.jit`` reads when a kernel is *defined*, so it must run
before any kernel module is imported; it says so if that already happened.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from course.language import choose, tr, tr_later


@dataclass(frozen=True)
class Runtime:
    """What executes the course's Triton kernels."""

    mode: str  # "gpu" or "interpreter"
    device: str  # "cuda" or "cpu": where the notebooks put their tensors
    label: str  # a few words, for grading reports: the GPU's name, or the interpreter
    description: str  # one line, for notebooks

    @property
    def is_gpu(self) -> bool:
        return self.mode == "gpu"


# Device files a GPU driver makes (NVIDIA's; AMD's for ROCm): without any, there is no GPU to
# find, and the answer needs no torch import (a second or more, which notebooks that never
# touch a tensor need not pay).
_GPU_DEVICES = ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/kfd")


def gpu_name() -> str | None:
    """The first CUDA GPU's name, or None (without importing torch where no GPU driver is
    there)."""
    if not any(os.path.exists(path) for path in _GPU_DEVICES):
        return None
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def detect() -> Runtime:
    """Look for a CUDA GPU; change nothing."""
    name = gpu_name() if os.environ.get("TRITON_INTERPRET") != "1" else None
    if name is not None:
        return Runtime("gpu", "cuda", f"{name} (CUDA)",
                       tr(f"GPU mode: Triton kernels compile for {name}"))
    return Runtime(
        "interpreter",
        "cpu",
        tr_later("Triton CPU interpreter (no CUDA GPU)"),  # a report says it in its language
        tr("Triton CPU interpreter mode (no CUDA GPU): kernels run on CPU tensors, correctly "
           "but far slower than on a GPU, so the notebooks use small shapes and skip timings"),
    )


# Optional packages jsonschema loads, if installed, to check string formats (JupyterLab's
# environment has them all): rfc3987_syntax builds a URI grammar as it is imported (about one
# and a half seconds of CPU); the others hold about 3 MiB in every process that loads them.
_FORMAT_CHECKERS = ("rfc3987_syntax", "arrow", "isoduration", "webcolors", "uri_template",
                    "fqdn")


def without_format_checkers() -> None:
    """Keep jsonschema from loading its optional format checkers in this process: call before
    nbformat is first imported.

    jsonschema, which nbformat loads, imports a checker for each string format whose package
    is installed, the URI grammar's among them, for format checks nbformat never asks for (it
    validates without format checking). A notebook pays it at its first chart, plotly's
    renderer importing nbformat; nbgrader and the grader pay it at their start. Marking the
    packages absent makes jsonschema skip those formats; nothing else changes."""
    for package in _FORMAT_CHECKERS:
        sys.modules.setdefault(package, None)


def setup(quiet: bool = False, language: str | None = None) -> Runtime:
    """Choose GPU or interpreter mode for this kernel and print one line saying which;
    choose the language the course speaks (``course.language.choose``: ``language``, else
    ``KV_COURSE_LANGUAGE``, else English)."""
    without_format_checkers()  # the notebook's first chart comes sooner
    choose(language)
    runtime = detect()
    if not runtime.is_gpu:
        # kernels defined while it was already set (by an earlier call, or by the grader's
        # warm kernels, which import them first) run on the interpreter: nothing to say
        was_set = os.environ.get("TRITON_INTERPRET") == "1"
        os.environ["TRITON_INTERPRET"] = "1"
        early = [] if was_set else sorted(
            name for name, module in list(sys.modules.items())
            if name.split(".")[0] == "kernels" and _defines_kernels(module))
        if early:
            print(tr(f"Note: {', '.join(early)} was imported before course.setup(); restart "
                     "the kernel and run this cell first so its kernels use the interpreter."))
    if not quiet:
        print(runtime.description + tr("."))  # a full stop in the chosen language
    return runtime


def _defines_kernels(module: object) -> bool:
    return any(type(v).__name__ == "JITFunction" for v in vars(module).values())
