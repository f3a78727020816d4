"""How the suite tells English prose from the names, numbers and code a Chinese notebook may
show (``tests/english.py``). The Chinese solutions themselves run top to bottom, from the
learner edition's wheel, in tests/test_wheel.py, which fails on any English sentence in what
they show; graded, hidden tests and all, in tests/test_zh_grading.py; what they say is checked
against the catalogues in tests/test_translations.py.
"""

from __future__ import annotations

import pytest
from english import english_labels, english_sentences


@pytest.mark.parametrize("text", [
    "a block was lost",
    "parallel sampling and beam search share blocks",
    "model        attention KV heads    per token  4,096 tokens",
    "AssertionError: a reference count differs from the tables holding it",
    "Least time of one decode step's attention",
    "until yours passes,\nthe cell runs the course's version",
    "<div>blue: shared by several requests, green: held by one</div>",
    "注意：the pool is full again, 它会抢占",
], ids=["a sentence", "a longer one", "a table's header", "after an exception's name",
        "with an apostrophe", "wrapped", "in HTML", "inside Chinese"])
def test_english_prose_is_found(text):
    assert english_sentences(text)


@pytest.mark.parametrize("text", [
    "the pool grows",
    "kv_bytes_per_token(config, 1) returned 4096",
    "BlockManager.allocate(seq_id, num_tokens) -> [0, 1, 2]",
    "3.12 GiB, 800.0 KiB, 25,650 blocks = 410,400 tokens",
    "`a block was lost` and `parallel sampling and beam search`",
    "course.v0.block_manager check_invariants free_blocks num_gpu_blocks",
    "%{x} tokens: %{y:.2f} GB<extra>Llama-3-8B</extra>",
    "{seq_id}: {len(table)} != {needed} ({block_size})",
    "Llama-3-8B Mistral-7B Qwen2.5-7B OPT-13B DeepSeek-V2",
    "solutions/zh_CN/03_block_manager.ipynb kernels/results/h100_sxm.json",
    "NotReady NoFreeBlocksError SwapSpaceFullError TinyModel PagedEngine",
    "使用你的 kv_bytes_per_sequence。注意：你的 BlockManager 还没有完成（某个方法抛出 "
    "NotImplementedError），所以这里展示的是课程自带版本的动画。",
    "聊天，500 token 系统提示词    60 个请求，TTFT P50 7264.2 ms，P99 12276.5 ms",
], ids=["three words", "code", "a call and its result", "numbers and units", "backticked code",
        "dotted and snake_case names", "a plotly format", "a template's holes", "model names",
        "file paths", "CamelCase names", "Chinese with identifiers", "Chinese with units"])
def test_code_names_numbers_and_chinese_are_not_prose(text):
    assert english_sentences(text) == []


@pytest.mark.parametrize(("text", "labels"), [
    ("写入完成后找到： 2 of 3", ["of"]),
    ("OPT-13B，16 个 token：加载 0.54 ms，load: True", ["load"]),
    ("CPU 存储级 400 blocks, LRU   命中率  43.2%", ["blocks"]),
    ("gpt-oss-120b  36  18 sliding window (128 tokens)", ["sliding", "window"]),
    ("multi-turn, all full", ["multi-turn", "all", "full"]),
], ids=["a count", "a label before a value", "a unit of the course's", "a table's cell",
        "a chart's legend"])
def test_english_labels_are_found(text, labels):
    assert english_labels(text) == labels


@pytest.mark.parametrize("text", [
    "写入完成后找到：2/3",
    "每个 token 36,864 字节；最大 logit 差 7.2e-06",
    "gpt-oss-120b: https://huggingface.co/openai/gpt-oss-120b (sliding_window if layer_idx % 2)",
    "18 滑动窗口（128 个 token），18 全注意力；null 块",
    "`free` 之后 manager.allocate(seq_id, 3) 返回 True",
    "allocate 通过了可见测试。使用你的 free_skipped_blocks。",
    "     4    40  recompute       24 ...      2    90       swap       24",
], ids=["a count in Chinese", "words the Chinese text keeps", "a source cited",
        "glossary terms", "code", "a TODO's name", "a value as the code spells it"])
def test_chinese_with_names_and_kept_words_has_no_label(text):
    assert english_labels(text) == []
