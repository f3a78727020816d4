"""A class's nbgrader course directory: setting one up.

    python -m autograder course-dir DIR [--chapters 1-3,5] [--course-id ID] [--exchange PATH]
                                        [--repository URL] [--edition EDITION_DIR]

writes ``DIR/source/NN_slug/NN_slug.ipynb`` for each chapter (from the package's solutions,
their setup cells installing from the class's repository, or with none only from a course
wheel released beside them: never from the open course's repository, which holds every answer)
and ``DIR/nbgrader_config.py`` (``autograder.host.configuration``: the settings the grader grades
with, so nbgrader's own ``autograde`` on this course runs a notebook as ``grade-all`` does, its
kernel sandboxed, and its ``generate_feedback`` shows no hidden test's source and no
traceback). A chapter runs the answers of the chapters it needs (``autograder.builder.needs``):
with ``--edition`` (the class's), a chapter whose needs that edition does not reveal is refused,
naming them, and the notebooks upgrade an edition older than it; without, each need is said.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from autograder.builder.repository import write_setup_cell
from autograder.host import configuration
from autograder.host.chapters import Chapter

if TYPE_CHECKING:  # the edition's module is the build's heaviest: imported where it runs
    from autograder.builder.edition import ClassEdition


def parse_chapters(spec: str, known: dict[str, Chapter]) -> list[Chapter]:
    """``1-3,5`` -> those chapters; ``all`` -> every chapter. Raises ValueError naming what
    is unknown."""
    if spec == "all":
        return list(known.values())
    by_number = {int(c.number): c for c in known.values()}
    wanted: list[int] = []
    for part in spec.split(","):
        first, _, last = part.strip().partition("-")
        try:
            wanted += range(int(first), int(last or first) + 1)
        except ValueError:
            raise ValueError(f"{part!r} is not a chapter number or range (say 1-3,5)") from None
    missing = sorted(set(wanted) - set(by_number))
    if missing:
        raise ValueError(f"no chapter {', '.join(map(str, missing))} (there are "
                         f"{min(by_number)}-{max(by_number)})")
    return [by_number[n] for n in sorted(set(wanted))]


def unmet_needs(selected: list[Chapter], edition: ClassEdition | None) -> list[str]:
    """A line for each chapter of ``selected`` that runs answers of other chapters: with
    ``edition``, only those it does not reveal (a release to refuse); without, every need."""
    from autograder.builder.edition import chapter_list
    from autograder.builder.needs import needs

    lines = []
    for chapter in selected:
        wanted = needs(int(chapter.number))
        missing = [n for n in wanted if edition is None or n not in edition.revealed]
        if not missing:
            continue
        if edition is None:
            lines.append(f"{chapter.name} runs the answers of {chapter_list(missing)}: the "
                         "class's edition must reveal them (edition --reveal)")
        else:
            lines.append(f"{chapter.name} runs the answers of {chapter_list(missing)}, which "
                         f"edition {edition.version} does not reveal: publish the edition "
                         f"again with them revealed, then release {chapter.name}")
    return lines


def write_course_dir(root: Path, selected: list[Chapter], course_id: str = configuration.COURSE_ID,
                     exchange: Path | None = None, sandbox: bool = True,
                     repository: str = "", edition: str = "") -> list[Path]:
    """Set up (or add chapters to) an nbgrader course directory; return what was written.
    Each new chapter's setup cell installs from ``repository`` (the class's; ``""``: only
    from a course wheel beside the notebook) and upgrades a class edition older than
    ``edition``. A chapter already in ``source/`` is left as the class has it, and so is its
    ``nbgrader_config.py``."""
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    written = []
    if not (root / "nbgrader_config.py").exists():
        written.append(configuration.write(root, course_id, sandbox=sandbox,
                                           exchange=exchange))
    for chapter in selected:
        destination = root / "source" / chapter.name / f"{chapter.name}.ipynb"
        if not destination.exists():
            write_setup_cell(chapter.source, destination, repository, edition=edition)
            written.append(destination)
    return written
