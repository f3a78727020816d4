"""The Chinese notebooks as a learner meets them: each solution (its hidden tests cleared, as
on release) runs top to bottom, charts and widgets included, and speaks Chinese. Graded, hidden
tests and all, they are tested in tests/test_zh_grading.py; what they say is checked against
the catalogues in tests/test_translations.py.
"""

from __future__ import annotations

import pytest
from conftest import CHAPTERS
from notebook_variants import without_hidden_tests
from run_notebooks import errors, execute

ZH = "zh_CN"


@pytest.mark.notebook
@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.name)
def test_a_chinese_solution_runs_top_to_bottom_in_chinese(chapter, tmp_path):
    path = without_hidden_tests(chapter.source_in(ZH), tmp_path / chapter.source.name)
    notebook = execute(path, tmp_path)
    assert errors(notebook) == {}
    setup = next(c for c in notebook.cells if c.cell_type == "code")
    said = "".join(o.get("text", "") for o in setup.outputs)
    assert "解释器" in said or "GPU 模式" in said, said  # the set-up line, in Chinese
