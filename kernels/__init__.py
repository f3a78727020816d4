"""Triton kernels, chapter 6's PyTorch versions and the kernel benchmark (chapters 6 and 7).

Kernel modules must be imported after ``course.setup()``: Triton reads ``TRITON_INTERPRET``
when a kernel is defined. Under the interpreter, importing this package also makes Triton
patch its language once per launch rather than at every call of ``tl.sum`` and its kind
(``kernels.interpreter``): the kernels compute the same, sooner.
"""

import os

if os.environ.get("TRITON_INTERPRET") == "1":
    from kernels.interpreter import patch_once_per_launch

    patch_once_per_launch()
