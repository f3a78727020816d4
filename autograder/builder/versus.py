"""The grader against stock nbgrader: a class handing in one chapter's solution, graded both
ways, paired.

    python -m autograder bench --vs-nbgrader [--repeat 5] [--chapters 1-9] [--class-size 4]

Ours is ``python -m autograder grade NOTEBOOK...`` of the class's notebooks (sandboxed where
bwrap works, each kernel forked warm: ``autograder.host.warm``). Stock is ``python -m nbgrader
autograde NN_slug --force`` in a class directory made by ``course-dir`` (the course's class
configuration, its kernels sandboxed the same way, each started afresh, as nbgrader starts
them), with the same notebooks handed in by as many learners. Both run once untimed (a released
chapter cached, files in the page cache), then ``repeat`` times each, alternating which goes
first; the figures are per notebook (the class's wall and CPU time over its size). For every
run, the whole process tree is measured: wall time, CPU time (user + system, every process in
it, sampled every 10 ms) and peak memory (the most the tree held resident at once, as
proportional set sizes: a page shared by k processes counts 1/k in each, so what a forked
process shares with its parent counts once, as it occupies memory once; sampled every 100 ms,
since the kernel walks a process's page tables to count them, about 6 ms for a process that
loaded torch). Medians are printed with the ratios ours / stock.
"""

from __future__ import annotations

import itertools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from autograder.host.chapters import Chapter

_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Cost:
    wall: float  # seconds
    cpu: float  # seconds, user + system, every process of the tree
    memory: float  # MiB, the most the tree held resident at once (proportional set size)


def _processes() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds so far), for every process."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except OSError:  # it ended while we looked
            continue
        # after the command's name: state, ppid, ... utime (12th), stime (13th)
        found[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK)
    return found


def _resident(pid: int) -> int:
    """The bytes ``pid`` holds resident, its shared pages divided among their sharers (its
    proportional set size); 0 once it has ended."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as handle:
            for line in handle:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def measure(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> Cost:
    """Run ``command`` and measure its process tree; raises ``CalledProcessError`` if it
    fails."""
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    cpu: dict[int, float] = {}
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        for tick in itertools.count():
            if done.is_set():
                return
            table = _processes()
            tree, todo = set(), [process.pid]
            children: dict[int, list[int]] = {}
            for pid, (parent, _) in table.items():
                children.setdefault(parent, []).append(pid)
            while todo:
                pid = todo.pop()
                if pid in table and pid not in tree:
                    tree.add(pid)
                    todo += children.get(pid, [])
            if tick % 10 == 0:
                peak[0] = max(peak[0], sum(_resident(pid) for pid in tree))
            for pid in tree:
                cpu[pid] = max(cpu.get(pid, 0.0), table[pid][1])
            done.wait(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    started = time.monotonic()
    sampler.start()
    _, errors = process.communicate()
    wall = time.monotonic() - started
    done.set()
    sampler.join()
    if process.returncode != 0:
        raise subprocess.CalledProcessError(process.returncode, command, stderr=errors)
    return Cost(wall, sum(cpu.values()), peak[0] / 2**20)


def compare(chapter: Chapter, repeat: int, scratch: Path, learners: int) -> tuple[Cost, Cost]:
    """The median costs (ours, stock) of grading ``learners`` copies of ``chapter``'s solution,
    per notebook."""
    from autograder.builder.classdir import write_course_dir

    env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent),
                                                 os.environ.get("PATH", "")]))
    course = scratch / chapter.name / "class"
    write_course_dir(course, [chapter])
    subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", chapter.name,
                    "--force"], cwd=course, env=env, check=True, capture_output=True)
    own = []
    for index in range(learners):
        handed_in = course / "submitted" / f"learner{index}" / chapter.name / \
            f"{chapter.name}.ipynb"
        own.append(scratch / chapter.name / "own" / f"learner{index}" / f"{chapter.name}.ipynb")
        for copy in (handed_in, own[-1]):
            copy.parent.mkdir(parents=True)
            shutil.copyfile(chapter.source, copy)
    runs = {
        "ours": ([sys.executable, "-m", "autograder", "grade", *map(str, own)],
                 scratch / chapter.name / "own"),
        "stock": ([sys.executable, "-m", "nbgrader", "autograde", chapter.name, "--force"],
                  course),
    }
    costs: dict[str, list[Cost]] = {name: [] for name in runs}
    for command, cwd in runs.values():  # warm: the released chapter, the page cache
        measure(command, cwd, env)
    for index in range(repeat):
        for name in (list(runs) if index % 2 == 0 else list(reversed(runs))):
            costs[name].append(measure(*runs[name], env))
    return tuple(Cost(statistics.median(c.wall for c in costs[name]) / learners,
                      statistics.median(c.cpu for c in costs[name]) / learners,
                      statistics.median(c.memory for c in costs[name]))
                 for name in runs)


def report(chapters: list[Chapter], repeat: int, learners: int) -> tuple[float, float, float]:
    """Print every chapter's median costs and ratios as it is measured; return the median
    chapter's wall ratio and the largest wall and memory ratios."""
    print(f"{'chapter':<38}{'wall s':>14}{'ratio':>7}{'CPU s':>14}{'ratio':>7}"
          f"{'memory MiB':>16}{'ratio':>7}")
    print(f"{'':<38}{'ours / stock':>14}{'':>7}{'ours / stock':>14}{'':>7}"
          f"{'ours / stock':>16}{'':>7}")
    walls, memories = [], []
    with tempfile.TemporaryDirectory(prefix="kv-course-versus-") as scratch:
        for chapter in chapters:
            ours, stock = compare(chapter, repeat, Path(scratch), learners)
            ratios = [ours.wall / stock.wall, ours.cpu / stock.cpu, ours.memory / stock.memory]
            walls.append(ratios[0])
            memories.append(ratios[2])
            print(f"{chapter.name:<38}{ours.wall:>6.2f} / {stock.wall:<5.2f}{ratios[0]:>7.2f}"
                  f"{ours.cpu:>6.2f} / {stock.cpu:<5.2f}{ratios[1]:>7.2f}"
                  f"{ours.memory:>7.0f} / {stock.memory:<6.0f}{ratios[2]:>7.2f}", flush=True)
    return statistics.median(walls), max(walls), max(memories)
