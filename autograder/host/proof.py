"""The grader proves itself before it grades anyone: each chapter's own solution, graded here as
a hand-in would be, must earn full marks.

A hand-in graded where the grader cannot work (its kernel finds no memory, no Jupyter kernel,
an environment the sandbox hides) would score zero for the grader's fault. So before
``grade-all`` grades anything, and before ``grade`` shows any grade, ``prove`` grades the
instructor's notebook of every (chapter, language) among the hand-ins through the same
``Grader``, under the same limits; one that does not earn full marks stops the run before
anything is recorded or shown, with one sentence saying why and what to do
(``GraderFailure``). A notebook ``grade`` has just graded to full marks is the same evidence,
and proves its chapter without another grading.

A passing proof is kept in the grader's cache folder, keyed on everything that could change
its verdict (``_key``), and taken under a file lock, so it costs one grading per chapter and
configuration, not one per command, and processes side by side do not repeat it.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

import nbformat

from autograder.host.autograde import Grader, Job, Outcome
from autograder.host.chapters import Chapter, GraderFailure, NotGradable
from autograder.host.sandbox import Limits, environment_for, run
from course.language import ENGLISH

__all__ = ["prove"]

# what the proof grades as: nbgrader needs a learner id
_PROVER = "course-proof"
_PACKAGES = ("autograder", "course", "kernels")  # their code decides a grade, all of it hashed
_MEMORY_TRIES = 3  # a kernel that died under the memory limit: graded again at 2x, 4x, 8x


def prove(grader: Grader, chapters: Iterable[tuple[Chapter, str]], diagnose: bool = True,
          shown: Iterable[tuple[Chapter, str]] = ()) -> None:
    """Grade each (chapter, language)'s source notebook with ``grader``; raise
    ``GraderFailure``, its message one sentence for the instructor (why, and what to do;
    with ``diagnose`` off, only that it fell short, without the gradings a diagnosis may
    take), at the first that does not earn full marks. A passing proof is cached (``_key``).

    ``shown``: the (chapter, language) pairs for which a hand-in graded by ``grader`` in this
    run has just earned full marks. That is the proof's own evidence (this machine, these
    settings, full marks for correct work), so those are proved without grading the source
    again."""
    shown = set(shown)
    for chapter, language in dict.fromkeys(chapters):
        source = chapter.source_in(language)
        text = source.read_text(encoding="utf-8")
        proofs = grader.cache / "proofs"
        proofs.mkdir(parents=True, exist_ok=True)
        proved = proofs / f"{chapter.name}-{language}-{_key(grader, text)}.json"
        with open(proofs / f"{proved.stem}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process proving it: wait, then read
            if proved.exists():
                continue
            started = time.monotonic()
            if (chapter, language) not in shown:
                outcome = _graded(grader, chapter, language, source, text)
                if not isinstance(outcome, Outcome) or outcome.result.score < \
                        outcome.result.max_score:
                    raise GraderFailure(_why(grader, chapter, language, source, text, outcome)
                                        if diagnose else f"{chapter.name} fell short")
            proved.write_text(json.dumps({
                "chapter": chapter.name, "language": language,
                "by": "a hand-in's full marks" if (chapter, language) in shown else "its source",
                "seconds": round(time.monotonic() - started, 1)}))


def _graded(grader: Grader, chapter: Chapter, language: str, source: Path, text: str
            ) -> Outcome | Exception:
    """The source notebook graded as a hand-in, or what kept it from being graded."""
    job = Job(chapter.name, text, _PROVER, str(source), nbformat.reads(text, as_version=4),
              language)
    try:
        return grader.autograde(job)
    except Exception as failed:  # noqa: BLE001 - any failure is the verdict, and is told
        return failed


def _key(grader: Grader, source: str) -> str:
    """What could change a proof's verdict: the source, the code of the checks, the kernel
    side, the grader and the library; nbgrader's version; the limits; the runtime;
    this Python; the Jupyter kernel nbgrader starts."""
    digest = hashlib.sha256(source.encode())
    home = Path(__file__).resolve().parents[2]
    for package in _PACKAGES:
        for path in sorted((home / package).rglob("*.py")):
            digest.update(str(path.relative_to(home)).encode() + b"\0" + path.read_bytes())
    limits = dataclasses.replace(grader.limits, threads=None)  # the cores decide no verdict
    digest.update(json.dumps([metadata.version("nbgrader"), dataclasses.asdict(limits),
                              grader.runtime, sys.executable, sys.prefix,
                              _kernelspec()]).encode())
    return digest.hexdigest()[:16]


def _kernelspec() -> list[str]:
    """The Jupyter kernel nbgrader starts (``python3``, as this process's environment finds
    it): its folder and kernel.json; empty where there is none."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        return []
    found = Path(spec.resource_dir) / "kernel.json"
    return [spec.resource_dir, found.read_text() if found.exists() else json.dumps(spec.argv)]


def _why(grader: Grader, chapter: Chapter, language: str, source: Path, text: str,
         outcome: Outcome | Exception) -> str:
    """One sentence: why the chapter's own solution did not earn full marks, diagnosed from
    what can be seen (the kernel's spec, a sandboxed import, the memory limit, the failing
    tests), and what to do."""
    named = f"chapter {chapter.number}" + ("" if language == ENGLISH else f" ({language})")
    if isinstance(outcome, Outcome):
        failing = [f"{t.id}: {t.message}" for t in outcome.result.tests if not t.passed]
        return (f"{named}'s own solution ({source}) scores {outcome.result.score:g}/"
                f"{outcome.result.max_score:g} here, so no hand-in can be graded fairly; "
                f"failing: {'; '.join(failing)}")
    kernel = _kernel_missing()
    if kernel:
        return kernel
    if grader.limits.sandbox:
        hidden = _hidden_by_sandbox()
        if hidden:
            return hidden
    died = isinstance(outcome, GraderFailure) and "kernel" in str(outcome)
    if died and grader.limits.memory_gib is not None:
        where = f"died in the {outcome.cell} cell" if outcome.cell else "did not start"
        enough = _memory_enough(grader, chapter, language, source, text)
        return (f"the memory limit ({grader.limits.memory_gib:g} GiB) is too small for "
                f"{named}: its own solution's kernel {where}; raise --memory-limit ("
                + (f"{named} grades with --memory-limit {enough:g}" if enough else
                   f"{named} did not grade with {grader.limits.memory_gib * 2 ** _MEMORY_TRIES:g}"
                   " either, or 0 for none") + ")")
    said = str(outcome) if isinstance(outcome, NotGradable) else \
        f"{type(outcome).__name__}: {outcome}"
    return (f"{named}'s own solution ({source}) could not be graded here ({said}); run "
            "`python -m course doctor`")


def _kernel_missing() -> str:
    """Why nbgrader cannot start the ``python3`` kernel here, with the fix; "" where it can
    find it and the program it starts."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    fix = f"{sys.executable} -m ipykernel install --sys-prefix"
    try:
        spec = KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        return f"no Jupyter kernel named python3 (the one nbgrader starts): {fix}"
    program = spec.argv[0] if spec.argv else ""
    path = environment_for({"PATH": ""}, [Path(tempfile.gettempdir())])["PATH"]
    if not program or shutil.which(program, path=path) is None:
        return (f"the Jupyter kernel python3 ({spec.resource_dir}) starts {program!r}, which is "
                f"not there: {fix} (or remove that kernel's folder)")
    return ""


def _hidden_by_sandbox() -> str:
    """Why the sandbox's Python cannot import the kernel and the course, with the fix; ""
    where it can."""
    code = "import ipykernel, course, autograder; print('imported')"
    folder = Path(tempfile.mkdtemp(prefix="kv-proof-"))
    try:
        said = run([sys.executable, "-c", code], folder, 120,
                   Limits(memory_gib=None, sandbox=True))
    except Exception as failed:  # noqa: BLE001 - told, as what the sandbox said
        said = f"{type(failed).__name__}: {failed}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if "imported" in said:
        return ""
    last = (said.strip().splitlines() or ["it said nothing"])[-1]
    return (f"the sandbox hides the Python environment ({sys.prefix}) from the kernel ({last}); "
            "put the environment outside the folders the sandbox hides, or grade with "
            "--sandbox off")


def _memory_enough(grader: Grader, chapter: Chapter, language: str, source: Path, text: str
                   ) -> float | None:
    """The least of twice, four and eight times the memory limit under which the chapter's
    own solution earns full marks; None where none does."""
    gib = grader.limits.memory_gib
    for _ in range(_MEMORY_TRIES):
        gib *= 2
        trial = Grader(dataclasses.replace(grader.limits, memory_gib=gib), grader.runtime,
                       grader.course_id, grader.cache)
        outcome = _graded(trial, chapter, language, source, text)
        if isinstance(outcome, Outcome) and outcome.result.score >= outcome.result.max_score:
            return gib
    return None


if __name__ == "__main__":  # `python -m autograder.host.proof`: does chapter 1 grade here?
    from autograder.host.bubblewrap import probe
    from autograder.host.chapters import chapters

    first = next(iter(chapters().values()))
    try:
        prove(Grader(Limits(sandbox=probe() is None)), [(first, ENGLISH)])
    except GraderFailure as failed:
        print(failed)
        sys.exit(1)
    print(f"chapter {first.number}'s own solution earns full marks here")
