"""Grading results: what the CLI prints, and what ``--json`` writes."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from autograder.hints import in_language
from autograder.host.chapters import grade_id_of
from autograder.host.sandbox import Limits
from course.language import ENGLISH, aligned, columns, current, tr_in, tr_later

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# exceptions whose message is the whole hint (the checks' verdicts, a borrowed answer, code
# that reached for what the checks know)
VERDICTS = ("AssertionError", "CheckFailed", "BorrowedAnswer", "Sealed")
SEALED = "Sealed"  # ``autograder.seal``: the instructor's summary names such hand-ins
NOT_GRADED = "NotGraded"  # the error a test cell of a notebook not run shows, with the reason
WIDTH = 96  # the columns of a terminal a hint's lines take, indent included
_CLOSING = "，。、；：！？）》」』】"  # punctuation that never starts a line


@dataclass
class TestResult:
    id: str
    points: float
    max_points: float
    passed: bool
    message: str  # the failing check's hint; empty when passed
    sealed: bool = False  # failed because the learner's code reached for what checks know


@dataclass
class NotebookResult:
    notebook: str  # the file as handed in: its path, or ``archive.zip:entry``
    chapter: str
    runtime: str  # what executed the notebook: a GPU's name, or the Triton CPU interpreter
    tests: list[TestResult]
    learner: str = ""
    timestamp: str = ""  # when it was handed in (UTC, ISO 8601), where known
    error: str = ""  # why it was not graded at all; then ``tests`` is empty
    language: str = ENGLISH  # the notebook's: its hints and this report are in it
    penalty: float = 0.0  # the late penalty nbgrader recorded (a class's gradebook; else 0)

    @property
    def graded(self) -> bool:
        return not self.error

    @property
    def raw_score(self) -> float:
        return sum(t.points for t in self.tests)

    @property
    def score(self) -> float:
        """The score after the late penalty, as ``nbgrader export`` computes it."""
        return max(0.0, self.raw_score - self.penalty)

    @property
    def max_score(self) -> float:
        return sum(t.max_points for t in self.tests)

    def to_json(self) -> dict:
        return {"learner": self.learner, "notebook": self.notebook, "chapter": self.chapter,
                "timestamp": self.timestamp, "status": "graded" if self.graded else "not graded",
                "error": self.error, "runtime": self.runtime, "score": self.score,
                "raw_score": self.raw_score, "penalty": self.penalty,
                "max_score": self.max_score, "language": self.language,
                "tests": [asdict(t) for t in self.tests]}

    @classmethod
    def from_json(cls, data: dict) -> NotebookResult:
        return cls(data["notebook"], data["chapter"], data["runtime"],
                   [TestResult(**t) for t in data["tests"]], data.get("learner", ""),
                   data.get("timestamp", ""), data.get("error", ""),
                   data.get("language", ENGLISH), data.get("penalty", 0.0))


def result_of(chapter: str, tests: list[tuple[str, float]], learner: str, origin: str,
              runtime: str, scores: dict[str, float], executed: dict | None,
              reason: str = "", language: str = ENGLISH,
              cell_timeout: int = Limits.cell_timeout) -> NotebookResult:
    """Per test cell (``tests``: grade id and points, in order): its points from ``scores``,
    and the hint its failure left in the ``executed`` notebook (``reason`` for every test of a
    notebook not run at all), in the notebook's ``language``; ``cell_timeout`` is the limit
    a cell that ran out of time ran past."""
    outputs = {grade_id_of(cell): cell.get("outputs", [])
               for cell in (executed or {}).get("cells", []) if grade_id_of(cell)}
    found = []
    for grade_id, max_points in tests:
        points = 0.0 if reason else float(scores.get(grade_id, 0.0))
        passed = points == max_points
        message = reason or ("" if passed else failure_message(outputs.get(grade_id),
                                                                  cell_timeout))
        sealed = not passed and any(o.get("ename") == SEALED
                                    for o in outputs.get(grade_id) or [])
        found.append(TestResult(grade_id, points, max_points, passed,
                                in_language(message, language), sealed))
    return NotebookResult(origin, chapter, runtime, found, learner=learner, language=language)


def failure_message(outputs: list | None, cell_timeout: int) -> str:
    """The hint a failed test cell left in its outputs, in one paragraph; a cell that ran past
    its limit of ``cell_timeout`` seconds is told so."""
    if outputs is None:
        return tr_later("this test cell is missing from the notebook")
    # nbgrader's executor interrupts a cell past its limit: the kernel's KeyboardInterrupt
    # comes first, the executor's CellTimeoutError after it
    if any(o.get("output_type") == "error" and o.get("ename") == "CellTimeoutError"
           for o in outputs):
        return tr_later(f"this cell ran past its {cell_timeout} s limit (look for an endless "
                        "loop or a very slow call)")
    for output in outputs:
        if output.get("output_type") == "error":
            if output.get("ename") in VERDICTS and output.get("evalue"):
                return _ANSI.sub("", output["evalue"])
            return _ANSI.sub("", f"{output.get('ename')}: {output.get('evalue')}".strip())
    for output in outputs:
        if output.get("output_type") == "stream" and output.get("name") == "stderr":
            first = next((line for line in output.get("text", "").splitlines() if line), "")
            return tr_later(
                f"the cell wrote to stderr, which nbgrader scores as a failure: {first}")
    return tr_later("the cell did not pass (no error message was recorded)")


def format_report(result: NotebookResult) -> str:
    """A per-test table with the hint under each failing test."""
    language = result.language
    who = f" ({result.learner})" if result.learner else ""
    if not result.graded:
        return f"{result.notebook}{who}: " + in_language(
            f"chapter {result.chapter or '?'}, not graded: {result.error}", language)
    test_heading, points_heading = in_language("test", language), in_language("points", language)
    width = max(columns(text) for text in [test_heading, *(t.id for t in result.tests)])
    runtime = tr_in(result.runtime, language or current())  # the interpreter's label
    lines = [f"{result.notebook}{who}: "
             + in_language(f"chapter {result.chapter}, graded on {runtime}", language),
             f"  {aligned(test_heading, -width)}  {aligned(points_heading, 9)}  "
             + in_language("result", language)]
    hint = in_language("hint:", language)
    for test in result.tests:
        points = f"{test.points:g} / {test.max_points:g}"
        verdict = in_language("pass", language) if test.passed else in_language("FAIL", language)
        lines.append(f"  {aligned(test.id, -width)}  {points:>9}  {verdict}")
        if test.message:
            lines += _wrap(test.message, "      " + hint + " ", "            ")
    lines.append("  " + in_language(f"score: {result.score:g} / {result.max_score:g}", language)
                 + _penalty_note(result))
    return "\n".join(lines)


def _penalty_note(result: NotebookResult) -> str:
    """What a score line adds for a late penalty: the penalty, in the result's language."""
    if not result.penalty:
        return ""
    return " " + in_language(f"(late penalty {result.penalty:g}, from {result.raw_score:g})",
                             result.language)


def _wrap(text: str, first: str, then: str, width: int = WIDTH) -> list[str]:
    """``text`` in lines of at most ``width`` terminal columns (a Chinese character takes two),
    the first line led by ``first``, the others by ``then``. A line breaks at a space, or
    between wide characters where there is none (Chinese); never inside a run of narrow ones
    (a word, an identifier, `code`), which stands alone on a line where it is longer than one,
    and never before closing punctuation."""
    lines: list[str] = []
    line, bare = first, True  # bare: the line holds its lead alone
    for word in text.split():
        for i, piece in enumerate(_pieces(word)):
            gap = "" if bare or i else " "
            if not bare and columns(line + gap + piece) > width:
                lines.append(line)
                line, gap = then, ""
            line, bare = line + gap + piece, False
    return lines if bare else [*lines, line]


def _pieces(word: str) -> list[str]:
    """``word`` (no spaces) cut where a line may break: either side of a wide character, each
    with the closing punctuation after it."""
    pieces: list[str] = []
    for char in word:
        if pieces and (char in _CLOSING or columns(char) == 1 == columns(pieces[-1][-1])):
            pieces[-1] += char
        else:
            pieces.append(char)
    return pieces
