"""``python -m autograder``: grade notebooks through nbgrader, grade a class, release exercises.

    python -m autograder grade NOTEBOOK... [--json FILE] [--jobs N] [--sandbox auto|on|off]
                               [--kernels warm|cold]
    python -m autograder grade-all DIR|ZIP [--course-dir DIR] [--db URL] [--csv FILE]
                                   [--json FILE] [--jobs N] [--state FILE] [--regrade]
                                   [--student ID]... [--assignment NAME]... [--roster FILE]
                                   [--sandbox auto|on|off] [--kernels warm|cold]
                                   [--dask ADDRESS|local:N]
    python -m autograder course-dir DIR [--chapters 1-3] [--course-id ID] [--exchange DIR]
    python -m autograder release
    python -m autograder repository URL
    python -m autograder bench [--vs-nbgrader | --breakdown | --learners N] ...
    python -m autograder book [DEST] [--chapters 1,11]

``grade-all`` takes nbgrader's ``submitted/`` folder (or the course directory holding it), a
folder of ``<learner>/<NN_slug>.ipynb``, or a zip of uploads from a learning platform in
either layout or with flat files named ``<learner>_<NN_slug>.ipynb`` (see
``autograder.host.layouts``). It grades N submissions at a time, shows progress, and leaves the
class's course directory as nbgrader's own ``autograde`` and ``generate_feedback`` would
(``autograder.host.recording``: grades, flags, late penalties, ``autograded/``, feedback pages),
with a CSV of ``nbgrader export``'s rows and a row for every file not graded (and JSON). It
resumes: a hand-in is run again only where it (by SHA-256), its chapter's source, the checks
(and what they import), nbgrader's or the course's version changed since it was last graded
(the state file), and recorded again by nbgrader where only its due date, extension, hand-in
time or the late penalty changed (``autograder.host.freshness``); the summary, CSV and JSON
say which changed and why. ``--regrade`` grades every hand-in again; ``--student ID`` and
``--assignment NAME`` (nbgrader's names; each may be given more than once, and together they
choose the hand-ins of those learners in those chapters) grade exactly those again and leave
the others as they are. A folder inside a course directory's ``submitted/`` is what it is
there: ``submitted/ada`` grades ada's hand-ins again (``--student ada``),
``submitted/ada/01_kv_cache_sizing`` that one.
With ``--dask`` the notebooks are graded on a Dask cluster's workers (``autograder.host.cluster``).

Both grading commands run every notebook in a bubblewrap sandbox (``autograder.host.bubblewrap``)
unless told ``--sandbox off``; where bwrap is missing or cannot make the sandbox, they stop
before grading and say so. In the sandbox, each kernel is forked from one per chapter that
imported the chapter's modules once (``autograder.host.warm``) unless told ``--kernels cold``.
Both prove the grader on each chapter's own solution under the same limits
(``autograder.host.proof``; for ``grade``, a notebook it graded to full marks is that proof):
where it does not earn full marks, they record and show no grade, keep every earlier grade,
and say why in one line.

Exit codes: 0 every file graded; 1 a file refused (damaged, unknown, not recorded); 2 no
sandbox; 3 the grader's own failure (its proof failed, or a hand-in's kernel never started
or died before any cell the learner wrote: that hand-in keeps its earlier grade); 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import zipfile
from pathlib import Path

from autograder.host.autograde import Grader, Limits
from autograder.host.chapters import GRADER_FAILED, REPO, GraderFailure, chapters, class_chapters
from autograder.host.report import NotebookResult, format_report


def _runtime_label() -> str:
    from course.runtime import detect

    return detect().label


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    grade_ = commands.add_parser("grade", help="grade notebooks and print a report per test")
    grade_.add_argument("notebooks", nargs="+", type=Path, metavar="NOTEBOOK")
    grade_.add_argument("--json", type=Path, metavar="FILE",
                        help="also write the results as JSON (a list when several notebooks)")
    _limits(grade_, default_jobs=1)

    class_ = commands.add_parser("grade-all", help="grade a class into an nbgrader gradebook, "
                                 "with feedback pages, CSV and JSON")
    class_.add_argument("submissions", type=Path, metavar="DIR|ZIP")
    class_.add_argument("--course-dir", type=Path, metavar="DIR",
                        help="the class's nbgrader course directory: its source/ notebooks, "
                        "configuration and gradebook are used, and it ends as nbgrader's "
                        "autograde leaves one (default: the one DIR|ZIP is or is the "
                        "submitted/ folder of, else this folder; set up when it has no "
                        "nbgrader_config.py)")
    class_.add_argument("--db", help="gradebook, any SQLAlchemy URL (default: the course "
                        "directory's)")
    class_.add_argument("--csv", type=Path, metavar="FILE", help="where to write the scores: "
                        "nbgrader export's columns, then status, file, message (default: "
                        "grades.csv in the course directory)")
    class_.add_argument("--json", type=Path, metavar="FILE", help="also write results as JSON")
    class_.add_argument("--state", type=Path, metavar="FILE",
                        help="what graded each hand-in, for resuming (default: "
                        "grading-state.json in the course directory)")
    class_.add_argument("--roster", type=Path, metavar="FILE",
                        help="a CSV mapping the ids in the files' names to the class's learner "
                        "ids: columns platform_id and student_id, or a Canvas gradebook "
                        "export (ID, SIS Login ID); a file whose id is not on it is not graded")
    class_.add_argument("--regrade", action="store_true",
                        help="grade every hand-in again, changed or not (by default a hand-in "
                        "is graded again only where it or what decides its grade changed: its "
                        "chapter's source, the checks, the versions, the due date, the late "
                        "penalty)")
    class_.add_argument("--student", action="append", default=[], metavar="ID",
                        help="grade this learner's hand-ins again, and no one else's (may be "
                        "given more than once; with --assignment, theirs in those chapters)")
    class_.add_argument("--assignment", action="append", default=[], metavar="NAME",
                        help="grade this chapter's hand-ins again (NN_slug), and no other "
                        "chapter's (may be given more than once)")
    _limits(class_, default_jobs=os.cpu_count() or 1)
    class_.add_argument("--dask", metavar="ADDRESS",
                        help="grade on a Dask cluster instead of this process's threads: its "
                        "scheduler's address (tcp://HOST:8786; workers run the course's "
                        "image), or local:N for N worker processes on this machine (needs "
                        "the `cluster` extra: pip install '.[cluster]')")

    setup = commands.add_parser("course-dir", help="set up a class's nbgrader course "
                                "directory: source/ from the solutions, nbgrader_config.py")
    setup.add_argument("directory", type=Path, metavar="DIR")
    setup.add_argument("--chapters", default="all", help="for example 1-3,5 (default: all)")
    setup.add_argument("--course-id", default="paged-kv-course")
    setup.add_argument("--exchange", type=Path, metavar="DIR",
                       help="nbgrader's exchange folder (c.Exchange.root), for a JupyterHub")
    setup.add_argument("--sandbox", choices=["auto", "on", "off"], default="auto",
                       help="run nbgrader's kernels in a bubblewrap sandbox (default: auto, on "
                       "Linux)")
    setup.add_argument("--repository", metavar="URL",
                       help="the class's repository, which the released notebooks install the "
                       "course from (default: none: they install only a course wheel released "
                       "beside them; never the open course's, which holds every answer)")
    setup.add_argument("--edition", type=Path, metavar="DIR",
                       help="the class's edition (`python -m autograder edition DIR`): a chapter "
                       "whose needs it does not reveal is refused, naming them; the notebooks "
                       "upgrade an edition older than it")

    edition = commands.add_parser("edition", help="build the learner edition: the library "
                                  "with the answers of chapters not revealed left out, the "
                                  "visible checks, the exercises, a wheel")
    edition.add_argument("destination", type=Path, metavar="DEST")
    edition.add_argument("--reveal", default="", metavar="CHAPTERS",
                         help="chapters whose answers stay in, for example 1-3 (default: none)")
    edition.add_argument("--repository", metavar="URL",
                         help="the class's repository, which the notebooks install the "
                         "edition from (default: none: they install only the wheel beside "
                         "them; never the open course's, which holds every answer)")

    commands.add_parser("release", help="regenerate exercises/ from solutions/ with nbgrader")
    site = commands.add_parser("book", help="build the web edition: every chapter run, in "
                               "English and Chinese, as a static site; prints its index.html")
    site.add_argument("destination", type=Path, nargs="?", default=REPO / "build" / "book",
                      metavar="DEST", help="where the site goes (default: build/book)")
    site.add_argument("--chapters", default="all", help="for example 1,11 (default: all)")
    measuring = commands.add_parser("bench", help="grading throughput, where a notebook's time "
                                    "goes, the grader against stock nbgrader "
                                    "(`python -m autograder bench --help`)", add_help=False)
    measuring.add_argument("options", nargs="*")
    words = commands.add_parser("translations", help="collect every English text into the "
                                "translation catalogues (*.po), keeping current translations; "
                                "say what is left to translate")
    words.add_argument("--check", action="store_true",
                       help="change nothing: list each text without a current translation")
    where = commands.add_parser("repository", help="set the repository URL that Colab installs "
                                "from and the README's Colab links open (then `release`)")
    where.add_argument("url", help="for example https://github.com/you/paged-kv-course")
    return parser


def _limits(command: argparse.ArgumentParser, default_jobs: int) -> None:
    command.add_argument("--cell-timeout", type=int, default=120, metavar="SECONDS",
                         help="time limit for one cell (default: 120)")
    command.add_argument("--notebook-timeout", type=int, default=900, metavar="SECONDS",
                         help="time limit for one whole notebook (default: 900)")
    command.add_argument("--memory-limit", type=float, default=4.0, metavar="GIB",
                         help="address space for each grading process and its kernel, on "
                         "CPU-only machines (default: 4; 0: none)")
    command.add_argument("--jobs", type=int, default=default_jobs, metavar="N",
                         help=f"notebooks graded at once (default: {default_jobs})")
    command.add_argument("--sandbox", choices=["auto", "on", "off"], default="auto",
                         help="run each notebook in a bubblewrap sandbox: its own folder, no "
                         "network, its own processes (default: auto, the sandbox on Linux, "
                         "where grading stops if bwrap cannot make it; none elsewhere); off: "
                         "unsandboxed, as the grading user")
    command.add_argument("--kernels", choices=["warm", "cold"], default="warm",
                         help="warm (default): in the sandbox, each notebook's kernel is forked "
                         "from one that imported the chapter's modules once per grading "
                         "process; cold: each kernel starts afresh")


def _limits_of(args: argparse.Namespace) -> Limits:
    cores = os.cpu_count() or 1
    threads = max(1, cores // args.jobs) if args.jobs > 1 else None  # the cores, shared
    return Limits(args.cell_timeout, args.notebook_timeout, args.memory_limit or None, threads,
                  _sandboxed(args.sandbox), warm_kernels=args.kernels == "warm")


def _sandboxed(choice: str) -> bool:
    # bubblewrap is Linux only: elsewhere, `auto` grades as before, under no sandbox
    return choice == "on" or (choice == "auto" and sys.platform.startswith("linux"))


def _sandbox_missing(args: argparse.Namespace) -> bool:
    """True, after one error line saying what to do, where the sandbox is asked for (or
    left to auto on Linux) and cannot be made here."""
    from autograder.host.sandbox import probe

    if not _sandboxed(args.sandbox):
        if args.sandbox == "auto":
            print(f"note: {sys.platform} has no bubblewrap: notebooks are graded unsandboxed",
                  file=sys.stderr)
        return False
    reason = probe()
    if reason is None:
        return False
    print(f"error: notebooks are graded in a bubblewrap sandbox, but {reason}; grade "
          "unsandboxed (learner code then runs as you, seeing what you see) only with "
          "--sandbox off", file=sys.stderr)
    return True


def _absolute_db(url: str) -> str:
    """``sqlite:///relative.db`` relative to where the command runs, not to nbgrader's root."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/"):
        return prefix + str(Path(url[len(prefix):]).resolve())
    return url


def _finish(results: list[NotebookResult], grader_failed: bool = False) -> int:
    """Print each report, then an error line per file not graded; the exit code
    (``GRADER_FAILED`` where the grader failed on one of them)."""
    for result in results:
        if result.graded:
            print(format_report(result))
    refused = [r for r in results if not r.graded]
    for result in refused:
        who = f" ({result.learner}, {result.chapter})" if result.learner else ""
        print(f"error: {result.notebook}{who}: {result.error}", file=sys.stderr)
    return GRADER_FAILED if grader_failed else 1 if refused else 0


def _grade_notebooks(args: argparse.Namespace) -> int:
    """A self-learner's grading: each notebook on its own, in a throwaway gradebook."""
    from autograder.host.classroom import grade, threads
    from autograder.host.layouts import split_name
    from autograder.host.submission import Submission, read

    known = chapters()
    submissions = []
    for index, path in enumerate(args.notebooks):
        named = split_name(path.name, known)
        # nbgrader needs a learner: a self-learner's own notebook is no one's in the reports
        submissions.append(Submission(str(path), f"learner-{index + 1:03d}",
                                      named[1] if named else "", None, path))
    read(submissions, known)
    grader = Grader(_limits_of(args), _runtime_label())
    graded = [(s.target, s.language) for s in submissions if s.result is None]
    # Graded first, shown only once the grader has proved itself: a notebook here earning
    # full marks is that proof for its chapter (nothing is recorded, so nothing is undone)
    grade(submissions, grader, threads(args.jobs))
    if not _proved(grader, graded, [(s.target, s.language) for s in submissions
                                    if s.result.graded and s.result.tests and
                                    s.result.raw_score == s.result.max_score]):
        return GRADER_FAILED
    results = [submission.result for submission in submissions]
    for result in results:
        result.learner = ""
    if args.json:  # one notebook's results alone, several notebooks' in a list
        payload = [result.to_json() for result in results]
        payload = payload if len(payload) > 1 else payload[0]
        args.json.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return _finish(results, any(s.grader_failed for s in submissions))


def _proved(grader: Grader, chapters: list, shown: list = ()) -> bool:
    """Whether the grader earns full marks on each (chapter, language)'s own solution here
    (``proof.prove``, ``shown`` those a notebook just earned full marks for); else False,
    after one error line saying why and what to do."""
    from autograder.host.proof import prove

    try:
        prove(grader, chapters, shown=shown)
    except GraderFailure as failed:
        print(f"error: the grader cannot grade here, so nothing was graded: {failed}",
              file=sys.stderr)
        return False
    return True


def _grade_class(args: argparse.Namespace, folder: Path, origins: dict[Path, str] | None = None,
                 times: dict | None = None) -> int:
    from autograder.host.classroom import ClassRun, grade_class
    from autograder.host.gradebook import prepare_for_nbgrader
    from autograder.host.layouts import NotHandIns, collect, doubtful_ids, read_roster
    from autograder.host.recording import ClassCourse

    prepare_for_nbgrader()  # before the hand-ins are read: nbformat's notices about their ids
    try:
        roster = read_roster(args.roster) if args.roster else None
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        course = _class_directory(args, folder)
        if course is None:
            return 1
        known = class_chapters(course)
        if not _selection(args, folder, known):
            return 1
        submissions = collect(
            folder, known,
            origin_of=(lambda p: origins.get(p.resolve(), str(p))) if origins else None,
            time_of=(lambda p: times[p.resolve()]) if times else None, roster=roster)
    except NotHandIns as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    submissions = [s for s in submissions if _chosen(s, args)]
    if not submissions:
        print(f"error: {args.submissions}: no notebooks found (expected "
              "<learner>/<NN_slug>.ipynb, <learner>_<NN_slug>.ipynb or nbgrader's submitted/"
              f"{', of ' + _choice(args) if _choice(args) else ''})", file=sys.stderr)
        return 1
    submitted = course / "submitted"
    for line in doubtful_ids((s.learner for s in submissions if s.learner),
                             [p.name for p in submitted.iterdir()] if submitted.is_dir() else []):
        print(f"warning: {line}", file=sys.stderr)
    if args.dask and args.dask.startswith("local:"):  # its workers share this machine's cores
        args.jobs = int(args.dask.split(":", 1)[1] or 1)
    runner = _runner(args)
    if runner is None:
        return 1
    place = ClassCourse(course, _absolute_db(args.db) if args.db else None)
    run = ClassRun(place, Grader(_limits_of(args), _runtime_label(), place.course_id), known,
                   args.state or course / "grading-state.json",
                   args.csv or course / "grades.csv", runner, args.json,
                   args.regrade or bool(_choice(args)))
    try:
        entries = grade_class(run, submissions)
    finally:
        place.close()
    if run.stopped:
        _finish([e.result for e in entries if e.result.graded])
        print(f"error: grading {run.stopped}; what was graded is recorded and listed in "
              f"{run.csv}", file=sys.stderr)
        return 130 if "Ctrl-C" in run.stopped else 1
    if run.unproven:
        print(f"error: the grader cannot grade here, so nothing was graded and every earlier "
              f"grade stands: {run.unproven}", file=sys.stderr)
        return GRADER_FAILED
    code = _finish([e.result for e in entries if not e.ignored],
                   any(e.grader_failed for e in entries))
    for entry in entries:
        if entry.ignored:
            print(f"warning: {entry.origin} ({entry.learner}, {entry.chapter}): "
                  f"{entry.result.error}", file=sys.stderr)
    counts = {status: sum(e.status == status for e in entries) for status in
              ("graded", "regraded", "rerecorded", "unchanged", "not graded", "ignored")}
    print(f"{len(entries)} submission(s): {counts['graded']} graded now, "
          f"{counts['unchanged']} unchanged since they were last graded (not graded again), "
          f"{counts['regraded']} graded again (what grades them changed), "
          f"{counts['not graded']} not graded (see the error lines), {counts['ignored']} "
          f"ignored, {counts['rerecorded']} recorded again (only their due date, extension, "
          f"late penalty or hand-in time changed); course directory {course}, gradebook "
          f"{place.db_url}, scores in {run.csv}")
    _print_changes(entries)
    _print_sealed(entries)
    return code


def _print_sealed(entries: list) -> None:
    """A line naming the hand-ins whose code reached for what the checks know
    (``autograder.seal``): those tests scored zero; the notebooks are worth a look."""
    sealed = [f"{e.learner} {e.chapter}" for e in entries
              if e.result.graded and any(t.sealed for t in e.result.tests)]
    if sealed:
        print(f"warning: code reached for what the checks know (those tests scored 0): "
              f"{len(sealed)} ({', '.join(sealed)})", file=sys.stderr)


def _print_changes(entries: list) -> None:
    """A line per reason a hand-in of this run was graded or recorded again, naming them."""
    changed: dict[str, list[str]] = {}
    for entry in entries:
        if entry.status in ("regraded", "rerecorded") or entry.reason == "its file changed":
            changed.setdefault(f"{entry.status}: {entry.reason}", []).append(
                f"{entry.learner} {entry.chapter}")
    for why, hand_ins in changed.items():
        print(f"{why}: {len(hand_ins)} ({', '.join(hand_ins)})")


def _selection(args: argparse.Namespace, folder: Path, known: dict) -> bool:
    """Add the learner and chapter that a folder inside ``submitted/`` names to the hand-ins
    chosen (``--student``, ``--assignment``); False, after an error line, where a chosen
    learner is named like a chapter or a chosen chapter is not the class's."""
    from autograder.host.layouts import hand_ins_in

    place = hand_ins_in(folder)
    inside = place[1] if place else ()
    args.student = [*args.student, *inside[:1]]
    args.assignment = [*args.assignment, *inside[1:]]
    for learner in args.student:
        if learner in known:
            print(f"error: {learner!r} is a chapter's name, not a learner's: nothing graded "
                  "(give a learner's id, or the chapter with --assignment)", file=sys.stderr)
            return False
    for chapter in args.assignment:
        if chapter not in known:
            print(f"error: --assignment {chapter}: not a chapter of this class "
                  f"({', '.join(known)})", file=sys.stderr)
            return False
    return True


def _chosen(submission, args: argparse.Namespace) -> bool:
    return (not args.student or submission.learner in args.student) and \
        (not args.assignment or submission.chapter in args.assignment)


def _choice(args: argparse.Namespace) -> str:
    """The hand-ins chosen, in words ("" where all are)."""
    return " and ".join(filter(None, [
        "learner(s) " + ", ".join(args.student) if args.student else "",
        "chapter(s) " + ", ".join(args.assignment) if args.assignment else ""]))


def _class_directory(args: argparse.Namespace, folder: Path) -> Path | None:
    """The class's nbgrader course directory: ``--course-dir``, else the one the submissions
    are in, else this folder; set up (``course-dir``, every chapter) where it has no
    ``nbgrader_config.py`` yet. None, after an error line, where it has no chapter."""
    from autograder.builder.classdir import write_course_dir
    from autograder.host.layouts import course_directory

    course = args.course_dir or course_directory(folder) or Path.cwd()
    course = course.resolve()
    if not (course / "nbgrader_config.py").exists():
        write_course_dir(course, list(chapters().values()), sandbox=_sandboxed(args.sandbox))
        print(f"note: {course} is now this class's nbgrader course directory (its "
              "nbgrader_config.py and source/ written, as `python -m autograder course-dir` "
              "writes them)", file=sys.stderr)
    if not class_chapters(course):
        print(f"error: {course}: no source/NN_slug/NN_slug.ipynb in this course directory "
              "(set it up with `python -m autograder course-dir`)", file=sys.stderr)
        return None
    return course


def _runner(args: argparse.Namespace):
    """What grades the notebooks: threads, or a Dask cluster; None after an error line."""
    from autograder.host.classroom import threads

    if not args.dask:
        return threads(args.jobs)
    try:
        import distributed  # noqa: F401
    except ImportError:
        print("error: --dask needs Dask: pip install '.[cluster]' (or grade without --dask)",
              file=sys.stderr)
        return None
    from autograder.host.cluster import dask

    return dask(args.dask)


def _edition(args: argparse.Namespace) -> int:
    import course
    from autograder.builder.classdir import parse_chapters
    from autograder.builder.edition import build, chapter_list

    course.setup(quiet=True)  # the recordings run kernels: Triton's mode first
    try:
        revealed = {int(c.number) for c in parse_chapters(args.reveal, chapters())} \
            if args.reveal else set()
        edition = build(args.destination, revealed, args.repository)
    except (ValueError, FileExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name, missing in edition.refused.items():
        print(f"left out: {name} (its notebook runs the answers of {chapter_list(missing)}, "
              "not revealed)")
    for leak in {(leak.answer, leak.place.rpartition(".whl:")[2]): leak
                 for leak in edition.leaks}.values():  # a file and its copy in the wheel: once
        print(f"warning: the edition still ships chapter {leak.chapter}'s {leak.answer}: "
              f"{leak.found} of its {leak.lines} lines, written again in "
              f"{leak.place.rpartition('.whl:')[2]} (and its wheel)", file=sys.stderr)
    held = [int(c.number) for c in edition.included]
    holds = chapter_list(held) if held else "no chapter"
    shown = chapter_list(edition.revealed) if edition.revealed else "none"
    print(f"wrote {edition.root}, edition {edition.version} ({holds}; answers of {shown} "
          f"revealed) and {edition.wheel}")
    print(_installs_from(edition.repository, f"the wheel beside them ({edition.wheel.name})"))
    return 0


def _installs_from(repository: str, wheel: str) -> str:
    """The one line saying where the notebooks a class gets install the course from."""
    if repository:
        return f"the notebooks install the course from {repository} (or a course wheel beside them)"
    return (f"no --repository: the notebooks install the course only from {wheel}, "
            "never from the open course's repository")


def _translations(check: bool) -> int:
    from autograder.builder.translation import (
        TRANSLATED,
        catalogue_path,
        compendium,
        domains,
        stale,
        update,
    )

    left = 0
    known = {language: compendium(language) for language in TRANSLATED}  # read before writing
    for path, texts in domains().items():
        for language in TRANSLATED:
            catalogue = catalogue_path(path, language)
            if check:
                missing = stale(catalogue, texts)
                for line in missing:
                    print(line)
            else:
                missing = update(catalogue, texts, language, known[language])
                print(f"{catalogue.relative_to(REPO)}: {len(missing)} to translate")
            left += len(missing)
    print(f"{left} texts without a current translation")
    return 1 if check and left else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # its options are the benchmark's own (autograder.builder.bench)
        from autograder.builder.bench import main as bench

        return bench(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "release":
        from autograder.builder.release import release_all

        for path in release_all():
            print(f"wrote {path}")
        return 0

    if args.command == "translations":
        return _translations(args.check)

    if args.command == "book":
        from autograder.builder.book import BookError, build
        from autograder.builder.classdir import parse_chapters

        try:
            index = build(args.destination, parse_chapters(args.chapters, chapters()))
        except (ValueError, BookError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(index)
        return 0

    if args.command == "repository":
        from autograder.builder.repository import set_url

        try:
            set_url(args.url, list(chapters().values()))
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"pyproject.toml, the solutions' setup cells and the README's Colab links now "
              f"point at {args.url}; run `make exercises` and commit")
        return 0

    if args.command == "edition":
        return _edition(args)

    if args.command == "course-dir":
        from autograder.builder.classdir import parse_chapters, unmet_needs, write_course_dir
        from autograder.builder.edition import ClassEdition, class_repository

        try:
            selected = parse_chapters(args.chapters, chapters())
            repository = class_repository(args.repository)
            edition = ClassEdition.read(args.edition) if args.edition else None
        except (ValueError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        unmet = unmet_needs(selected, edition)
        for line in unmet:
            print(f"{'error' if edition else 'note'}: {line}",
                  file=sys.stderr if edition else sys.stdout)
        if edition and unmet:
            return 1
        for path in write_course_dir(args.directory, selected, args.course_id, args.exchange,
                                     _sandboxed(args.sandbox), repository,
                                     edition.version if edition else ""):
            print(f"wrote {path}")
        print(_installs_from(repository, "a course wheel in their folder (build one with "
                             "`python -m autograder edition` and put its wheel in each "
                             "source/NN_slug/: nbgrader releases it with the notebook)"))
        return 0

    if _sandbox_missing(args):
        return 2
    if args.command == "grade":
        return _grade_notebooks(args)

    source = args.submissions
    if source.is_file() and zipfile.is_zipfile(source):
        from autograder.host.layouts import unpack

        with tempfile.TemporaryDirectory(prefix="kv-course-uploads-") as unpacked:
            origins, times = unpack(source, Path(unpacked))
            return _grade_class(args, Path(unpacked), origins, times)
    if not source.is_dir():
        print(f"error: {source}: not a directory or a zip file", file=sys.stderr)
        return 1
    return _grade_class(args, source)
