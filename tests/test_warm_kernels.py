"""Kernels forked warm (``autograder.host.warm``): each in its submission's own sandbox, none
inheriting anything an earlier one did, and a class graded warm gets the grades it gets with
a fresh kernel per notebook."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from conftest import REPO, grade
from notebook_variants import fill, from_module

from autograder.host import warm
from autograder.host.bubblewrap import probe
from autograder.host.kernel import SandboxedKernelManager
from kernels import paged_attention_ref

CHAPTER = "06_paged_kv_in_pytorch"  # its kernels import torch: the template holds it

pytestmark = [
    pytest.mark.skipif(probe() is not None, reason=f"no sandbox here: {probe()}"),
    pytest.mark.skipif(not warm.available(), reason="kernels are forked warm without a GPU only"),
]

# What a learner's cell might leave for the next learner: a module patched (the comparison a
# check could use), a global, a thread, files where the next kernel might look, memory held.
LEAVE_BEHIND = """
import math, os, threading, time, torch
math.left_by_an_earlier_learner = True
torch.allclose = lambda *args, **kwargs: True
torch.testing.assert_close = lambda *args, **kwargs: None
threading.Thread(target=time.sleep, args=(3600,)).start()
for folder in ("/tmp", "/dev/shm", os.path.expanduser("~"), os.getcwd()):
    with open(os.path.join(folder, "left-behind"), "w") as handle:
        handle.write("x")
hoard = bytearray(1 << 30)
"""

# What a kernel finds when it starts: everything the lines above could have changed.
LOOK_AROUND = """
import json, math, os, threading, torch
print(json.dumps({
    "global": hasattr(math, "left_by_an_earlier_learner"),
    "allclose says 0 == 1": torch.allclose(torch.zeros(1), torch.ones(1)),
    "threads": threading.active_count(),
    "processes": sum(name.isdigit() for name in os.listdir("/proc")),
    "files": [folder for folder in ("/tmp", "/dev/shm", os.path.expanduser("~"))
              if os.path.exists(os.path.join(folder, "left-behind"))],
    "can hold 2 GiB": len(bytearray(2 << 30)) == 2 << 30,
}))
"""


async def _run_in_kernel(template: Path, cwd: Path, code: str) -> str:
    """``code`` run in a kernel forked from ``template``: what it printed."""
    cwd.mkdir()
    manager = SandboxedKernelManager()
    await manager.start_kernel(cwd=str(cwd), env=dict(os.environ, **{warm.SETTING: str(template)}))
    client = manager.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=120)
        asked = client.execute(code)
        printed = []
        while True:
            message = await client.get_iopub_msg(timeout=120)
            if message["parent_header"].get("msg_id") != asked:
                continue
            if message["msg_type"] in ("stream", "error"):
                printed.append(message["content"].get("text") or str(message["content"]))
            if message["msg_type"] == "status" and \
                    message["content"]["execution_state"] == "idle":
                return "".join(printed)
    finally:
        client.stop_channels()
        await manager.shutdown_kernel(now=True)


def _resident_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_nothing_one_kernel_leaves_reaches_the_next(tmp_path):
    template = warm.template_for(CHAPTER, dict(os.environ))
    assert template is not None
    server = next(t for t in warm._TEMPLATES.values() if t.socket == template)
    assert server.ready()
    server = server.process.pid
    held = _resident_mib(server)

    async def three_kernels() -> tuple[str, str, str]:
        first = await _run_in_kernel(template, tmp_path / "first", LOOK_AROUND)
        left = await _run_in_kernel(template, tmp_path / "hostile", LEAVE_BEHIND + LOOK_AROUND)
        after = await _run_in_kernel(template, tmp_path / "next", LOOK_AROUND)
        return first, left, after

    first, left, after = asyncio.run(three_kernels())
    seen = json.loads(after)
    assert seen == json.loads(first), (first, after)
    assert seen["global"] is False and seen["allclose says 0 == 1"] is False
    assert seen["files"] == []
    # the hostile kernel did change its own world: the probe would have seen it
    changed = json.loads(left)
    assert changed["global"] and changed["allclose says 0 == 1"]
    assert changed["threads"] == seen["threads"] + 1
    assert len(changed["files"]) == 3
    assert (tmp_path / "hostile" / "left-behind").exists()  # its own folder keeps its file
    assert not (tmp_path / "next" / "left-behind").exists()
    assert _resident_mib(server) < held + 16, "the template grew: it ran something"


def test_the_kernel_runs_inside_the_submissions_sandbox(tmp_path):
    template = warm.template_for(CHAPTER, dict(os.environ))
    said = asyncio.run(_run_in_kernel(template, tmp_path / "k", (
        "import json, os\n"
        "print(json.dumps({'pid': os.getpid(), 'root': sorted(os.listdir('/')),"
        " 'capabilities': [l.split()[1] for l in open('/proc/self/status')"
        "                  if l.startswith(('CapEff', 'CapBnd', 'NoNewPrivs'))],"
        " 'descriptors': [os.readlink('/proc/self/fd/' + d) for d in os.listdir('/proc/self/fd')"
        "                 if os.path.exists('/proc/self/fd/' + d)],"
        " 'template socket': os.path.exists(" + repr(str(template)) + "),"
        " 'sees its own folder': os.path.exists(os.getcwd())}))\n")))
    seen = json.loads(said)
    assert seen["pid"] < 10, "not in the sandbox's own PID namespace"
    assert seen["capabilities"] == ["0000000000000000", "0000000000000000", "1"]
    assert seen["template socket"] is False and seen["sees its own folder"] is True
    assert "home" not in seen["root"] and "srv" not in seen["root"]
    # none of the template's sockets and pipes (its listener, its link to the grader) is
    # open in the kernel: it closed every descriptor but its streams
    server = next(t.process.pid for t in warm._TEMPLATES.values() if t.socket == template)
    held = {os.readlink(f"/proc/{server}/fd/{d}") for d in os.listdir(f"/proc/{server}/fd")}
    held = {link for link in held if link.startswith(("socket:", "pipe:"))}
    assert held and not held & set(seen["descriptors"]), (held, seen["descriptors"])


def _class(folder: Path) -> list[Path]:
    """Three learners of chapter 6, graded in this order: one leaves behind everything it
    can (and answers wrongly), one answers wrongly, one hands in the solution."""
    names = ["write_kv", "paged_decode_attention", "merge_partials",
             "blockwise_decode_attention", "decode_step"]
    right = from_module(paged_attention_ref, names)
    zero = "def paged_decode_attention(query, k_cache, v_cache, block_tables, seq_lens, " \
           "scale):\n    return query * 0\n"
    exercise = REPO / "exercises" / f"{CHAPTER}.ipynb"
    return [
        fill(exercise, folder / "hostile" / f"{CHAPTER}.ipynb", right | {
            "write_kv": right["write_kv"] + LEAVE_BEHIND, "paged_decode_attention": zero}),
        fill(exercise, folder / "wrong" / f"{CHAPTER}.ipynb",
             right | {"paged_decode_attention": zero}),
        fill(exercise, folder / "right" / f"{CHAPTER}.ipynb", right),
    ]


@pytest.mark.pipeline
def test_a_class_graded_warm_gets_the_grades_of_one_fresh_kernel_per_notebook(tmp_path):
    notebooks = _class(tmp_path)
    warm_report, cold_reports = tmp_path / "warm.json", []
    done = grade("grade", *notebooks, "--json", warm_report)
    assert done.returncode == 0, done.stderr
    for index, notebook in enumerate(notebooks):  # each alone, its kernel started afresh
        cold_reports.append(tmp_path / f"cold{index}.json")
        done = grade("grade", notebook, "--kernels", "cold", "--json", cold_reports[-1])
        assert done.returncode == 0, done.stderr

    def grades(result: dict) -> list:
        return [(test["id"], test["points"], test["message"]) for test in result["tests"]]

    warmly = [grades(result) for result in json.loads(warm_report.read_text())]
    coldly = [grades(json.loads(report.read_text())) for report in cold_reports]
    assert warmly == coldly
    scores = [sum(score for _, score, _ in graded) for graded in warmly]
    # the wrong answer loses the same points after the hostile notebook as alone
    assert scores[0] <= scores[1] < scores[2], scores


def test_a_grader_keeps_the_templates_of_the_chapters_it_graded_last():
    light = ["01_kv_cache_sizing", "02_fragmentation_and_block_tables", "03_block_manager",
             "04_prefix_caching"]  # no torch: cheap to start
    first = warm.template_for(light[0], dict(os.environ))
    process = next(t.process for t in warm._TEMPLATES.values() if t.socket == first)
    for chapter in light[1:]:
        assert warm.template_for(chapter, dict(os.environ)) is not None
    assert len(warm._TEMPLATES) == warm._KEPT
    assert process.wait(timeout=60) == 0  # the least recently used one ended
    assert not first.parent.exists()  # and took its socket's folder with it
    again = warm.template_for(light[0], dict(os.environ))  # started again when needed
    assert again is not None and again != first
