"""The Chinese notebooks as a learner meets them: each solution (its hidden tests cleared, as
on release) runs top to bottom, charts and widgets included, and speaks Chinese: no English
sentence in anything it shows (tests/english.py says what one is). Graded, hidden tests and
all, they are tested in tests/test_zh_grading.py; what they say is checked against the
catalogues in tests/test_translations.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import nbformat
import pytest
from conftest import CHAPTERS
from english import english_sentences
from notebook_variants import without_hidden_tests
from run_notebooks import errors, execute

ZH = "zh_CN"
PLOTLY = "application/vnd.plotly.v1+json"
WIDGETS = "application/vnd.jupyter.widget-state+json"
# What a plotly figure shows a reader: titles (axes', legends' and annotations' too), trace
# names, hover templates and texts drawn beside the marks. Its theme (``template``) is not
# text.
FIGURE_TEXTS = ("title", "text", "name", "hovertemplate", "hovertext", "texttemplate",
                "ticktext")


def _figure_texts(value: object, where: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key != "template":
                yield from _figure_texts(item, f"{where}.{key}" if where else key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _figure_texts(item, f"{where}[{index}]")
    elif isinstance(value, str) and where.rsplit(".", 1)[-1].split("[")[0] in FIGURE_TEXTS:
        yield where, value


def shown(notebook: nbformat.NotebookNode) -> Iterator[tuple[str, str, str]]:
    """(cell, output, text) for every text an executed notebook shows: streams, text data,
    errors, a plotly figure's texts, and the widgets' state (a widget's first view)."""
    for index, cell in enumerate(notebook.cells):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        name = f"cell {index}" + (f" ({grade_id})" if grade_id else "")
        for number, output in enumerate(cell.get("outputs", [])):
            if output.output_type == "stream":
                yield name, f"output {number} ({output.name})", output.text
            elif output.output_type == "error":
                yield name, f"output {number} (error)", f"{output.ename}: {output.evalue}"
            for kind, data in output.get("data", {}).items():
                if kind == PLOTLY:
                    for where, text in _figure_texts(data):
                        yield name, f"output {number} (plotly {where})", text
                elif kind.startswith("text/"):
                    yield name, f"output {number} ({kind})", data
    state = notebook.metadata.get("widgets", {}).get(WIDGETS, {}).get("state", {})
    for model_id, model in state.items():
        for key in ("value", "description", "tooltip", "placeholder"):
            if isinstance(model["state"].get(key), str):
                yield "widgets", f"{model['model_name']} {model_id} ({key})", model["state"][key]


@pytest.mark.notebook
@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.name)
def test_a_chinese_solution_runs_top_to_bottom_in_chinese(chapter, tmp_path):
    path = without_hidden_tests(chapter.source_in(ZH), tmp_path / chapter.source.name)
    notebook = execute(path, tmp_path)
    assert errors(notebook) == {}
    setup = next(c for c in notebook.cells if c.cell_type == "code")
    said = "".join(o.get("text", "") for o in setup.outputs)
    assert "解释器" in said or "GPU 模式" in said, said  # the set-up line, in Chinese
    english = [f"{cell}, {output}: {sentence!r}" for cell, output, text in shown(notebook)
               for sentence in english_sentences(text)]
    assert not english, (f"{len(english)} English sentences in {chapter.name}'s outputs, "
                         "in Chinese:\n" + "\n".join(english[:30]))


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
    "course.block_manager check_invariants free_blocks num_gpu_blocks",
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
