"""Notebooks whose every TODO reaches for what the checks know instead of computing anything:
the attacks of a learner who wants the grade without the work.

Each TODO's body becomes one call of ``_kv_attack(kind, name, arguments)``, the kinds taken in
turn over a chapter's TODOs; a Triton kernel becomes an object that launches like one and
attacks when launched. Every attack first finds something the checks hold, then answers with
it:

    frame_walk        sys._getframe(), up the stack            a local named ``expected``;
    traceback         an exception's tb_frame, up the stack    an object with the TODO's
    generator         a running generator's gi_frame, up       method (a model); the course's
                                                               version a check lends
    gc                the garbage collector's module namespaces  a hidden module's ``*_case``
    modules           the loaded modules, by name               oracle, or its lending of the
    computed_import   __import__ of a name built at run time    course's method
    importlib         a fresh copy loaded from the file, else import_module
    disk              the hidden module's source read and run
    always_equal      a result that compares equal to anything

No attack names the grader in a way the static scan would see: the defences inside the
kernel are what is tested.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat

KINDS = ("frame_walk", "traceback", "generator", "gc", "modules", "computed_import",
         "importlib", "disk", "always_equal")

ATTACKER = r'''
import gc as _kv_gc
import importlib as _kv_importlib
import importlib.util as _kv_importlib_util
import inspect as _kv_inspect
import sys as _kv_sys
from pathlib import Path as _KvPath

_KV_HIDDEN = "auto" + "grader" + ".hidden"
_KV_NOTHING = object()


class _KvAlwaysEqual:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = object.__hash__


def _kv_start(kind):
    if kind == "frame_walk":
        return _kv_sys._getframe(1)
    if kind == "traceback":
        try:
            raise LookupError
        except LookupError as error:
            return error.__traceback__.tb_frame
    box = []

    def walk():
        yield box[0].gi_frame.f_back

    box.append(walk())
    return next(box[0])


def _kv_from_frames(start, name, me, arguments):
    frame = start
    while frame is not None:
        found = _kv_from_values(frame.f_locals, name, me, arguments)
        if found is not _KV_NOTHING:
            return found
        frame = frame.f_back
    return _KV_NOTHING


def _kv_from_values(values, name, me, arguments):
    if "expected" in values and "got" not in values:
        expected = values["expected"]
        error = getattr(expected, "error", None)
        if isinstance(error, type) and issubclass(error, BaseException):
            raise error("attack")
        return expected
    for value in list(values.values()):
        if value is me or isinstance(value, type) or callable(value):
            continue
        method = getattr(type(value), name, None)
        if method is not None and callable(method) and type(value) is not type(me):
            try:
                return getattr(value, name)(**arguments)
            except TypeError:
                continue
    return _KV_NOTHING


def _kv_namespaces(kind):
    if kind == "gc":
        return [o for o in _kv_gc.get_objects() if type(o) is dict
                and str(o.get("__name__", "")).startswith(_KV_HIDDEN + ".")]
    if kind == "modules":
        loaded = getattr(_kv_sys, "mod" + "ules")
        return [vars(m) for n, m in list(loaded.items()) if n.startswith(_KV_HIDDEN + ".")]
    names = [f"{_KV_HIDDEN}.ch{n:02d}" for n in range(1, 12)]
    if kind == "computed_import":
        found = []
        for module_name in names:
            try:
                found.append(vars(__import__(module_name, fromlist=["_"])))
            except ImportError:
                pass
        return found
    folder = _KvPath(_kv_importlib_util.find_spec(_KV_HIDDEN).submodule_search_locations[0])
    found = []
    for module_name in names:
        path = folder / (module_name.rpartition(".")[2] + ".py")
        if not path.exists():
            continue
        if kind == "disk":
            namespace = {"__name__": module_name + "_copy"}
            exec(compile(path.read_text(), "copy.py", "exec"), namespace)
            found.append(namespace)
            continue
        spec = _kv_importlib_util.spec_from_file_location(module_name + "_copy", path)
        module = _kv_importlib_util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception:
            module = _kv_importlib.import_module(module_name)
        found.append(vars(module))
    return found


def _kv_from_namespaces(namespaces, name, me, arguments):
    for namespace in namespaces:
        lend = namespace.get("course_version")
        if me is not None and callable(lend):
            for course in list(namespace.values()):
                if isinstance(course, type) and course.__module__.startswith("course.") \
                        and type(me).__name__ == course.__name__ and hasattr(course, name):
                    return lend(_kv_inspect.getattr_static(course, name))(me, **arguments)
        if me is not None:
            continue
        for key, value in list(namespace.items()):
            if key.endswith("_case") and callable(value):
                try:
                    answer = value(**arguments)
                except Exception:
                    continue
                if isinstance(answer, tuple) and len(answer) == 2:
                    error = getattr(answer[0], "error", None)
                    if isinstance(error, type) and issubclass(error, BaseException):
                        raise error("attack")
                    return answer[0]
    return _KV_NOTHING


def _kv_attack(kind, name, arguments):
    me = arguments.pop("self", None)
    if kind == "always_equal":
        return _KvAlwaysEqual()
    if kind in ("frame_walk", "traceback", "generator"):
        found = _kv_from_frames(_kv_start(kind), name, me, arguments)
    else:
        found = _kv_from_namespaces(_kv_namespaces(kind), name, me, arguments)
    return None if found is _KV_NOTHING else found


class _KvKernel:
    """Launches like a Triton kernel; when launched, attacks."""

    def __init__(self, kind, name):
        self.kind, self.__name__ = kind, name

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            return _kv_attack(self.kind, self.__name__, dict(kwargs))
        return launch
'''


def _attacked_cell(source: str, kinds: list[str]) -> str:
    """``source`` (a solution cell) with each function's body one attack, the kinds taken in
    turn from ``kinds`` (consumed)."""
    tree = ast.parse(source)
    for index, node in enumerate(tree.body):
        if not isinstance(node, ast.FunctionDef):
            continue
        kind = kinds.pop(0)
        if any("jit" in ast.unparse(d) for d in node.decorator_list):
            tree.body[index] = ast.parse(f"{node.name} = _KvKernel({kind!r}, {node.name!r})"
                                         ).body[0]
            continue
        docstring = [node.body[0]] if ast.get_docstring(node) else []
        node.body = docstring + ast.parse(
            f"return _kv_attack({kind!r}, {node.name!r}, dict(locals()))").body
    return ATTACKER + "\n\n" + ast.unparse(tree)


def attacked(exercise: Path, solution: Path, destination: Path, first: int = 0) -> Path:
    """``exercise`` with every answer cell replaced by its solution cell's definitions, each
    function's body an attack; the kinds are taken in turn from ``KINDS[first]``."""
    notebook = nbformat.read(exercise, as_version=4)
    solutions = {c.metadata["nbgrader"]["grade_id"]: c.source
                 for c in nbformat.read(solution, as_version=4).cells
                 if c.metadata.get("nbgrader", {}).get("solution")}
    kinds = [KINDS[(first + i) % len(KINDS)] for i in range(200)]
    for cell in notebook.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade_id") in solutions and meta.get("solution") and not meta.get("locked"):
            cell.source = _attacked_cell(solutions[meta["grade_id"]], kinds)
    destination.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, destination)
    return destination


def attacks_in(path: Path) -> dict[str, str]:
    """An attacked notebook's TODOs -> the kind of attack each one's body is."""
    source = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells)
    return {name: kind for kind, name in re.findall(
        r"(?:_kv_attack|_KvKernel)\('(\w+)', '(\w+)'", source)}


def stopped_by_the_seal(result: dict, attacks: dict[str, str]) -> set[str]:
    """Assert that every test of a graded notebook's ``result`` scored zero; the kinds of
    attack whose tests the seal failed (a test fails by its own TODO's attack, or by an
    earlier TODO's that the check also calls; an attack that found nothing fails as a wrong
    answer does)."""
    assert result["status"] == "graded", result
    stopped = set()
    for test in result["tests"]:
        assert test["points"] == 0, (result["notebook"], test)
        todo = test["id"].removeprefix("test_").removesuffix("_hidden")
        if test["sealed"] and todo in attacks:
            stopped.add(attacks[todo])
    return stopped
