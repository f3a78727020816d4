"""A learner's feedback page, as nbgrader's ``generate_feedback`` writes it with the course's
configuration (``autograder.host.configuration``): their graded notebook with the score of every
test, each failing test's hint, but not the source of the hidden tests or Python tracebacks."""

from __future__ import annotations

import re

import nbformat
from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

from autograder.hints import in_language
from autograder.host.report import NOT_GRADED, VERDICTS
from course.language import ENGLISH

_HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", re.S)


class HideHiddenTests(Preprocessor):
    """For nbgrader's ``generate_feedback``: hidden-test regions leave the test cells, and
    every error output becomes its one-line message (a failing check's hint, or why the
    notebook was not run), with no traceback, in the notebook's language."""

    enabled = Bool(True)  # nbconvert's preprocessors are off unless enabled

    def preprocess(self, nb, resources):
        self._language = nb.get("metadata", {}).get("course", {}).get("language", ENGLISH)
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code":
            hidden = in_language("# (hidden tests)", self._language) + "\n"
            cell.source = _HIDDEN.sub(lambda found: hidden, cell.source)
            cell.outputs = [self._without_traceback(o) for o in cell.get("outputs", [])]
        return cell, resources

    def _without_traceback(self, output):
        if output.get("output_type") != "error":
            return output
        name, value = output.get("ename", ""), output.get("evalue", "")
        text = value if name in (*VERDICTS, NOT_GRADED) and value else f"{name}: {value}"
        failed = in_language("FAILED:", self._language)
        return nbformat.v4.new_output("stream", name="stdout", text=f"{failed} {text}\n")
