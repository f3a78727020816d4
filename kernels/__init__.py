"""Triton kernels, chapter 6's PyTorch versions and the kernel benchmark (chapters 6 and 7).

Kernel modules must be imported after ``course.setup()``: Triton reads ``TRITON_INTERPRET``
when a kernel is defined.
"""
