"""The learner edition: no answer of a chapter not revealed is in it, no way to the open
course (whose repository holds every answer), nothing of the chapters it leaves out, and its
visible tests still catch every mutant with the hint it gets in the open course.

The notebooks of an edition are run in a fresh environment in tests/test_wheel.py.
"""

from __future__ import annotations

import ast
import importlib
import io
import json
import re
import subprocess
import sys
import tokenize
import zipfile
from pathlib import Path

import nbformat
import pytest
from conftest import CHAPTERS, grade, nbgrader
from hypothesis import given, settings
from hypothesis import strategies as st
from known_copies import SHARED
from subjects import alternatives

import autograder.private as private
from autograder.answers import BEGIN, END, chapter_answers, library_modules, module_file, span
from autograder.builder.copies import revealed_too
from autograder.builder.edition import build, recordings
from autograder.builder.needs import direct_needs, needs, why
from autograder.builder.render import load, subjects
from autograder.builder.repository import setup_cell_of, url
from autograder.table import PARTS

CLASS_REPOSITORY = "https://git.example.edu/kv/class-2026"


def _normalised(text: str) -> str:
    """Code without comments, blank lines or indentation: what a leak would still contain."""
    lines = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    return "\n".join(line for line in lines if line)


def _answer_regions() -> dict[str, str]:
    """qualname -> the normalised code between each answer's markers."""
    found = {}
    for module in library_modules():
        text = module_file(module).read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef):
                start, end = span(lines, node)
                body = "\n".join(lines[start:end])
                for region in re.findall(re.escape(BEGIN) + r"\n(.*?)\n\s*" + re.escape(END),
                                         body, re.S):
                    found[f"{module}.{node.name}"] = _normalised(region)
    return found


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """An edition with nothing revealed and no repository named, and its wheel."""
    return build(tmp_path_factory.mktemp("edition") / "class", set())


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """An edition with chapters 1 and 2 revealed, published from the class's repository."""
    return build(tmp_path_factory.mktemp("edition") / "published", {1, 2}, CLASS_REPOSITORY)


def test_an_edition_with_nothing_revealed_holds_no_answer(bare):
    texts = {str(p.relative_to(bare.root)): p.read_text(encoding="utf-8", errors="replace")
             for p in bare.root.rglob("*") if p.is_file() and p.suffix in (".py", ".ipynb")}
    with zipfile.ZipFile(bare.wheel) as wheel:
        texts |= {f"wheel:{name}": wheel.read(name).decode("utf-8", "replace")
                  for name in wheel.namelist() if name.endswith(".py")}
    corpus = {name: _normalised(text) for name, text in texts.items()}
    regions = _answer_regions()
    assert len(regions) >= 40
    leaks = [(answer, name) for answer, region in regions.items()
             for name, text in corpus.items() if region in text]
    assert leaks == []
    assert not [name for name in texts if "hidden" in name.split("/")
                or name.startswith(("solutions", "tests"))]
    private_code = [_normalised(ast.unparse(node))
                    for path in sorted(module_file("autograder.hidden").parent.glob("*.py"))
                    for node in ast.parse(path.read_text()).body
                    if isinstance(node, ast.FunctionDef | ast.ClassDef)]
    assert not [code for code in private_code for text in corpus.values() if code in text]


def test_chapters_whose_notebooks_need_unrevealed_answers_are_left_out(bare):
    assert sorted(bare.refused) == sorted(n for n, p in PARTS.items() if needs(p.number))
    shipped = sorted(p.stem for p in (bare.root / "exercises").glob("*.ipynb"))
    assert shipped == sorted(c.name for c in bare.included)


def test_a_chapters_needs_are_read_from_what_its_code_reaches():
    """Chapter 10's checks run chapter 9's kernel, and the chain says where; chapter 9's
    kernel needs chapter 7, so chapter 10 does too, though nothing of chapter 10 calls chapter
    7's answers itself: a chapter's needs hold their own needs."""
    chain = why(10, 9)
    assert chain[0][0].startswith(("autograder.checks.ch10", "course.", "kernels."))
    assert chain[-1] in {("kernels.varlen_attention", "varlen_attention_kernel"),
                         ("kernels.varlen_attention_ref", "varlen_paged_attention")}
    assert 7 not in direct_needs(10) and 7 in needs(10)
    for parts in PARTS.values():
        for other in needs(parts.number):
            assert set(needs(other)) <= set(needs(parts.number)), (parts.slug, other)
    assert needs(1) == () and 1 in needs(2)


def test_the_manual_lists_each_chapters_needs_as_computed():
    manual = (Path(__file__).parents[1] / "docs" / "instructors.md").read_text(encoding="utf-8")
    listed = dict(re.findall(r"chapter (\d+) needs ([\d, and]+?)[;.)]", manual))
    computed = {str(p.number): p.number for p in PARTS.values() if needs(p.number)}
    assert sorted(listed, key=int) == sorted(computed, key=int), listed
    for number, text in listed.items():
        assert tuple(map(int, re.findall(r"\d+", text))) == needs(int(number)), number


REVEALS = sorted({tuple(sorted({p.number, *needs(p.number)} if with_needs else {p.number}))
                  for p in PARTS.values() for with_needs in (False, True)})


@pytest.mark.parametrize("revealed", REVEALS, ids=lambda r: "reveal-" + "-".join(map(str, r)))
def test_an_edition_ships_of_unrevealed_answers_only_the_known_copies(revealed):
    found = {(copy.answer, copy.place) for copy in revealed_too(revealed)}
    assert found - SHARED == set()


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.sets(st.integers(1, len(PARTS))))
def test_any_reveal_ships_of_unrevealed_answers_only_the_known_copies(revealed):
    """Any set of chapters an instructor may reveal, with or without their needs."""
    found = {(copy.answer, copy.place) for copy in revealed_too(revealed)}
    assert found - SHARED == set()


def test_an_edition_names_every_unrevealed_answer_it_ships(bare, published, tmp_path):
    """Measured on what was built, the wheel's files too, and as predicted from the library:
    none where no revealed answer writes an unrevealed one again; chapter 4's free where
    chapter 3 is revealed alone (its free is chapter 4's)."""
    assert bare.leaks == [] and published.leaks == []
    third = build(tmp_path / "third", {3})
    assert any(copy.place.startswith("dist/") for copy in third.leaks)
    shipped = {(copy.answer, copy.place.rpartition(".whl:")[2]) for copy in third.leaks}
    assert shipped == {(copy.answer, copy.place) for copy in revealed_too({3})} == {
        ("course.v0.prefix_cache.PrefixCachingBlockManager.free", "course/v0/block_manager.py")}


def _publish(version: str) -> int:
    return int(version.partition(".post")[2])


def test_an_edition_is_published_again_in_place_keeping_what_the_class_added(tmp_path):
    root = tmp_path / "class"
    first = build(root, {1}, wheel=False)
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    left = root / "exercises" / "05_scheduling_and_continuous_batching.ipynb"
    left.write_text("left from before")
    second = build(root, {1, 2, 3, 4}, wheel=False)
    assert _publish(second.version) > _publish(first.version)
    assert (root / ".git" / "HEAD").read_text() == "ref: refs/heads/main\n"
    record = json.loads((root / "course" / "edition.json").read_text())
    assert record["revealed"] == [1, 2, 3, 4] and record["version"] == second.version
    assert f'EDITION = "{second.version}"' in setup_cell_of(
        root / "exercises" / "04_prefix_caching.ipynb")
    assert "left from before" not in left.read_text()
    assert f'version = "{second.version}"' in (root / "pyproject.toml").read_text()


def test_an_edition_refuses_a_folder_that_holds_something_else(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="no edition"):
        build(tmp_path, {1}, wheel=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_course_dir_refuses_a_chapter_whose_needs_the_classs_edition_does_not_reveal(
        bare, tmp_path):
    refused = grade("course-dir", tmp_path / "class", "--chapters", "1,3,10", "--edition",
                    bare.root)
    assert refused.returncode == 1, refused.stdout
    assert "10_hybrid_models runs the answers of chapters 4, 6, 7 and 9, which edition " \
        f"{bare.version} does not reveal" in refused.stderr, refused.stderr
    assert not (tmp_path / "class" / "source").exists()
    said = grade("course-dir", tmp_path / "open", "--chapters", "1,10")
    assert said.returncode == 0, said.stderr
    assert "10_hybrid_models runs the answers of chapters 4, 6, 7 and 9" in said.stdout
    released = grade("course-dir", tmp_path / "class", "--chapters", "1,3", "--edition",
                     bare.root)
    assert released.returncode == 0, released.stderr
    notebook = tmp_path / "class" / "source" / "03_block_manager" / "03_block_manager.ipynb"
    assert f'EDITION = "{bare.version}"' in setup_cell_of(notebook)


def _visible_messages(chapter) -> dict[tuple[str, str], str]:
    """Every mutant's first visible failure, by (TODO, mutant)."""
    checks = importlib.import_module(PARTS[chapter.name].checks)
    mutants = importlib.import_module(PARTS[chapter.name].mutants).MUTANTS
    found = {}
    for name, wrong in mutants.items():
        for mutant, _ in wrong:
            try:
                getattr(checks, f"check_{name}")(mutant)
            except AssertionError as failure:
                found[(name, mutant.__name__)] = str(failure)
    return found


def test_visible_checks_replay_every_mutants_hint_without_the_hidden_checks(tmp_path,
                                                                           monkeypatch):
    live = {chapter.name: _visible_messages(chapter) for chapter in CHAPTERS}
    recordings(tmp_path)
    monkeypatch.setattr(private, "RECORDED", tmp_path)
    private._replay.cache_clear()
    try:
        for chapter in CHAPTERS:
            assert _visible_messages(chapter) == live[chapter.name], chapter.name
            checks = importlib.import_module(PARTS[chapter.name].checks)
            for grade_id, target in subjects(nbformat.read(chapter.source, 4)).items():
                getattr(checks, f"check_{grade_id}")(load(target))  # the answers still pass
    finally:
        private._replay.cache_clear()


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.name)
def test_visible_checks_never_run_the_chapters_own_answers(chapter, monkeypatch):
    """In the learner edition the chapter's answers are stubs: its visible checks, given a
    differently written correct solution, must pass without ever calling them."""
    def refuse(qualname):
        def refused(*args, **kwargs):
            raise AssertionError(f"a visible check ran the course's own {qualname}")
        return refused

    # imported before the answers are refused: mutants build on them, and the hidden module
    # (an edition replays its answers from recordings instead) computes with them
    subjects = alternatives(chapter)
    importlib.import_module(PARTS[chapter.name].hidden)
    for module_name, qualname in chapter_answers(chapter.name):
        owner_name, _, name = qualname.rpartition(".")
        module = importlib.import_module(module_name)
        owner = getattr(module, owner_name) if owner_name else module
        if not hasattr(vars(owner)[name], "__getitem__"):  # a Triton kernel is launched
            monkeypatch.setattr(owner, name, refuse(qualname))
    checks = importlib.import_module(PARTS[chapter.name].checks)
    for grade_id, found in subjects.items():
        for subject in found:
            getattr(checks, f"check_{grade_id}")(subject)


def _open_repository_in(folder: Path) -> list[str]:
    """Every file under ``folder`` (and every member of a wheel there) that names the open
    course's repository, in any spelling of its address."""
    address = re.sub(r"^https?://", "", url()).removesuffix(".git").lower().encode()
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        contents = {str(path.relative_to(folder)): path.read_bytes()}
        if path.suffix == ".whl":
            with zipfile.ZipFile(path) as wheel:
                contents |= {f"{path.name}:{name}": wheel.read(name) for name in wheel.namelist()}
        found += [name for name, data in contents.items() if address in data.lower()]
    return found


def _class_release(root: Path, *options: str) -> tuple[Path, str]:
    """A class directory set up by ``course-dir`` with ``options``, chapter 1 generated for
    release by nbgrader's own generate_assignment (``release/`` is what learners fetch);
    with what ``course-dir`` said."""
    made = grade("course-dir", root, "--chapters", "1-2", *options)
    assert made.returncode == 0, made.stderr
    nbgrader("generate_assignment", CHAPTERS[0].name, cwd=root)
    assert (root / "release" / CHAPTERS[0].name / f"{CHAPTERS[0].name}.ipynb").exists()
    return root, made.stdout


@pytest.mark.pipeline
def test_no_edition_or_class_release_names_the_open_repository(bare, published, tmp_path):
    for edition, installs_from in ((bare, ""), (published, CLASS_REPOSITORY)):
        assert _open_repository_in(edition.root) == []
        for notebook in sorted((edition.root / "exercises").rglob("*.ipynb")):
            assert f'REPOSITORY = "{installs_from}"' in setup_cell_of(notebook), notebook
    for folder, options, installs_from in (
            ("bare", (), ""), ("published", ("--repository", CLASS_REPOSITORY), CLASS_REPOSITORY)):
        root, said = _class_release(tmp_path / folder, *options)
        assert _open_repository_in(root) == []
        released = root / "release" / CHAPTERS[0].name / f"{CHAPTERS[0].name}.ipynb"
        assert f'REPOSITORY = "{installs_from}"' in setup_cell_of(released)
        # one line says where the notebooks install from
        assert len([line for line in said.splitlines() if "install" in line]) == 1, said


def test_the_open_repository_is_refused_as_a_class_repository(tmp_path):
    with pytest.raises(ValueError, match="holds every answer"):
        build(tmp_path / "edition", set(), url().removesuffix("/") + ".git/", wheel=False)
    done = grade("course-dir", tmp_path / "class", "--repository", url().upper())
    assert done.returncode == 1 and "holds every answer" in done.stderr, done.stderr
    assert not (tmp_path / "class").exists() and not (tmp_path / "edition").exists()


def test_a_setup_cell_with_no_repository_installs_nothing_it_was_not_handed(bare, tmp_path):
    """Where the course is not installed and no wheel sits beside the notebook, the cell stops
    with one sentence and runs no installer (``-S``: this interpreter sees no installed
    course)."""
    cell = setup_cell_of(bare.root / "exercises" / f"{CHAPTERS[0].name}.ipynb")
    done = subprocess.run([sys.executable, "-S", "-c", cell], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "put the wheel you were given next to this notebook" in done.stdout
    assert "Installing" not in done.stdout


def _paths_named(text: str) -> list[str]:
    """Paths into the course's folders that ``text`` names (``autograder/hidden/chNN.py``),
    as glob patterns: a placeholder (``NN``, ``NAME``, ``<topic>``) matches anything."""
    named = re.findall(r"(?<![\w./-])((?:autograder|course|kernels|tests|solutions|exercises|docs"
                       r"|hub)/[\w./*<>-]*)", text)
    return [re.sub(r"<\w+>|\b[A-Z]{2,}\b|NN", "*", path.rstrip(".")) for path in named]


def _missing(root: Path, pattern: str) -> bool:
    """Whether ``pattern`` names nothing under ``root``: no file matches, nor, for a file a
    tool writes (a placeholder in its name, ``kernels/results/NAME.json``), its folder."""
    folder, _, name = pattern.rpartition("/")
    return not list(root.glob(pattern)) and not ("*" in name and (root / folder).is_dir())


def _docstrings_and_comments(source: str) -> str:
    tree = ast.parse(source)
    texts = [ast.get_docstring(node, clean=False) or "" for node in ast.walk(tree)
             if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)]
    texts += [token.string for token in tokenize.generate_tokens(io.StringIO(source).readline)
              if token.type == tokenize.COMMENT]
    return "\n".join(texts)


@pytest.mark.parametrize("edition_of", ["bare", "published"])
def test_an_edition_stands_on_its_own(edition_of, request):
    """It ships the checks, recordings and catalogues of the chapters it holds and no others;
    its docstrings, comments and README name only files it ships; its folder is ready for
    ``git add .``; its README says what it holds in plain words."""
    edition = request.getfixturevalue(edition_of)
    root = edition.root
    checks = {p.stem for p in (root / "autograder" / "checks").glob("ch*.py")}
    recorded = {p.stem for p in (root / "autograder" / "checks" / "recorded").glob("*.pkl")}
    held = {PARTS[c.name].checks.rpartition(".")[2] for c in edition.included}
    left_out = {PARTS[name].checks.rpartition(".")[2] for name in edition.refused}
    assert held <= checks and recorded <= checks and recorded, (held, checks, recorded)
    assert not left_out & (checks | recorded), left_out & (checks | recorded)
    catalogues = {p.stem for p in (root / "autograder" / "locale").rglob("ch*.po")}
    assert catalogues == {f"ch{n:02d}" for n in range(1, int(max(held)[2:]) + 1)}

    missing = []
    for path in sorted(root.rglob("*.py")):
        for named in _paths_named(_docstrings_and_comments(path.read_text(encoding="utf-8"))):
            if _missing(root, named):
                missing.append((str(path.relative_to(root)), named))
    readme = (root / "README.md").read_text(encoding="utf-8")
    missing += [("README.md", named) for named in _paths_named(readme)
                if _missing(root, named)]
    assert missing == []

    assert not list(root.glob("*.egg-info")) and not (root / "build").exists()
    ignored = (root / ".gitignore").read_text().split()
    assert {"dist/", "build/", "*.egg-info/", "__pycache__/"} <= set(ignored)
    readme = " ".join(readme.split())
    assert not re.search(r"chapters \d+(?!,| and)|chapter \d+,", readme), readme
    if edition.repository:
        assert f"installs this edition from {edition.repository}" in readme
    else:
        assert f"dist/{edition.wheel.name}" in readme
