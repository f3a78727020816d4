"""Sealing the checks off from the code they test: while a notebook is graded, the learner's
code can neither read what a check knows nor call the grader's own functions.

A check holds, while it calls the learner's code, the expected value, the reference function
that computed it, the model a stateful check compares with, the known mistakes a hint names
and the hidden cases still to come. All of it lives in the grading kernel beside the
learner's code. ``seal()`` runs when the kernel starts, before the notebook's first cell
(``autograder.arming``), and closes each way to it:

* **Every frame is told apart by its code's file**: the grader's (``autograder/``), the
  library's (the course's ``course/`` and ``kernels/``, Python's own library, installed
  packages, and the grader's ``autograder.host.warm``, which starts a kernel forked warm as
  ipykernel's launcher starts one cold), or the learner's (a notebook cell, code compiled from a
  string). Code cannot be given a grader's or library's file name by the learner: compiling
  to such a name, building a code object, and unmarshalling one that claims such a file
  without being that file's own bytecode are refused.
* **The grader's functions refuse the learner.** The checks' and hidden checks' modules are
  compiled, when the kernel imports them, with a gate at the top of what their namespaces
  reach (every function and lambda, every class's constructors, class and static methods): it
  reads a nested function's ``__code__``, which raises an audit event that no name lookup
  stands between (a learner cannot patch it away). Called, however it was reached
  (``sys.modules``, a computed import, a module's globals, an object a check handed over),
  by the learner's code, with only library code between, a grader function raises
  ``Sealed``. A check's entry (``autograder.private.visible``) may be called from a cell,
  but not by the learner's code inside a running check.
* **Introspection that reaches a check's frames is refused** to the learner's code: a frame
  from ``sys._getframe`` (``inspect.currentframe``, ``inspect.stack``) or from a
  traceback, generator or coroutine, while a check is on the stack; ever: other threads'
  frames (``sys._current_frames``), the garbage collector's object lists, trace and profile
  functions (which would be handed every frame of the next test), ``ctypes``, reading the
  grader's files (or this process's memory) and starting programs.
* A learner's code that tripped a defence fails the test whatever it did next: the check's
  entry asks, as the check ends, whether a defence was tripped while it ran.

The state (the grader's module namespaces, the trips) lives in the closure of the audit
hook, which nothing reachable refers to; the hook reads copies of this module's names and of
the builtins taken when it is installed, so rebinding them later changes nothing it decides;
an audit hook cannot be removed. ``Sealed`` is a
``BaseException``, so that ``except Exception`` in the learner's code does not swallow it.

What stays open is written down in CONTRIBUTING ("What a learner's code cannot reach").
"""

from __future__ import annotations

import ast
import builtins
import importlib.abc
import importlib.machinery
import importlib.util
import io
import marshal
import os
import sys
import sysconfig
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from course.language import tr_later

GATE = "kv-course gate"  # the default of the lambda a grader function starts by reading
ENTRY = "kv-course entry"  # the same, for a check's entry, which a cell may call
CHECK_STARTED, CHECK_ENDED = "kv-course.check-started", "kv-course.check-ended"
OPENED = "kv-course.opened"

_AUTOGRADER = str(Path(__file__).resolve().parent) + os.sep
# A kernel forked warm (``autograder.host.warm``) runs below this file's frames, as a kernel
# started cold runs below ipykernel's launcher: they are the library's, not a check's.
_WARM_LAUNCH = os.path.join(_AUTOGRADER, "host", "warm.py")
_GATED_PACKAGES = ("autograder.checks.", "autograder.hidden.")


class Sealed(BaseException):
    """The learner's code reached for what the checks know."""

    def _render_traceback_(self) -> list[str]:  # IPython shows the message alone
        return [str(self)]


def _message(what: str) -> str:
    from autograder.hints import in_language

    return in_language(f"This test does not count: the code it checks reached for what the "
                       f"checks know ({what}). Write the TODO from its inputs alone.")


def opened(*objects: Any) -> Any:
    """Let the learner's code use ``objects`` until the running check ends: what a check
    hands it to call by design and the gate would refuse (the attention a decode or engine
    step is given). A function is opened by its code, an
    instance for its methods, a class for the methods it defines. Returns the first
    object."""
    (lambda __kv_gate__="kv-course gate": None).__code__  # noqa: B018 (the learner may not)
    for value in objects:
        sys.audit(OPENED, value)
    return objects[0]


# --- the gate, compiled into every function of the checks ------------------------------------


def _gate_statements() -> list[ast.stmt]:
    """The gate: a nested function named ``__kv_gate__`` whose ``__code__`` is read (its name,
    unlike its defaults, is read without an audit event of its own)."""
    return ast.parse("def __kv_gate__():\n    pass\n__kv_gate__.__code__").body


def _lambda_gate() -> ast.expr:
    """A lambda's gate, an expression: a marked lambda's ``__code__``."""
    return ast.parse(f"(lambda __kv_gate__={GATE!r}: None).__code__").body[0].value


_CONSTRUCTORS = frozenset({"__init__", "__new__", "__call__", "__post_init__"})


def _inherits_its_constructor(node: ast.ClassDef) -> bool:
    """A plain class (no decorator, no metaclass) with a base that is not a builtin type,
    defining no constructor of its own."""
    import builtins

    own = {f.name for f in node.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}
    bases = [ast.unparse(b) for b in node.bases]
    return bool(bases) and not node.decorator_list and not node.keywords and \
        not own & {"__init__", "__new__"} and not any(hasattr(builtins, b) for b in bases)


class _Gating(ast.NodeTransformer):
    """Put the gate first (after a docstring) in what a module's namespace reaches by name or
    through its data: its functions and lambdas, and its classes' constructors, class and
    static methods. An instance's methods are reached through the instance, and the checks'
    instances are out of the learner's reach (frames and the garbage collector are refused,
    and a class cannot be instantiated by the learner's code); gating every method call
    would put an audit event into each of a model's million steps. What a function defines
    inside it (a strategy's lambda, a closure) is reached only through an object or a frame
    of a running check, the same way."""

    def __init__(self) -> None:
        self.inside_function = 0
        self.in_class = False

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        outer, self.in_class = self.in_class, not self.inside_function
        if self.in_class and _inherits_its_constructor(node):
            # a check's subclass of a library class (an engine, a connector): a constructor
            # of its own, so that it too is gated
            node.body.append(ast.parse("def __init__(self, *args, **kwargs):\n"
                                       "    super().__init__(*args, **kwargs)").body[0])
        self.generic_visit(node)
        self.in_class = outer
        return node

    def _gated(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.AST:
        in_class, self.in_class = self.in_class, False
        self.inside_function += 1
        self.generic_visit(node)
        self.inside_function -= 1
        self.in_class = in_class
        decorators = {ast.unparse(d) for d in node.decorator_list}
        if self.inside_function or in_class and node.name not in _CONSTRUCTORS and \
                not decorators & {"classmethod", "staticmethod"}:
            return node
        docstring = (node.body and isinstance(node.body[0], ast.Expr)
                     and isinstance(node.body[0].value, ast.Constant)
                     and isinstance(node.body[0].value.value, str))
        at = 1 if docstring else 0
        node.body[at:at] = _gate_statements()
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = _gated

    def visit_Lambda(self, node: ast.Lambda) -> ast.AST:
        self.inside_function += 1
        self.generic_visit(node)
        self.inside_function -= 1
        if self.inside_function:
            return node
        node.body = ast.Subscript(value=ast.Tuple(elts=[_lambda_gate(), node.body],
                                                  ctx=ast.Load()),
                                  slice=ast.Constant(1), ctx=ast.Load())
        return node


def gated_code(source: bytes, path: str) -> Any:
    """``source`` compiled with the gate in every function and lambda."""
    return _compiled(source, path)[0]


def _compiled(source: bytes, path: str) -> tuple[Any, frozenset[str]]:
    """``source`` compiled with the gate, and the names its code reads (``ast.Name``)."""
    tree = ast.parse(source, filename=path)
    names = frozenset(node.id for node in ast.walk(tree) if isinstance(node, ast.Name))
    code = compile(ast.fix_missing_locations(_Gating().visit(tree)), path, "exec",
                   dont_inherit=True)
    return code, names


# path -> (its source, its gated code, the names it reads): the checks of a chapter compiled
# by its kernels' template (``compile_ahead``), before any kernel is forked from it, so that
# each kernel imports them without compiling them again; emptied at arming (``arming.arm``),
# before any of the learner's code runs
AHEAD: dict[str, tuple[bytes, Any, frozenset[str]]] = {}


def compile_ahead(paths: list[str]) -> None:
    """Compile the checks modules at ``paths`` now, for the processes forked after."""
    for path in paths:
        source = Path(path).read_bytes()
        AHEAD[path] = (source, *_compiled(source, path))


def _ahead(path: str, source: bytes) -> tuple[Any, frozenset[str]] | None:
    """What ``compile_ahead`` made of ``path``, where it was these very bytes and the code
    is that file's own (what the learner's code might put here is not: it cannot make code
    under a grader's file name); None otherwise."""
    found = AHEAD.get(path)
    if found is None or found[0] != source or found[1].co_filename != path:
        return None
    return found[1], found[2]


def names_read(path: str) -> frozenset[str]:
    """The names the code of the module at ``path`` reads (``ast.Name``)."""
    source = Path(path).read_bytes()
    ahead = _ahead(path, source)
    return ahead[1] if ahead else _compiled(source, path)[1]


class _GatedLoader(importlib.machinery.SourceFileLoader):
    """Loads a checks module from its source, gated, never from (or to) a bytecode cache."""

    def __init__(self, fullname: str, path: str, namespaces: set[int]) -> None:
        super().__init__(fullname, path)
        self._namespaces = namespaces

    def get_code(self, fullname: str) -> Any:
        path = self.get_filename(fullname)
        source = self.get_data(path)
        ahead = _ahead(path, source)
        return ahead[0] if ahead else gated_code(source, path)

    def exec_module(self, module: Any) -> None:
        self._namespaces.add(id(module.__dict__))
        super().exec_module(module)


class _GatedFinder(importlib.abc.MetaPathFinder):
    def __init__(self, namespaces: set[int]) -> None:
        self._namespaces = namespaces

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if not fullname.startswith(_GATED_PACKAGES):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not str(spec.origin).endswith(".py"):
            return spec
        spec.loader = _GatedLoader(fullname, spec.origin, self._namespaces)
        return spec


# --- whose code a frame runs -------------------------------------------------------------------

GRADER, LIBRARY, LEARNER = "grader", "library", "learner"


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots |= {p for p in sys.path if p.endswith(("site-packages", "dist-packages"))}
    for package in ("course", "kernels"):
        spec = importlib.util.find_spec(package)
        if spec and spec.origin:
            roots.add(str(Path(spec.origin).parent))
    return tuple(sorted(os.path.realpath(r) + os.sep for r in roots if r))


def _owner_of(filename: str, library: tuple[str, ...]) -> str:
    if filename == _WARM_LAUNCH:
        return LIBRARY
    if filename.startswith(_AUTOGRADER):
        return GRADER
    if filename.startswith(library) or filename.startswith("<frozen "):
        return LIBRARY
    return LEARNER


# --- the hook ----------------------------------------------------------------------------------

_FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_code",
                               "gi_code", "cr_code", "ag_code"})
# what the learner's code reached for, in words
THREADS, OBJECTS = tr_later("another thread's frames"), tr_later("the garbage collector's objects")
TRACER, PROFILER = tr_later("a trace function"), tr_later("a profile function")
CODE_MADE, CTYPES = tr_later("a code object of its own making"), tr_later("ctypes")
PROGRAM, PROCESS = tr_later("a program"), tr_later("a new process")
FUNCTIONS, CODE = tr_later("the checks' own functions"), tr_later("the checks' own code")
FRAME, FILES = tr_later("a frame of the checks"), tr_later("the grader's files")
MEMORY = tr_later("this process's memory")
SPOOFED = tr_later("code under the grader's or the library's name")
_NEVER_TO_LEARNER = types.MappingProxyType({  # event -> what the learner reached for
    "sys._current_frames": THREADS,
    "gc.get_objects": OBJECTS,
    "gc.get_referrers": OBJECTS,
    "gc.get_referents": OBJECTS,
    "sys.settrace": TRACER,
    "sys.setprofile": PROFILER,
    "code.__new__": CODE_MADE,  # refused when made directly
    "os.system": PROGRAM, "os.exec": PROGRAM, "os.posix_spawn": PROGRAM,
    "os.spawn": PROGRAM, "os.fork": PROCESS, "os.forkpty": PROCESS,
})
# A program may be started only by Triton (compiling a kernel for a GPU: ptxas, a C
# compiler, ldconfig), whoever launched the kernel.


def seal() -> None:
    """Install the gated loader and the audit hook: once per kernel, before any of the
    learner's code runs and before the checks are imported."""
    if any(isinstance(finder, _GatedFinder) for finder in sys.meta_path):
        return
    namespaces: set[int] = set()
    sys.meta_path.insert(0, _GatedFinder(namespaces))
    # the hook and the functions it makes read this module's names and the builtins from a
    # copy taken now: a learner's code that rebinds them later (``seal.LEARNER = ...``,
    # ``builtins.any = ...``) changes nothing the hook decides
    private = {**globals(), "__builtins__": dict(vars(builtins))}
    for name in ("_owner_of", "_message"):
        private[name] = types.FunctionType(globals()[name].__code__, private, name)
    make = types.FunctionType(_hook.__code__, private, "_hook")
    sys.addaudithook(make(namespaces, _library_roots()))


def _hook(namespaces: set[int], library: tuple[str, ...]) -> Callable[[str, tuple], None]:
    """The audit hook; every name it uses is bound here, so that nothing the learner can
    reach changes what it decides."""
    getframe, get_ident, realpath, fspath = sys._getframe, threading.get_ident, \
        os.path.realpath, os.fspath
    owner_of, message, loads, sealed = _owner_of, _message, marshal.loads, Sealed
    cache_from_source, read, sep, path_like = importlib.util.cache_from_source, io.open, \
        os.sep, os.PathLike
    function = types.FunctionType
    triton = _triton_folder()
    harmless = _harmless_frame_users()
    busy: set[int] = set()
    trips: list[str] = []  # what the learner reached for since the outermost check began
    depth = [0]  # checks running: a hidden check may run a visible one
    opened: dict[int, Any] = {}  # id -> what the running checks opened, kept alive
    watched = frozenset({"sys._getframe", "object.__getattr__", "open", "compile",
                         "marshal.loads", "subprocess.Popen", CHECK_STARTED, CHECK_ENDED, OPENED,
                         *_NEVER_TO_LEARNER})

    owners: dict[str, str] = {}  # file name -> whose code

    def whose(frame: Any) -> str:
        filename = frame.f_code.co_filename
        found = owners.get(filename)
        if found is None:
            found = owners[filename] = owner_of(filename, library)
        return found

    def frames(start: Any) -> Any:
        while start is not None:
            yield start, whose(start)
            start = start.f_back

    def first_not_library(start: Any) -> tuple[Any, str | None]:
        for frame, owner in frames(start):
            if owner != LIBRARY:
                return frame, owner
        return None, None

    def in_check(start: Any) -> bool:
        return any(owner == GRADER for _, owner in frames(start))

    def refuse(what: str) -> None:
        trips.append(what)
        raise sealed(message(what))

    def gate(requester: Any, entry: bool) -> None:
        """``requester``: the grader function that started with the gate."""
        frame, owner = first_not_library(requester.f_back)
        if owner == LEARNER and (not entry or in_check(frame)) and not is_open(requester):
            refuse(FUNCTIONS)

    def is_open(requester: Any) -> bool:
        code = requester.f_code
        if id(code) in opened:
            return True
        if not code.co_argcount:
            return False
        first = requester.f_locals.get(code.co_varnames[0])
        return first is not None and id(first) in opened

    def open_up(value: Any) -> None:
        if isinstance(value, type):
            for member in vars(value).values():
                open_up(member)
        elif hasattr(value, "__code__") and hasattr(value, "__globals__"):
            opened[id(value.__code__)] = value.__code__
        else:  # an instance: its methods, called on it
            opened[id(value)] = value

    def gate_kind(target: Any) -> str | None:
        """``GATE`` or ``ENTRY`` for a gate's function, else None."""
        if type(target) is not function:
            return None
        if target.__name__ == "__kv_gate__":
            return GATE
        if target.__name__ != "<lambda>":
            return None
        defaults = target.__defaults__
        mark = defaults[0] if type(defaults) is tuple and len(defaults) == 1 else None
        return mark if type(mark) is str and mark in (GATE, ENTRY) else None

    def decide(event: str, args: tuple, requester: Any) -> None:
        if event == "object.__getattr__":
            target, name = args
            if name == "__code__":
                kind = gate_kind(target)
                if kind is not None and whose(requester) == GRADER:
                    caller = requester.f_back
                    if caller is not None and id(caller.f_globals) in namespaces and \
                            whose(caller) == GRADER:
                        return  # the grader calling its own: the common case, first
                    gate(requester, entry=kind == ENTRY)
                elif id(getattr(target, "__globals__", None)) in namespaces and \
                        first_not_library(requester)[1] == LEARNER:
                    refuse(CODE)
            elif name in _FRAME_ATTRIBUTES:
                frame, owner = first_not_library(requester)
                if owner == LEARNER and in_check(frame):
                    refuse(FRAME)
        elif event == "sys._getframe":
            if id(requester.f_code) in harmless:
                return
            frame, owner = first_not_library(requester)
            if owner == LEARNER and in_check(frame):
                refuse(FRAME)
        elif event in (CHECK_STARTED, CHECK_ENDED, OPENED):
            if whose(requester) != GRADER:
                return
            if event == OPENED:
                open_up(args[0])
                return
            if event == CHECK_STARTED:
                if depth[0] == 0:
                    trips.clear()
                depth[0] += 1
                return
            depth[0] = max(depth[0] - 1, 0)
            if depth[0] == 0:
                opened.clear()
            if trips:
                what = trips[0]
                if depth[0] == 0:
                    trips.clear()
                raise sealed(message(what))
        elif first_not_library(requester)[1] != LEARNER:
            return
        elif event == "open":
            path = args[0]
            if isinstance(path, str | bytes | path_like):
                path = realpath(fspath(path))
                path = path.decode() if isinstance(path, bytes) else path
                if path.startswith(_AUTOGRADER) or path + sep == _AUTOGRADER:
                    refuse(FILES)
                if path.startswith("/proc/") and path.endswith("/mem"):
                    refuse(MEMORY)
        elif event == "compile":
            genuine_compile(args, requester)
        elif event == "marshal.loads":
            spoofed(args[0], requester)
        elif event == "subprocess.Popen":
            if not any(frame.f_code.co_filename.startswith(triton)
                       for frame, _ in frames(requester)):
                refuse(PROGRAM)
        elif event == "code.__new__":
            if whose(requester) == LEARNER:
                refuse(_NEVER_TO_LEARNER[event])
        elif event in _NEVER_TO_LEARNER or event.startswith("ctypes."):
            refuse(_NEVER_TO_LEARNER.get(event, CTYPES))

    def genuine_compile(args: tuple, requester: Any) -> None:
        """Code compiled under a grader's or library's file name: by a library (Triton
        rewriting a kernel, importing a module that has no bytecode cache), and from that
        file's own source when the source is text."""
        source, filename = args[0], args[1]
        if isinstance(filename, bytes):
            filename = filename.decode(errors="replace")
        if not isinstance(filename, str) or owner_of(filename, library) == LEARNER:
            return
        if whose(requester) == LEARNER:
            refuse(SPOOFED)
        if not isinstance(source, str | bytes):
            return  # a syntax tree a library built: Triton's interpreter
        try:
            with read(filename, "rb") as genuine:
                text = genuine.read()
        except OSError:
            text = None
        if text != (source.encode() if isinstance(source, str) else source):
            refuse(SPOOFED)

    def spoofed(data: Any, requester: Any) -> None:
        """Unmarshalled code that claims a grader's or library's file must be that file's
        own bytecode (what importing it reads)."""
        try:
            code = loads(bytes(data))
        except Exception:
            return
        claimed = code.co_filename if hasattr(code, "co_filename") else None
        if claimed is None or owner_of(claimed, library) == LEARNER:
            return
        try:
            cached = cache_from_source(claimed)
            with read(cached, "rb") as genuine:
                if genuine.read()[16:] == bytes(data):
                    return
        except (OSError, ValueError, NotImplementedError):
            pass
        refuse(SPOOFED)

    def hook(event: str, args: tuple) -> None:
        if event == "object.__getattr__":
            if args[1] != "__code__" and args[1] not in _FRAME_ATTRIBUTES:
                return
        elif event not in watched and not event.startswith("ctypes."):
            return
        me = get_ident()
        if me in busy:
            return
        busy.add(me)
        try:
            decide(event, args, getframe(1))
        finally:
            busy.discard(me)

    return hook


def _harmless_frame_users() -> frozenset[int]:
    """The library functions that look at their caller's frame for its module's name and
    hand no frame on: a learner's code may define a named tuple or an enum inside a check."""
    import collections
    import enum
    import typing

    users = [collections.namedtuple, typing._caller, enum.EnumType._create_]
    return frozenset(id(user.__code__) for user in users)


def _triton_folder() -> str:
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.origin:
        return "/nonexistent/"
    return str(Path(spec.origin).parent) + os.sep
