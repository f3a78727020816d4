"""Grading a class on a Dask cluster: the gradebook the thread pool gives, and a worker killed
mid-batch loses no notebook and counts none twice."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys

import nbformat
import pytest
from conftest import CHAPTERS

from autograder.builder import synthetic
from autograder.host.autograde import Grader, Job
from autograder.host.cli import _limits_of, _parser
from autograder.host.cluster import dask

pytestmark = pytest.mark.pipeline

FIRST = CHAPTERS[0]
FULL = sum(points for _, points in FIRST.test_cells())


def _limits():
    return _limits_of(_parser().parse_args(["grade-all", "x", "--jobs", "2"]))


def _job(learner: str, fraction: float) -> Job:
    return Job(FIRST.name, FIRST.source.read_text(encoding="utf-8"), learner,
               f"{learner}.ipynb", dict(synthetic.solved(FIRST, fraction)))


def _grade_all(uploads, where, *how) -> dict[str, tuple[str, str, str]]:
    """``grade-all`` on ``uploads`` into a gradebook of its own in ``where``: each learner's
    (score, max score, status) from grades.csv."""
    where.mkdir()
    done = subprocess.run([sys.executable, "-m", "autograder", "grade-all", str(uploads),
                           "--db", f"sqlite:///{where / 'book.db'}", *how], cwd=where,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(list(uploads.iterdir()))} graded now" in done.stdout
    with open(where / "grades.csv", newline="") as handle:
        return {row["student_id"]: (row["score"], row["max_score"], row["status"])
                for row in csv.DictReader(handle) if row["assignment"] == FIRST.name}


def test_a_class_graded_on_a_local_dask_cluster_gets_the_thread_pools_gradebook(tmp_path):
    uploads = tmp_path / "uploads"
    fractions = {"s1234567": 1.0, "s1234589": 0.0, "20231234": 0.5}
    for learner, fraction in fractions.items():
        (uploads / learner).mkdir(parents=True)
        nbformat.write(synthetic.solved(FIRST, fraction),
                       uploads / learner / f"{FIRST.name}.ipynb")
    on_threads = _grade_all(uploads, tmp_path / "threads", "--jobs", "2")
    on_dask = _grade_all(uploads, tmp_path / "dask", "--dask", "local:2")
    assert on_dask == on_threads
    assert set(on_dask) == set(fractions)
    assert float(on_dask["s1234567"][0]) == FULL and float(on_dask["s1234589"][0]) == 0
    assert 0 < float(on_dask["20231234"][0]) < FULL


def test_a_worker_killed_mid_batch_loses_no_notebook(tmp_path):
    from distributed import Client, LocalCluster

    fractions = [1.0, 0.0, 1.0, 0.0, 1.0]
    jobs = [_job(f"learner{index}", fraction) for index, fraction in enumerate(fractions)]
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        pids = client.run(os.getpid)
        victim = None
        outcomes = {}
        for index, outcome in dask(cluster.scheduler_address)(Grader(_limits()), jobs):
            assert index not in outcomes, "a job reported twice"
            outcomes[index] = outcome
            if victim is None:  # the first grade is in: kill a worker in the middle of its next
                busy = [address for address, tasks in client.processing().items() if tasks]
                victim = pids[busy[0]]
                os.kill(victim, signal.SIGKILL)
        assert victim is not None
    assert sorted(outcomes) == list(range(len(jobs)))
    assert [outcomes[i].result.learner for i in range(len(jobs))] == [j.learner for j in jobs]
    assert [outcomes[i].result.score for i in range(len(jobs))] == [
        FULL if fraction == 1.0 else 0 for fraction in fractions]
