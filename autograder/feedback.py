"""A learner's feedback page: their graded notebook as HTML, with the score of every test and
each failing test's hint, but not the source of the hidden tests or Python tracebacks."""

from __future__ import annotations

import copy
import html
import re
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter
from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

from autograder.hints import in_language
from autograder.report import VERDICTS, NotebookResult

_HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", re.S)


def feedback_notebook(executed: dict, result: NotebookResult) -> nbformat.NotebookNode:
    """The executed notebook with a score table on top, hidden-test regions removed from the
    test cells, and every error output replaced by its test's hint."""
    def say(text: str) -> str:
        return in_language(text, result.language)

    notebook = nbformat.from_dict(copy.deepcopy(executed))
    by_id = {t.id: t for t in result.tests}
    for cell in notebook.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.cell_type != "code":
            continue
        cell.source = _HIDDEN.sub("# (hidden tests)\n", cell.source)
        test = by_id.get(grade_id)
        kept = [o for o in cell.get("outputs", []) if o.get("output_type") != "error"]
        if test is not None and not test.passed:
            kept.append(nbformat.v4.new_output("stream", name="stdout",
                                               text=say("FAILED:") + f" {test.message}\n"))
        cell.outputs = kept
    rows = "".join(
        f"<tr><td>{html.escape(t.id)}</td><td>{t.points:g} / {t.max_points:g}</td>"
        f"<td>{say('pass') if t.passed else html.escape(t.message)}</td></tr>"
        for t in result.tests)
    summary = (f"<h2>{html.escape(result.chapter)}: {result.score:g} / {result.max_score:g}"
               f"</h2><p>{html.escape(say(f'graded on {result.runtime}'))}</p><table><tr>"
               f"<th>{say('test')}</th><th>{say('points')}</th><th>{say('result')}</th></tr>"
               f"{rows}</table>")
    notebook.cells.insert(0, nbformat.v4.new_markdown_cell(summary))
    return notebook


def write_feedback(executed: dict, result: NotebookResult, destination: Path) -> None:
    destination.parent.mkdir(parents=True, exist_ok=True)
    body, _ = HTMLExporter().from_notebook_node(feedback_notebook(executed, result))
    destination.write_text(body, encoding="utf-8")


class HideHiddenTests(Preprocessor):
    """For nbgrader's own ``generate_feedback`` (``course-dir`` configures it): hidden-test
    regions leave the test cells, and every error output becomes its one-line message (a
    failing check's hint), with no traceback."""

    enabled = Bool(True)  # nbconvert's preprocessors are off unless enabled

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code":
            cell.source = _HIDDEN.sub("# (hidden tests)\n", cell.source)
            cell.outputs = [_without_traceback(o) for o in cell.get("outputs", [])]
        return cell, resources


def _without_traceback(output):
    if output.get("output_type") != "error":
        return output
    name, value = output.get("ename", ""), output.get("evalue", "")
    text = value if name in VERDICTS and value else f"{name}: {value}"
    return nbformat.v4.new_output("stream", name="stdout", text=f"FAILED: {text}\n")
