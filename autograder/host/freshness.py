"""Whether a hand-in is graded again, and why: the one place that decides it.

A hand-in's grade is decided by two kinds of input, kept (``Inputs``) in the state file each
time it is graded and compared the next time:

    executed  what the notebook's run depends on: the learner's file, the chapter's source
              (in the notebook's language), the checks and every module they import (with the
              kernel side), nbgrader's version, the course's version. A change runs the
              notebook again.
    recorded  what only nbgrader's recording of the run depends on: the assignment's due date
              and the learner's extension (the gradebook's), the late-penalty configuration
              (the class's ``nbgrader_config.py``), the hand-in time. A change records again
              what ``autograded/`` holds (``recording.ClassCourse.rerecord``), as nbgrader's
              ``autograde --force`` would decide it.

``decide`` turns the inputs now and those kept into a ``Verdict``: what to do, and why in
words. An entry kept by an older grader, without its inputs, is graded again.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import nbformat

from autograder import kernel_side

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("autograder", "course", "kernels")  # the repository's own: their code decides grades
COURSE_PACKAGE = "paged-kv-course"  # pyproject.toml's name: the course's version

GRADE, REGRADE, RECORD, KEEP = "grade", "regrade", "record", "keep"


@dataclass(frozen=True)
class Inputs:
    """What decides a hand-in's grade, each as text (a digest, a version, a time)."""

    file: str
    source: str
    checks: str
    nbgrader: str
    course: str
    due_date: str
    extension: str
    late_penalty: str
    handed_in: str

    def to_json(self) -> dict:
        return asdict(self)


# Each input's reason, when it alone changed; ``file`` is decided first (a new file is graded,
# not graded again).
EXECUTED = {"source": "the chapter's source changed", "checks": "the checks changed",
            "nbgrader": "nbgrader's version changed", "course": "the course's version changed"}
RECORDED = {"due_date": "the due date changed", "extension": "the learner's extension changed",
            "late_penalty": "the late penalty changed",
            "handed_in": "its hand-in time changed"}


@dataclass(frozen=True)
class Verdict:
    """``action``: GRADE (new, or a new file), REGRADE (the same file run again), RECORD
    (nbgrader's recording alone again) or KEEP; ``reason``: why, in words."""

    action: str
    reason: str


def decide(now: Inputs, kept: dict | None, graded_notebook: bool, asked: bool = False
           ) -> Verdict:
    """The verdict for a hand-in whose inputs are ``now``.

    Args:
        kept: its state entry from when it was last graded (None: never graded); an older
            grader's entry holds only the file's digest (``sha256``).
        graded_notebook: whether ``autograded/`` still holds its executed notebook (what a
            recording alone would record again).
        asked: graded again whatever changed (``--regrade``, ``--student``, ``--assignment``).
    """
    if kept is None:
        return Verdict(GRADE, "new")
    then = kept.get("inputs")
    if (then or {}).get("file", kept.get("sha256")) != now.file:
        return Verdict(GRADE, "its file changed")
    if then is None:
        return Verdict(REGRADE, "graded by an older grader, which kept no record of what "
                       "graded it")
    executed = _changed(now, then, EXECUTED)
    if asked:
        return Verdict(REGRADE, ", ".join(["graded again as asked", *executed]))
    if executed:
        return Verdict(REGRADE, ", ".join(executed))
    if not graded_notebook:
        return Verdict(REGRADE, "its graded notebook in autograded/ is gone")
    recorded = _changed(now, then, RECORDED)
    if recorded:
        return Verdict(RECORD, ", ".join(recorded))
    return Verdict(KEEP, "unchanged")


def _changed(now: Inputs, then: dict, reasons: dict[str, str]) -> list[str]:
    return [reason for name, reason in reasons.items() if then.get(name) != getattr(now, name)]


def digest(paths: Iterable[Path]) -> str:
    """SHA-256 of each file's name and bytes (a file gone counts as empty). A file of the
    repository is named by its path in it: a repository moved elsewhere grades nothing
    again."""
    hashed = hashlib.sha256()
    for path in paths:
        named = path.resolve().relative_to(REPO) if path.resolve().is_relative_to(REPO) \
            else Path(path.name)
        hashed.update(str(named).encode() + b"\0")
        hashed.update(path.read_bytes() if path.exists() else b"")
    return hashed.hexdigest()


def checks_of(chapter: str, source: Path, root: Path = REPO) -> list[Path]:
    """The code that decides chapter ``chapter``'s grades (``NN_slug``; ``source`` its
    notebook): its visible and hidden checks and what its notebook imports of the
    repository's packages, with every module those import, found by reading their ``import``
    statements (so chapter 9's checks bring chapter 7's audit along); then the kernel side
    (the guard, its arming, the tripwires). Sorted; each file once."""
    from autograder.table import parts_of

    parts = parts_of(chapter[:2])
    starts = {parts.checks, parts.hidden, *_imported(_notebook_code(source), "")}
    files = import_closure(starts, root)
    return sorted(set(files) | set(kernel_side()))


def import_closure(modules: Iterable[str], root: Path) -> list[Path]:
    """The files of ``modules`` and of every module of ``PACKAGES`` (under ``root``) they
    import, directly or not, packages' ``__init__.py`` included (importing a module runs
    them). A module with no file under ``root`` (another package's) is not followed."""
    seen: set[Path] = set()
    todo = [name for module in modules for name in _with_parents(module)]
    while todo:
        path = _file_of(todo.pop(), root)
        if path is None or path in seen:
            continue
        seen.add(path)
        package = _module_name(path, root)
        todo += [name for found in _imports(path, package) for name in _with_parents(found)]
    return sorted(seen)


def _with_parents(module: str) -> list[str]:
    names = module.split(".")
    return [".".join(names[: i + 1]) for i in range(len(names))]


def _file_of(module: str, root: Path) -> Path | None:
    if module.split(".")[0] not in PACKAGES:
        return None
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path.resolve()
    return None


def _module_name(path: Path, root: Path) -> str:
    """The package a module's relative imports are resolved against."""
    parts = path.resolve().relative_to(root.resolve()).with_suffix("").parts
    return ".".join(parts[:-1])  # a package's __init__ and a module alike: the folder


def _imports(path: Path, package: str) -> tuple[str, ...]:
    """Every module an ``import`` or ``from ... import`` of the file names (inside functions
    too: a check imports lazily), and each ``from X import name`` as ``X.name`` too (it may
    be a submodule; one that is not has no file and is dropped)."""
    return tuple(_imported(path.read_text(encoding="utf-8"), package))


def _imported(code: str, package: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found += [base, *(f"{base}.{alias.name}" for alias in node.names)]
    return found


def _notebook_code(source: Path) -> str:
    """The code cells of a notebook as one Python module (IPython's magics made Python)."""
    from IPython.core.inputtransformer2 import TransformerManager

    cells = nbformat.read(source, as_version=4).cells
    transform = TransformerManager().transform_cell
    return "\n".join(transform(cell.source) for cell in cells if cell.cell_type == "code")


def versions() -> tuple[str, str]:
    """nbgrader's version and the course's (its installed distribution's)."""
    from importlib import metadata

    return metadata.version("nbgrader"), metadata.version(COURSE_PACKAGE)
