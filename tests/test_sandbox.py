"""Nothing a graded process starts outlives it: not in its own session, not double-forked,
not when its time runs out. In the bubblewrap sandbox, a command sees and writes only its
own folder, reaches no network and sees no process of the host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from loopback import recording_server

from autograder.host.sandbox import Limits, probe, run

# Starts three processes that try to escape: one in a new session, one double-forked (its
# parent exits, so it is orphaned), one that ignores SIGTERM; prints their process ids.
ESCAPES = r"""
import os, signal, subprocess, sys, time
session = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                           start_new_session=True)
if os.fork() == 0:
    if os.fork() == 0:
        os.setsid()
        os.write(1, b"%d\n" % os.getpid())
        time.sleep(600)
    os._exit(0)
stubborn = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
os.write(1, b"%d %d\n" % (session.pid, stubborn.pid))
time.sleep(0.5)
{end}
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="child subreapers are a Linux feature")


@pytest.mark.parametrize("end", ["", "time.sleep(600)"], ids=["returns", "times-out"])
def test_no_process_a_command_starts_survives_it(end, tmp_path):
    started = time.monotonic()
    try:
        output = run([sys.executable, "-c", ESCAPES.format(end=end)], tmp_path, 5, Limits())
    except subprocess.TimeoutExpired as timed_out:
        assert end, "only the command that sleeps runs out of time"
        output = timed_out.output
    pids = [int(word) for word in output.split()]
    assert len(pids) == 3
    assert not [pid for pid in pids if _alive(pid)]
    assert time.monotonic() - started < 30


def test_nothing_grades_on_once_the_grader_that_started_it_is_killed(tmp_path):
    """A grader (or a Dask worker) killed mid-notebook: its reaper ends everything below it."""
    pids = tmp_path / "pids"
    grader = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys\n"
         "subprocess.run([sys.executable, '-m', 'autograder.host.reaper', '600', '--', "
         f"sys.executable, '-c', {ESCAPES.format(end='time.sleep(600)')!r}],"
         f" stdout=open({str(pids)!r}, 'w'))"], cwd=Path(__file__).parents[1])
    deadline = time.monotonic() + 60
    while pids.read_text().count("\n") < 2 if pids.exists() else True:
        assert time.monotonic() < deadline, "the escapes never started"
        time.sleep(0.1)
    below = [int(word) for word in pids.read_text().split()]
    grader.kill()
    grader.wait()
    while any(_alive(pid) for pid in below):
        assert time.monotonic() < deadline, f"still running: {below}"
        time.sleep(0.1)


def test_the_command_runs_where_and_as_asked(tmp_path):
    output = run([sys.executable, "-c", "import os; print(os.getcwd()); "
                  "print(os.environ['HYPOTHESIS_STORAGE_DIRECTORY'])"], tmp_path, 30, Limits())
    assert output.split() == [str(tmp_path), str(tmp_path / ".hypothesis-storage")]
    assert os.getpid()  # the grader itself is untouched


# --- the bubblewrap sandbox --------------------------------------------------------------

def _sandbox_here() -> None:
    """Skip, saying why, where bwrap cannot make the sandbox; in CI fail instead (CI installs
    bubblewrap, so these tests never pass by not running)."""
    reason = probe()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the sandbox cannot be tested in CI: {reason}")
        pytest.skip(f"no bubblewrap sandbox here: {reason}")


# Run inside the sandbox: looks for the host's things, tries to write around, to reach a
# server on the host's loopback and to signal the grader; prints what happened, as JSON.
LOOKS = r"""
import json, os, socket, sys
from pathlib import Path

hidden, readme, port, grader, prefix, unique = sys.argv[1:7]
seen = {"pid": os.getpid(), "home": os.environ["HOME"], "home_path": str(Path.home())}
seen["caches"] = {name: os.environ[name] for name in ("TRITON_CACHE_DIR", "XDG_CACHE_HOME",
                  "MPLCONFIGDIR", "IPYTHONDIR", "JUPYTER_RUNTIME_DIR", "JUPYTER_DATA_DIR",
                  "JUPYTER_CONFIG_DIR", "HYPOTHESIS_STORAGE_DIRECTORY")}
seen["hidden_marker"] = os.path.exists(hidden)
seen["grader_cwd_readme"] = os.path.exists(readme)
seen["processes"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
try:
    os.kill(int(grader), 0)
    seen["grader_signalled"] = True
except OSError:
    seen["grader_signalled"] = False
with open("/proc/self/status") as status:
    seen["capabilities"] = [line.split()[1] for line in status if line.startswith("CapEff")][0]
written = {}
for name, path in [("hidden_dir", Path(hidden).with_name("written.txt")),
                   ("python_env", Path(prefix) / "written.txt"), ("root", Path("/written.txt")),
                   ("tmp", Path("/tmp") / unique),
                   ("own_folder", Path("written.txt")), ("home", Path.home() / "written.txt")]:
    try:
        path.write_text("written inside the sandbox")
        written[name] = True
    except OSError:
        written[name] = False
seen["written"] = written
try:
    socket.create_connection(("127.0.0.1", int(port)), timeout=5).close()
    seen["connected"] = True
except OSError:
    seen["connected"] = False
print(json.dumps(seen))
"""


@pytest.fixture
def loopback_server():
    with recording_server() as server:
        yield server


def test_a_sandboxed_command_sees_and_writes_only_its_own_folder(tmp_path, loopback_server,
                                                                 repo):
    _sandbox_here()
    port, accepted = loopback_server
    own, elsewhere = tmp_path / "own", tmp_path / "elsewhere"  # both in the host's /tmp
    own.mkdir()
    elsewhere.mkdir()
    hidden = elsewhere / "marker.txt"
    hidden.write_text("the host's")
    unique = f"kv-course-sandbox-{uuid.uuid4().hex}.txt"  # written to /tmp, the sandbox's own
    output = run([sys.executable, "-c", LOOKS, str(hidden), str(repo / "README.md"), str(port),
                  str(os.getpid()), sys.prefix, unique], own, 60, Limits(sandbox=True))
    seen = json.loads(output.strip().splitlines()[-1])
    # a folder of the host, and the grader's own checkout, are not there
    assert not seen["hidden_marker"] and not seen["grader_cwd_readme"]
    # its own PID namespace: a handful of processes (bwrap's init, the reaper, itself), and
    # the grader out of reach
    assert seen["pid"] < 10 and len(seen["processes"]) < 10, seen["processes"]
    assert not seen["grader_signalled"]
    assert seen["capabilities"] == "0000000000000000"  # so it cannot remount its view
    # writes land in its own folder (HOME is there) and its private /tmp, nowhere else
    assert seen["written"] == {"hidden_dir": False, "python_env": False, "root": False,
                               "tmp": True, "own_folder": True, "home": True}
    assert seen["home"] == seen["home_path"] == str(own / ".home")
    assert all(Path(path).is_relative_to(own) for path in seen["caches"].values()), seen
    assert (own / "written.txt").exists() and (own / ".home" / "written.txt").exists()
    assert not (elsewhere / "written.txt").exists()
    assert not Path(sys.prefix, "written.txt").exists()
    assert not Path("/tmp", unique).exists()
    # no network: the host's loopback server saw nothing
    assert not seen["connected"] and accepted == []


def test_the_sandbox_ends_everything_it_started_when_time_runs_out(tmp_path):
    _sandbox_here()
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as timed_out:
        run([sys.executable, "-c", ESCAPES.format(end="time.sleep(600)")], tmp_path, 5,
            Limits(sandbox=True))
    assert len(timed_out.value.output.split()) == 3  # all three started, inside
    assert time.monotonic() - started < 30
    assert not _processes_running(tmp_path)


def _processes_running(folder: Path) -> list[str]:
    """Processes of the host whose working folder is ``folder`` (each sandboxed one's is)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if os.readlink(entry / "cwd") == str(folder):
                found.append(entry.name)
        except OSError:
            continue
    return found


def test_grading_stops_before_it_starts_where_bwrap_is_missing(tmp_path):
    notebook = tmp_path / "01_kv_cache_sizing.ipynb"
    notebook.write_text("{}")
    env = dict(os.environ, PATH=str(Path(sys.executable).parent))  # no /usr/bin: no bwrap
    for command in (["grade", str(notebook)], ["grade-all", str(tmp_path)]):
        done = subprocess.run([sys.executable, "-m", "autograder", *command], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.count("\n") == 1, done.stderr
        assert "apt-get install bubblewrap" in done.stderr and "--sandbox off" in done.stderr
        assert not (tmp_path / "grades.csv").exists()


def test_a_folder_named_like_a_course_package_in_the_working_folder_is_not_bound(tmp_path):
    """An instructor's course directory called ``course`` beside them shadows nothing: the
    sandbox binds the course's own packages, so the kernel still imports them."""
    (tmp_path / "course").mkdir()
    code = ("import json; from autograder.host.bubblewrap import readable; "
            "print(json.dumps([str(p) for p in readable()]))")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, check=True)
    bound = [Path(p) for p in json.loads(done.stdout)]
    import course

    package = Path(course.__file__).resolve().parent
    assert any(package.is_relative_to(path) for path in bound), bound
    assert not any(path.is_relative_to(tmp_path) for path in bound), bound


def test_a_read_only_path_under_the_hosts_tmp_is_seen_inside(tmp_path, monkeypatch):
    """A project cloned into /tmp: its environment, bound read-only, is over the sandbox's own
    /tmp, not hidden under it (bwrap mounts in the order given)."""
    _sandbox_here()
    from autograder.host import bubblewrap

    environment = tmp_path / "venv"  # pytest's tmp_path is in the host's /tmp
    environment.mkdir()
    (environment / "marker.txt").write_text("the environment's")
    bound = bubblewrap.readable()
    monkeypatch.setattr(bubblewrap, "readable", lambda: [*bound, environment])
    own = tmp_path / "own"
    own.mkdir()
    done = subprocess.run(bubblewrap.wrap(["/bin/cat", str(environment / "marker.txt")], [own],
                                          own), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "the environment's", done.stderr
