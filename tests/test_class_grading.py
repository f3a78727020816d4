"""Grading a class as an instructor does from the README: nbgrader's own exchange with late
resubmissions, a learning platform's zip in every layout with every kind of mistake; every
learner's every grade lands under their exact id, with its time; the same grade every time;
and the tamper guard on its own."""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
from conftest import CHAPTERS, nbgrader

from autograder import guard
from autograder.builder import synthetic
from autograder.host import flagging

pytestmark = pytest.mark.pipeline

FIRST = CHAPTERS[0]
SECOND = CHAPTERS[1]


def run(*args, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autograder", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=1200, env=env)


def csv_rows(csv_path: Path) -> list[dict]:
    with open(csv_path, newline="") as handle:
        return list(csv.DictReader(handle))


def full_marks(chapter) -> float:
    return sum(points for _, points in chapter.test_cells())


def gradebook(db: Path, course_id: str) -> dict[tuple[str, str], tuple[float, dt.datetime]]:
    """(learner, chapter) -> (score, timestamp), read with nbgrader's own API."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{db}", course_id) as book:
        return {(s.student_id, a.name): (s.score, s.timestamp)
                for a in book.assignments for s in a.submissions}


def _submit(home: Path, learner: str, chapter, notebook) -> dt.datetime:
    """A learner fetches ``chapter``, writes ``notebook`` over it and submits; when."""
    fetched = home / chapter.name / f"{chapter.name}.ipynb"
    if not fetched.exists():
        nbgrader("fetch_assignment", chapter.name, cwd=home)
    nbformat.write(notebook, fetched)
    nbgrader("submit", chapter.name, "--student", learner, cwd=home)
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def test_a_class_through_nbgrader_exchange_as_the_readme_says(tmp_path):
    """Three learners (ids with digits, underscores, dots, hyphens) hand in two chapters
    through nbgrader's exchange; one resubmits late. Every grade lands under its learner with
    nbgrader's timestamp; a rerun grades nothing; the late one alone is graded again; the
    class's own source is never overwritten; stock generate_feedback hides hidden tests."""
    exchange, course = tmp_path / "exchange", tmp_path / "class"
    exchange.mkdir()
    exchange.chmod(0o777)
    # the class publishes from its own repository: its setup cell differs from the package's
    made = run("course-dir", course, "--chapters", "1-2", "--course-id", "kvcourse",
               "--exchange", exchange, "--repository", "https://git.example.edu/kv/class",
               cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    for chapter in (FIRST, SECOND):
        nbgrader("generate_assignment", chapter.name, cwd=course)
        nbgrader("release_assignment", chapter.name, cwd=course)
    handed_in = {  # learner -> chapter -> (notebook, expected score)
        "20231234": {FIRST: (synthetic.solved(FIRST), full_marks(FIRST)),
                     SECOND: (synthetic.solved(SECOND), full_marks(SECOND))},
        "ada_lovelace": {FIRST: (synthetic.solved(FIRST, 0.5), full_marks(FIRST) / 2)},
        "bo.b-3": {FIRST: (synthetic.broken(FIRST, "def broken(:\n"), full_marks(FIRST) - 3)},
    }
    for learner, work in handed_in.items():
        home = tmp_path / "home" / learner
        home.mkdir(parents=True)
        (home / "nbgrader_config.py").write_text(
            f"c = get_config()\nc.CourseDirectory.course_id = 'kvcourse'\n"
            f"c.Exchange.root = {str(exchange)!r}\n")
        for chapter, (notebook, _) in work.items():
            _submit(home, learner, chapter, notebook)
    for chapter in (FIRST, SECOND):
        nbgrader("collect", chapter.name, cwd=course)

    done = run("grade-all", "submitted", "--jobs", "2", cwd=course)
    assert done.returncode == 0, done.stderr
    assert "4 submission(s): 4 graded now, 0 unchanged" in done.stdout
    book = gradebook(course / "gradebook.db", "kvcourse")
    expected = {(learner, chapter.name): score for learner, work in handed_in.items()
                for chapter, (_, score) in work.items()}
    assert {key: score for key, (score, _) in book.items()} == expected
    from nbgrader.utils import parse_utc

    for (learner, chapter), (_, stamp) in book.items():
        written = course / "submitted" / learner / chapter / "timestamp.txt"
        assert stamp == parse_utc(written.read_text().strip())
    rows = {(r["student_id"], r["assignment"]): r for r in csv_rows(course / "grades.csv")}
    # nbgrader export's rows: every learner for every chapter, those who handed nothing in
    # with a zero and no time
    assert {key: float(r["score"]) for key, r in rows.items()} == \
        {(learner, chapter.name): expected.get((learner, chapter.name), 0.0)
         for learner in handed_in for chapter in (FIRST, SECOND)}
    assert {key for key, r in rows.items() if r["status"] == "graded"} == set(expected)
    assert all(r["status"] == "not submitted" and r["timestamp"] == ""
               for key, r in rows.items() if key not in expected)
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", "kvcourse") as registered:
        setup = registered.find_source_cell("setup", FIRST.name, FIRST.name)
        assert "git.example.edu/kv/class" in setup.source  # the class's own, kept

    again = run("grade-all", "submitted", cwd=course)
    assert "4 submission(s): 0 graded now, 4 unchanged" in again.stdout, again.stdout
    assert gradebook(course / "gradebook.db", "kvcourse") == book

    late = _submit(tmp_path / "home" / "ada_lovelace", "ada_lovelace", FIRST,
                   synthetic.solved(FIRST))
    nbgrader("collect", "--update", FIRST.name, cwd=course)
    third = run("grade-all", "submitted", cwd=course)
    assert "4 submission(s): 1 graded now, 3 unchanged" in third.stdout, third.stdout
    assert "ada_lovelace" in third.stderr and "20231234" not in third.stderr  # progress lines
    now = gradebook(course / "gradebook.db", "kvcourse")
    score, stamp = now[("ada_lovelace", FIRST.name)]
    assert score == full_marks(FIRST) and abs((stamp - late).total_seconds()) < 60
    assert stamp > book[("ada_lovelace", FIRST.name)][1]
    assert {k: v for k, v in now.items() if k[0] != "ada_lovelace"} == \
        {k: v for k, v in book.items() if k[0] != "ada_lovelace"}

    # nbgrader's own autograde and feedback on the same course, with the shipped config
    nbgrader("autograde", FIRST.name, "--student", "bo.b-3", "--force", cwd=course)
    nbgrader("generate_feedback", FIRST.name, "--student", "bo.b-3", "--force", cwd=course)
    page = (course / "feedback" / "bo.b-3" / FIRST.name / f"{FIRST.name}.html").read_text()
    assert "FAILED" in page and "BEGIN HIDDEN TESTS" not in page
    assert "_thoroughly(" not in page and "output_error" not in page  # no traceback output
    assert not list(course.rglob(".hypothesis"))

    # every learner fetches their feedback through nbgrader's exchange, as released
    nbgrader("generate_feedback", FIRST.name, "--force", cwd=course)
    nbgrader("release_feedback", FIRST.name, cwd=course)
    for learner in handed_in:
        home = tmp_path / "home" / learner
        nbgrader("fetch_feedback", FIRST.name, "--student", learner, cwd=home)
        fetched = list((home / FIRST.name / "feedback").rglob(f"{FIRST.name}.html"))
        assert fetched and "BEGIN HIDDEN TESTS" not in fetched[-1].read_text(), learner


def test_a_platform_zip_in_every_layout_with_every_mistake(tmp_path):
    """Nested and flat uploads in one top-level folder, numeric ids that differ only in their
    last digits, a notebook handed in as the wrong chapter, a damaged file, two files for one
    learner and chapter: every file gets exactly one row, under its exact learner."""
    top = "moodle-export-2026/"
    uploads = {
        f"{top}ada/{FIRST.name}.ipynb": (synthetic.solved(FIRST), full_marks(FIRST)),
        f"{top}s1234567_{FIRST.name}.ipynb": (synthetic.solved(FIRST, 0.5),
                                               full_marks(FIRST) / 2),
        f"{top}s1234589_{FIRST.name}.ipynb": (synthetic.solved(FIRST), full_marks(FIRST)),
        f"{top}cy_{SECOND.name}.ipynb": (synthetic.solved(FIRST), "its cells say so"),
        f"{top}di_{FIRST.name}.ipynb": (b'{"cells": [', "corrupt notebook"),
        f"{top}eve/{FIRST.name}.ipynb": (synthetic.solved(FIRST), "2 files are eve's"),
        f"{top}eve_{FIRST.name}.ipynb": (synthetic.solved(FIRST), "2 files are eve's"),
    }
    when = (2026, 11, 30, 23, 59, 58)
    with zipfile.ZipFile(tmp_path / "uploads.zip", "w") as archive:
        for name, (contents, _) in uploads.items():
            data = contents if isinstance(contents, bytes) else nbformat.writes(contents)
            archive.writestr(zipfile.ZipInfo(name, when), data)
    done = run("grade-all", "uploads.zip", "--json", "r.json", "--jobs", "2", cwd=tmp_path)
    assert done.returncode == 1  # some files were not graded, and the run says so
    assert "7 submission(s): 3 graded now, 0 unchanged since they were last graded " \
           "(not graded again), 0 graded again (what grades them changed), 4 not graded" \
           in done.stdout
    entries = {e["notebook"]: e for e in json.loads((tmp_path / "r.json").read_text())}
    assert set(entries) == {f"uploads.zip:{name}" for name in uploads}
    rows = [r for r in csv_rows(tmp_path / "grades.csv") if r["file"]]
    assert len(rows) == len(uploads)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 4 and not any("/tmp" in line for line in errors)
    for name, (_, outcome) in uploads.items():
        entry = entries[f"uploads.zip:{name}"]
        row = next(r for r in rows if r["file"] == f"uploads.zip:{name}")
        learner = name.removeprefix(top).split("/")[0].split(f"_{SECOND.name}")[0] \
            .split(f"_{FIRST.name}")[0]
        assert entry["learner"] == row["student_id"] == learner
        assert entry["timestamp"] == row["timestamp"] == "2026-11-30 23:59:58"
        if isinstance(outcome, float):
            assert entry["status"] == "graded" and entry["score"] == outcome
            assert float(row["score"]) == outcome and row["status"] == "graded"
        else:
            assert entry["status"] == row["status"] == "not graded"
            assert outcome in entry["error"] and outcome in row["message"]
            assert any(f"uploads.zip:{name}" in line and outcome in line for line in errors)
    page = (tmp_path / "feedback" / "cy" / SECOND.name / f"{SECOND.name}.html").read_text()
    assert "not graded" in page and FIRST.name in page
    book = gradebook(tmp_path / "gradebook.db", "paged-kv-course")
    # the damaged file, and the notebook handed in as another chapter, are recorded where
    # their names put them, as nbgrader's autograde records a notebook it fails on: a
    # submission, ungraded, waiting for manual grading (chapter 2 registered for it)
    assert {k: v[0] for k, v in book.items()} == {
        ("ada", FIRST.name): full_marks(FIRST), ("s1234567", FIRST.name): full_marks(FIRST) / 2,
        ("s1234589", FIRST.name): full_marks(FIRST), ("di", FIRST.name): 0.0,
        ("cy", SECOND.name): 0.0}
    assert {v[1] for v in book.values()} == {dt.datetime(*when)}


def test_grading_the_same_notebook_ten_times_gives_the_same_result(tmp_path):
    notebook = synthetic.solved(SECOND, fraction=0.5)  # property-based checks, some failing
    paths = []
    for copy in range(10):
        path = tmp_path / f"copy{copy}" / f"{SECOND.name}.ipynb"
        path.parent.mkdir()
        nbformat.write(notebook, path)
        paths.append(path)
    done = run("grade", *paths, "--jobs", "2", "--json", "r.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "r.json").read_text())
    assert len(results) == 10
    assert all(r["tests"] == results[0]["tests"] for r in results)
    assert 0 < results[0]["score"] < results[0]["max_score"]


def test_the_guard_names_a_replaced_check_and_a_patched_library_function(monkeypatch):
    import torch

    from autograder.checks import ch01

    monkeypatch.setattr(guard, "_RECORD", None)
    guard.verify()  # not armed: a learner running the notebook, nothing to check
    guard.arm()
    guard.verify()
    monkeypatch.setattr(ch01, "check_kv_bytes_per_token", lambda fn: None)
    with pytest.raises(AssertionError, match="check_kv_bytes_per_token"):
        guard.verify()
    monkeypatch.undo()
    monkeypatch.setattr(guard, "_RECORD", None)
    guard.arm()
    monkeypatch.setattr(torch, "allclose", lambda *args, **kwargs: True)
    with pytest.raises(AssertionError, match="torch.allclose"):
        guard.verify()


@pytest.mark.parametrize("name", ["len", "isinstance", "enumerate"])
def test_the_guard_watches_the_builtins_the_checks_name(name, monkeypatch):
    """The builtins watched are those the checks' source names (read when the guard is armed),
    not a list kept by hand; those the kernel itself rebinds around each cell are not."""
    import builtins

    for state, empty in (("_RECORD", None), ("_MODULES", []), ("_BUILTINS", [])):
        monkeypatch.setattr(guard, state, empty)
    guard.arm()
    monkeypatch.setattr(builtins, "input", lambda prompt="": "")  # as ipykernel does each cell
    guard.verify()
    original = getattr(builtins, name)
    monkeypatch.setattr(builtins, name, lambda *args: original(*args))
    with pytest.raises(AssertionError, match=f"builtins.{name}"):
        guard.verify()


@pytest.mark.parametrize(("line", "flagged"), [
    ("from autograder.checks import ch01", True), ("import builtins", True),
    ("sys.modules['x'] = y", True), ("open('../../gradebook.db', 'w')", True),
    ("total = sum(blocks)  # autograder would flag this only outside comments", False),
    ("def allocate(self, seq_id, num_tokens):", False),
])
def test_the_static_scan_flags_code_that_reaches_for_the_grader(line, flagged):
    assert (flagging.suspicious_code(f"x = 1\n{line}\n") is not None) == flagged


def test_every_test_cell_verifies_the_guard_first():
    for chapter in CHAPTERS:
        for cell in nbformat.read(chapter.source, as_version=4).cells:
            if cell.metadata.get("nbgrader", {}).get("grade"):
                assert "verify()" in cell.source.split("check_", 1)[0], (
                    f"{chapter.name}: {cell.metadata['nbgrader']['grade_id']} must call "
                    "autograder.guard.verify() before its check")


@pytest.mark.parametrize(("jobs", "user_setting", "expected"), [
    (1, None, None), (2, None, str(max(1, (os.cpu_count() or 1) // 2))), (2, "3", "3")],
    ids=["one-job-keeps-the-default", "two-jobs-share-the-cores", "the-user-setting-wins"])
def test_notebooks_graded_side_by_side_share_the_cores(jobs, user_setting, expected, tmp_path,
                                                       monkeypatch):
    from autograder.host.cli import _limits_of, _parser
    from autograder.host.sandbox import run

    if user_setting is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", user_setting)
    limits = _limits_of(_parser().parse_args(["grade-all", "x", "--jobs", str(jobs)]))
    printed = run([sys.executable, "-c", "import os; print(os.environ.get('OMP_NUM_THREADS'))"],
                   tmp_path, 30, limits)
    assert printed.strip() == str(expected)


def _running(marker: str) -> bool:
    """Whether a process holds a file whose name holds ``marker`` open."""
    for entry in Path("/proc").iterdir():
        try:
            if any(marker in os.readlink(fd) for fd in (entry / "fd").iterdir()):
                return True
        except OSError:  # not a process, not ours, or it ended while we looked
            continue
    return False


def test_ctrl_c_ends_the_notebook_being_graded_and_keeps_what_was_graded(tmp_path):
    """Two learners, one at a time: the first graded, the second's notebook still running
    (its kernel, holding a file open, waits ten minutes; a notebook may not start a program,
    ``autograder.seal``). Ctrl-C: the run ends at once, the running notebook with it, and the
    CSV and JSON hold the first grade and say the second was not graded."""
    import signal
    import time

    marker = f"kv-course-ctrl-c-{os.getpid()}"
    waits = synthetic.broken(FIRST, f"import time\nheld = open('{marker}', 'w')\n"
                             "time.sleep(600)\n")
    for learner, notebook in (("a-first", synthetic.solved(FIRST)), ("b-waits", waits)):
        (tmp_path / "uploads" / learner).mkdir(parents=True)
        nbformat.write(notebook, tmp_path / "uploads" / learner / f"{FIRST.name}.ipynb")
    process = subprocess.Popen(  # in the foreground, as a terminal runs it (SIGINT heard)
        [sys.executable, "-m", "autograder", "grade-all", "uploads", "--jobs", "1",
         "--cell-timeout", "900", "--json", "r.json"], cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        for line in process.stderr:
            if "1/2 a-first" in line:
                break
        deadline = time.monotonic() + 120
        while not _running(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _running(marker), "the second notebook never started its process"
        stopped_at = time.monotonic()
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 130, err
    assert time.monotonic() - stopped_at < 60  # at once: not the ten minutes it waits
    assert "stopped (Ctrl-C)" in err and "a-first" in out
    deadline = time.monotonic() + 30
    while _running(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _running(marker), "the notebook's kernel outlived the stopped run"
    rows = {r["student_id"]: r for r in csv_rows(tmp_path / "grades.csv") if r["file"]}
    assert rows["a-first"]["status"] == "graded"
    assert float(rows["a-first"]["score"]) == full_marks(FIRST)
    assert rows["b-waits"]["status"] == "not graded"
    assert "stopped" in rows["b-waits"]["message"]
    results = {e["learner"]: e for e in json.loads((tmp_path / "r.json").read_text())}
    assert results["a-first"]["status"] == "graded"
    assert results["b-waits"]["status"] == "not graded"


def test_two_canvas_downloads_of_one_learner_are_one_learner(tmp_path):
    """Canvas names a learner's file by their user id; the second download holds their late,
    renamed upload. One course directory, both downloads graded: one learner, the later
    upload's grade and time."""
    first, later = (2026, 11, 30, 12, 0, 0), (2026, 12, 1, 0, 30, 0)
    downloads = {
        "submissions.zip": [(f"lovelaceada_4242_901_{FIRST.name}.ipynb",
                             synthetic.solved(FIRST, 0.5), first),
                            (f"hopperg_5150_902_{FIRST.name}.ipynb", synthetic.solved(FIRST),
                             first)],
        "submissions (1).zip": [(f"lovelaceada_LATE_4242_977_{FIRST.name}-1.ipynb",
                                 synthetic.solved(FIRST), later)],
    }
    assert run("course-dir", "class", "--chapters", "1", cwd=tmp_path).returncode == 0
    for name, files in downloads.items():
        with zipfile.ZipFile(tmp_path / name, "w") as archive:
            for entry, notebook, when in files:
                archive.writestr(zipfile.ZipInfo(entry, when), nbformat.writes(notebook))
        done = run("grade-all", name, "--course-dir", "class", "--jobs", "2", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    book = gradebook(tmp_path / "class" / "gradebook.db", "paged-kv-course")
    assert book == {("4242", FIRST.name): (full_marks(FIRST), dt.datetime(*later)),
                    ("5150", FIRST.name): (full_marks(FIRST), dt.datetime(*first))}
    assert sorted(p.name for p in (tmp_path / "class" / "submitted").iterdir()) == \
        ["4242", "5150"]


def test_grading_on_dask_without_dask_installed_is_one_line(tmp_path):
    (tmp_path / "no-dask" / "distributed").mkdir(parents=True)
    (tmp_path / "no-dask" / "distributed" / "__init__.py").write_text(
        "raise ImportError('No module named distributed')\n")
    (tmp_path / "uploads" / "ada").mkdir(parents=True)
    nbformat.write(synthetic.solved(FIRST), tmp_path / "uploads" / "ada" / f"{FIRST.name}.ipynb")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "no-dask"))
    done = run("grade-all", "uploads", "--dask", "local:1", cwd=tmp_path, env=env)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("error: --dask needs Dask")
    assert "Traceback" not in done.stderr


def test_the_grader_failing_on_one_submission_refuses_that_one_alone():
    """An exception no submission should cause (here CPython's own SystemError, as 3.11's
    parser raised it under two threads) refuses the submission it happened on, saying so;
    the others are graded, and the class goes on."""
    from autograder.host.autograde import Grader
    from autograder.host.chapters import NotGradable
    from autograder.host.classroom import threads

    class FailsOnOne(Grader):
        def autograde(self, job):
            if job == "second":
                raise SystemError("AST constructor recursion depth mismatch")
            return f"graded {job}"

    got = dict(threads(2)(FailsOnOne(), ["first", "second", "third"]))
    assert (got[0], got[2]) == ("graded first", "graded third")
    assert isinstance(got[1], NotGradable)
    assert "the grader failed on it (SystemError: AST constructor" in str(got[1])


def test_ctrl_c_while_a_result_is_recorded_lets_the_recording_finish(monkeypatch):
    """Ctrl-C lands while the first result is being recorded (its gradebook rows written):
    the recording finishes, the notebooks still running are ended at once, and the run stops
    before the next result, which is not recorded."""
    import signal

    from autograder.host import classroom
    from autograder.host.chapters import NotGradable
    from autograder.host.submission import Submission

    ended = []
    monkeypatch.setattr(classroom, "end_all", lambda: ended.append(True))

    class Template:  # what grade() asks of the grader before it dispatches: nothing to do
        def template(self, chapter, source):
            pass

        def record_cases(self, chapter, source):
            pass

    def runner(grader, jobs):
        for index in range(len(jobs)):
            yield index, NotGradable(f"outcome {index}")

    recorded = []

    def on_result(submission):
        if not recorded:
            os.kill(os.getpid(), signal.SIGINT)  # mid-recording
        recorded.append(submission.learner)  # the rest of the recording still runs

    submissions = [Submission(f"{name}.ipynb", name, FIRST.name, None, target=FIRST)
                   for name in ("a", "b", "c")]
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        with pytest.raises(KeyboardInterrupt):
            classroom.grade(submissions, Template(), runner, on_result)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handed back
    finally:
        signal.signal(signal.SIGINT, before)
    assert recorded == ["a"] and ended == [True]
    assert submissions[1].result is None and submissions[2].result is None


def test_a_grader_started_with_sigint_ignored_keeps_it_ignored():
    """``nohup grade-all ... &``: a SIGINT is not this run's to act on."""
    import signal

    from autograder.host import classroom
    from autograder.host.submission import Submission

    class Template:  # what grade() asks of the grader before it dispatches: nothing to do
        def template(self, chapter, source):
            pass

        def record_cases(self, chapter, source):
            pass

    recorded = []

    def on_result(submission):
        os.kill(os.getpid(), signal.SIGINT)
        recorded.append(submission.learner)

    def runner(grader, jobs):
        yield from ((index, RuntimeError("outcome")) for index in range(len(jobs)))

    submissions = [Submission(f"{name}.ipynb", name, FIRST.name, None, target=FIRST)
                   for name in ("a", "b")]
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        classroom.grade(submissions, Template(), runner, on_result)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
    assert recorded == ["a", "b"]
