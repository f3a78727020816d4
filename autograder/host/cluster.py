"""Grading a class on a Dask cluster: the same jobs, graded on other machines' cores.

    python -m autograder grade-all SUBMISSIONS --dask tcp://scheduler:8786
    python -m autograder grade-all SUBMISSIONS --dask local:4     # 4 worker processes here

Only data travels: a ``Job`` (the chapter's name and source text, the learner, the notebook)
goes to a worker, an ``Outcome`` (the result and the executed notebook) comes back. Each worker
builds its own ``Grader`` from the limits sent with the job, and keeps released chapters in
its own cache folder, so a worker needs the course installed (the class's image, see hub/) and
nothing from this machine's disk. The gradebook, the state file and the feedback pages are
written here, by the process that submitted the jobs, as each outcome arrives.

A worker that dies mid-notebook (killed, out of memory, its machine gone) loses nothing: Dask
hands its unfinished jobs to the other workers (up to ``distributed.scheduler.allowed-failures``
times each, then the job is reported as not graded, and the rest go on).

    this process                       Dask scheduler              workers
    ------------                       --------------              -------
    jobs ----- submit --------------->  queue  ------------------>  Grader(limits).autograde
    gradebook <- outcome, as each ends <------------------------------ (bubblewrap, nbgrader)
"""

from __future__ import annotations

from collections.abc import Iterator

from autograder.host.autograde import Grader, Job, Limits, Outcome, grader_failed
from autograder.host.chapters import NotGradable
from autograder.host.restore import Unmatched

LOCAL = "local:"


def _grade(limits: Limits, runtime: str, course_id: str, job: Job) -> Outcome | Exception:
    """Runs on a worker: grade one job with a grader of the worker's own."""
    try:
        return Grader(limits, runtime, course_id).autograde(job)
    except (NotGradable, Unmatched) as exc:  # the submission's fault: an answer, not a retry
        return exc
    except Exception as exc:  # the grader's own failure: this submission alone
        return grader_failed(exc)


def dask(address: str):
    """A runner (``classroom.Runner``) that grades on the Dask cluster at ``address``, or on
    ``local:N``, a cluster of N worker processes started on this machine for the run."""
    from distributed import Client, LocalCluster, as_completed

    def run(grader: Grader, work: list[Job]) -> Iterator[tuple[int, Outcome | Exception]]:
        cluster = None
        if address.startswith(LOCAL):
            workers = int(address.removeprefix(LOCAL) or 1)
            # one thread per worker: a worker grades one notebook at a time, as --jobs 1 does
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                   dashboard_address=None)
        try:
            with Client(cluster or address) as client:
                futures = {client.submit(_grade, grader.limits, grader.runtime,
                                         grader.course_id, job, pure=False): index
                           for index, job in enumerate(work)}
                for future in as_completed(futures):
                    index = futures[future]
                    try:
                        yield index, future.result()
                    except Exception as exc:  # e.g. KilledWorker: it took every worker down
                        yield index, NotGradable(f"not graded: its grading failed on the "
                                                 f"cluster ({type(exc).__name__}: {exc})")
        finally:
            if cluster is not None:
                cluster.close()

    return run
