"""What the course still writes twice, as (answer, the file that holds it again): each entry
goes when the one engine of chapters 9 on (and its one variable-length kernel path) lands. A
copy that goes fails the tests as surely as a new one, so these lists are always what is true.
"""

from __future__ import annotations

# Outside any answer region: chapter 10's variable-length window kernel and its reference
# repeat chapter 9's variable-length path (and so chapter 7's kernel).
KNOWN = {
    ("kernels.paged_attention.paged_attention_kernel", "kernels/sliding_window_varlen.py"),
    ("kernels.paged_attention_steps.gqa_kernel", "kernels/sliding_window_varlen.py"),
    ("kernels.split_kv.split_kv_kernel", "kernels/sliding_window_varlen.py"),
    ("kernels.varlen_attention.varlen_attention_kernel", "kernels/sliding_window_varlen.py"),
    ("kernels.varlen_attention_ref.varlen_paged_attention", "kernels/sliding_window_varlen.py"),
    ("kernels.sliding_window_attention.sliding_window_kernel",
     "kernels/sliding_window_varlen.py"),
}

# Inside another chapter's answer region: a later TODO that writes again what an earlier one
# wrote (chapter 4's free is chapter 3's; chapters 9 and 10 write chapter 7's kernel again), so
# that revealing either chapter shows the other's answer. An edition names each one it ships.

SHARED = {
    ("course.block_manager.BlockManager.free", "course/prefix_cache.py"),
    ("course.prefix_cache.PrefixCachingBlockManager.free", "course/block_manager.py"),
    ("kernels.paged_attention_ref.paged_decode_attention", "kernels/varlen_attention_ref.py"),
    ("kernels.paged_attention.paged_attention_kernel", "kernels/sliding_window_attention.py"),
    ("kernels.paged_attention.paged_attention_kernel", "kernels/varlen_attention.py"),
    ("kernels.paged_attention_steps.gqa_kernel", "kernels/sliding_window_attention.py"),
    ("kernels.paged_attention_steps.gqa_kernel", "kernels/varlen_attention.py"),
    ("kernels.split_kv.split_kv_kernel", "kernels/sliding_window_attention.py"),
    ("kernels.split_kv.split_kv_kernel", "kernels/varlen_attention.py"),
    ("kernels.sliding_window_attention.sliding_window_kernel", "kernels/paged_attention.py"),
    ("kernels.sliding_window_attention.sliding_window_kernel", "kernels/paged_attention_steps.py"),
    ("kernels.sliding_window_attention.sliding_window_kernel", "kernels/split_kv.py"),
    ("kernels.sliding_window_attention.sliding_window_kernel", "kernels/varlen_attention.py"),
    ("kernels.varlen_attention.varlen_attention_kernel", "kernels/paged_attention.py"),
    ("kernels.varlen_attention.varlen_attention_kernel", "kernels/paged_attention_steps.py"),
    ("kernels.varlen_attention.varlen_attention_kernel", "kernels/sliding_window_attention.py"),
    ("kernels.varlen_attention.varlen_attention_kernel", "kernels/split_kv.py"),
}
