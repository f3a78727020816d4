"""A kernel's template compiles its chapter's checks ahead (``seal.compile_ahead``): every
kernel forked from it imports them, sealed, without compiling them again, and takes from
what was compiled ahead only a file's own code from its very bytes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from autograder.host.warm import checks_ahead

CHAPTER = "02_fragmentation_and_block_tables"

# Run in a process of its own (the seal's audit hook cannot be removed): compile ahead as a
# template does, tamper with two entries as a learner's code could, arm as a kernel does.
ARMED = textwrap.dedent(f"""
    import json, sys
    import course

    course.setup(quiet=True)
    from autograder import guard, seal
    from autograder.host.warm import checks_ahead

    paths = checks_ahead({CHAPTER!r})
    seal.compile_ahead(paths)
    hidden = next(p for p in paths if p.endswith("hidden/ch02.py"))
    helpers = next(p for p in paths if p.endswith("checks/_helpers.py"))
    source, _, names = seal.AHEAD[hidden]
    seal.AHEAD[hidden] = (source, compile("x = 1", "<cell>", "exec"), names)  # not its code
    seal.AHEAD[helpers] = (b"x = 1", *seal.AHEAD[helpers][1:])  # not its bytes
    compiled = []
    original = seal._compiled
    seal._compiled = lambda data, path: compiled.append(path) or original(data, path)
    seal.seal()
    guard.arm({CHAPTER!r})
    imported = sorted(m.__file__ for name, m in sys.modules.items()
                      if name.startswith(("autograder.checks.", "autograder.hidden.")))
    print(json.dumps({{"paths": paths, "compiled": compiled, "imported": imported,
                      "hidden_checks": hasattr(sys.modules["autograder.hidden.ch02"],
                                               "check_locate_thoroughly")}}))
""")


def test_a_kernel_imports_its_chapters_checks_as_its_template_compiled_them():
    done = subprocess.run([sys.executable, "-c", ARMED], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    # everything arming imported was compiled ahead: the template's list is complete
    assert set(found["imported"]) <= set(found["paths"])
    # compiled again (to import it, and to read its names): only the two entries that were
    # not their file's own code and bytes
    assert set(found["compiled"]) == {
        p for p in found["paths"] if p.endswith(("hidden/ch02.py", "checks/_helpers.py"))}
    assert found["hidden_checks"]  # the tampered entry's code (x = 1) was not run


def test_every_chapters_checks_are_found_without_importing_them():
    from autograder.table import PARTS

    before = set(sys.modules)
    for chapter, parts in PARTS.items():
        paths = checks_ahead(chapter)
        for module in (parts.checks, parts.hidden):
            assert any(p.endswith(module.replace(".", "/") + ".py") for p in paths), module
    assert not {m for m in set(sys.modules) - before
                if m.startswith(("autograder.checks.", "autograder.hidden."))}
