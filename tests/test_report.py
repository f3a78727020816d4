"""The report the grader prints: its table aligned, and its hints wrapped, by the columns of a
terminal (where a Chinese character takes two)."""

from __future__ import annotations

import re

from autograder.hints import in_language
from autograder.host import report
from course.language import columns

ZH = "zh_CN"
CHINESE = ("`allocate(seq_id, num_tokens)` 必须整体成功或整体失败：先用 num_free_blocks() 算出"
           "这个序列需要的块数，空闲池不够时抛出 MemoryError，并且不从 free_blocks 里取走任何块；"
           "够的话再逐块取出，写进 block_tables[seq_id]，每块的 ref_counts 设为 1。之后 "
           "append_slot(seq_id) 只在最后一块写满时才取新块，fork(parent_id, child_id) "
           "只复制块表并把每块的引用计数加一，copy_on_write 在写入共享块之前先复制它。")
ENGLISH = ("append_slot(seq_id) took a new block from the free pool although the last block of "
           "the sequence still had room for 3 tokens: a sequence of 9 tokens with block_size=4 "
           "holds ceil(9 / 4) = 3 blocks, and the tenth token goes into the third block, not a "
           "fourth; compare num_tokens % block_size with 0 before you take one.")


def _report() -> list[str]:
    return report.format_report(report.NotebookResult("03_block_manager.ipynb", "03", "CPU", [
        report.TestResult("ch03_allocate", 0, 2, False, CHINESE),
        report.TestResult("ch03_append_slot_copy_on_write", 1, 3, False, ENGLISH),
        report.TestResult("ch03_free", 2, 2, True, "")], language=ZH)).splitlines()


def _hints(lines: list[str]) -> list[str]:
    """Each hint of the report, its lines (their indent taken off) joined by newlines."""
    lead = "      " + in_language("hint:", ZH) + " "
    hints: list[str] = []
    for line in lines:
        if line.startswith(lead):
            hints.append(line[len(lead):])
        elif line.startswith(" " * 12):
            hints[-1] += "\n" + line[12:]
    return hints


def test_a_hint_wraps_by_columns_between_chinese_characters_never_inside_a_word():
    lines = _report()
    hints = _hints(lines)
    assert len(hints) == 2 and all("\n" in hint for hint in hints)  # each takes lines
    assert max(columns(line) for line in lines) <= report.WIDTH
    for hint, message in zip(hints, [CHINESE, ENGLISH], strict=True):
        assert re.sub(r"\s", "", hint) == re.sub(r"\s", "", message)
        # a word, an identifier or `code` cut at a line's end would read as two
        assert re.findall(r"[!-~]+", hint) == re.findall(r"[!-~]+", message)
        assert not hint.startswith(("，", "。")) and "\n，" not in hint and "\n。" not in hint
    assert " ".join(hints[1].split()) == ENGLISH


def test_the_table_s_columns_align_by_columns_when_it_speaks_chinese():
    header, *rows = [line for line in _report()[1:-1] if not line.startswith(" " * 6)]
    assert re.search(r"[\u4e00-\u9fff]", header + rows[0])  # the headings and verdicts translated
    # the points column ends, and the verdict begins, at one column on every line
    assert {columns(line.rsplit("  ", 1)[0]) for line in [header, *rows]} == {
        columns(f"  {'ch03_append_slot_copy_on_write'}  {'1 / 3':>9}")}


def test_the_report_names_the_interpreter_in_its_readers_language(monkeypatch):
    """The first line says where the notebook was graded: Triton's interpreter in the
    language of the report, a GPU by its name."""
    from course.runtime import detect

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    label = detect().label  # what a grading process records
    first = report.format_report(report.NotebookResult(
        "03_block_manager.ipynb", "03", label, [], language=ZH)).splitlines()[0]
    assert "Triton CPU 解释器" in first and "interpreter" not in first, first
    assert label in report.format_report(report.NotebookResult(
        "03_block_manager.ipynb", "03", label, [], language="en"))
    assert "NVIDIA H100 (CUDA)" in report.format_report(report.NotebookResult(
        "03_block_manager.ipynb", "03", "NVIDIA H100 (CUDA)", [], language=ZH))
