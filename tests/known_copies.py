"""What the course's answers write twice, as (answer, the file that holds it again). A copy
that goes fails the tests as surely as a new one, so this list is always what is true; outside
the answer regions there is no copy at all.
"""

from __future__ import annotations

# Inside another chapter's answer region: a later TODO that writes again what an earlier one
# wrote (chapter 4's free is chapter 3's; chapter 9's kernel is chapter 7's program with a
# query per token, and its PyTorch attention gathers as chapter 6's does), so that revealing
# either chapter shows the other's answer. An edition names each one it ships.
SHARED = {
    ("course.v0.block_manager.BlockManager.free", "course/v0/prefix_cache.py"),
    ("course.v0.prefix_cache.PrefixCachingBlockManager.free", "course/v0/block_manager.py"),
    ("kernels.paged_attention_ref.paged_decode_attention", "kernels/varlen_attention_ref.py"),
    ("kernels.paged_attention.paged_attention_kernel", "kernels/varlen_attention.py"),
    ("kernels.paged_attention_steps.gqa_kernel", "kernels/varlen_attention.py"),
    ("kernels.split_kv.split_kv_kernel", "kernels/varlen_attention.py"),
    ("kernels.varlen_attention.varlen_attention_kernel", "kernels/paged_attention.py"),
    ("kernels.varlen_attention.varlen_attention_kernel", "kernels/paged_attention_steps.py"),
    ("kernels.varlen_attention.varlen_attention_kernel", "kernels/split_kv.py"),
}
