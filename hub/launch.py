"""Start a JupyterHub for one class on this machine (`make hub`).

    python hub/launch.py [--port 8000] [--chapters all] [--exchange /srv/nbgrader/exchange]

prepares a state folder (default ``hub/state``): a home per user, the instructor's nbgrader
course directory (``python -m autograder course-dir``), nbgrader's exchange, the nbgrader
settings every user's server reads, and the passwords and admin token (kept between starts in
``hub.json``, readable only by its owner); prints how to log in; and then runs JupyterHub with
``hub/jupyterhub_config.py`` in its place, so Ctrl-C (or SIGTERM) stops the hub, its proxy and
every user's server.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

from autograder.host.gradebook import COURSE_ID

HUB = Path(__file__).resolve().parent
REPO = HUB.parent

# nbgrader's own default, and where every user pod of the Kubernetes set-up mounts the exchange
# volume (hub/z2jh-values.yaml): learners' nbgrader settings are the same in both.
EXCHANGE = Path("/srv/nbgrader/exchange")
PROXY = HUB / "node_modules" / ".bin" / "configurable-http-proxy"

CLASS_CONFIG = '''\
# The class's nbgrader settings, read by every user's server (learners and instructor).
c = get_config()  # noqa: F821
c.CourseDirectory.course_id = {course_id!r}
c.Exchange.root = {exchange!r}
# Every server runs as one OS user (`jovyan` in each Kubernetes pod), so the owner
# of a hand-in never names its learner: collect would call each one a cheating attempt.
c.ExchangeCollect.check_owner = False
'''

# Only where every server runs as one OS user (this hub): nbgrader's submit records the OS
# user's name unless that user is `jovyan` (Jupyter's images, Kubernetes), so name the learner
# after the hub user instead.
LEARNER_CONFIG = '''\
# A learner's nbgrader settings on a hub whose servers all run as one OS user.
import os

c = get_config()  # noqa: F821
c.CourseDirectory.student_id = os.environ["JUPYTERHUB_USER"]
'''


def class_config(course_id: str = COURSE_ID, exchange: Path = EXCHANGE) -> str:
    """The nbgrader_config.py every user's server reads (``/etc/jupyter`` in a user pod)."""
    return CLASS_CONFIG.format(course_id=course_id, exchange=str(exchange))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _secret(env: str, kept: dict, key: str, length: int) -> str:
    """From the environment, else as kept from the last start, else new."""
    return os.environ.get(env) or kept.get(key) or secrets.token_urlsafe(length)


def prepare(args: argparse.Namespace) -> dict:
    """Lay out the state folder and return the settings jupyterhub_config.py reads."""
    state = args.state.resolve()
    state.mkdir(parents=True, exist_ok=True)
    kept_file = state / "hub.json"
    kept = json.loads(kept_file.read_text()) if kept_file.exists() else {}
    exchange = args.exchange.resolve()
    try:
        exchange.mkdir(parents=True, exist_ok=True)
        if exchange.stat().st_uid == os.getuid():
            exchange.chmod(0o777)  # nbgrader's set-up: every learner writes here
    except PermissionError:
        sys.exit(f"cannot create nbgrader's exchange {exchange}: create it once with "
                 f"`sudo install -d -m 777 {exchange}`, or pass --exchange DIR")
    for folder, text in (("jupyter", class_config(args.course_id, exchange)),
                         ("learners", LEARNER_CONFIG)):
        (state / "etc" / folder).mkdir(parents=True, exist_ok=True)
        (state / "etc" / folder / "nbgrader_config.py").write_text(text)
    course = state / "home" / args.instructor / args.course_id
    made = subprocess.run([sys.executable, "-m", "autograder", "course-dir", str(course),
                           "--chapters", args.chapters, "--course-id", args.course_id,
                           "--exchange", str(exchange)], cwd=REPO)
    if made.returncode:
        sys.exit(made.returncode)
    settings = {
        "ip": args.ip, "port": args.port, "hub_port": _free_port(),
        "proxy_api_port": _free_port(), "instructor": args.instructor,
        "course_id": args.course_id, "course_dir": str(course), "exchange": str(exchange),
        "learner_password": _secret("KV_HUB_PASSWORD", kept, "learner_password", 12),
        # JupyterHub asks 32 characters of an admin's shared password
        "instructor_password": _secret("KV_HUB_INSTRUCTOR_PASSWORD", kept,
                                       "instructor_password", 24),
        "admin_token": _secret("KV_HUB_TOKEN", kept, "admin_token", 32),
    }
    kept_file.touch(mode=0o600)
    kept_file.chmod(0o600)
    kept_file.write_text(json.dumps(settings, indent=2))
    return settings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state", type=Path, default=HUB / "state",
                        help="where the hub keeps homes, its database and secrets")
    parser.add_argument("--ip", default="127.0.0.1",
                        help="address to listen on (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--instructor", default="instructor", help="the instructor's user name")
    parser.add_argument("--chapters", default="all", help="the class's chapters, e.g. 1-3")
    parser.add_argument("--course-id", default=COURSE_ID)
    parser.add_argument("--exchange", type=Path, default=EXCHANGE,
                        help=f"nbgrader's exchange folder (default {EXCHANGE})")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if not PROXY.exists():
        sys.exit(f"JupyterHub's proxy is not installed: run `npm ci --prefix {HUB}` "
                 "(`make hub` does)")
    settings = prepare(args)
    url = f"http://{settings['ip']}:{settings['port']}"
    print(f"""JupyterHub for {settings['course_id']} at {url}
  learners:   any name, password {settings['learner_password']}
  instructor: {settings['instructor']}, password {settings['instructor_password']}
              course directory ~/{settings['course_id']} ({settings['course_dir']})
  exchange:   {settings['exchange']}
  admin API token (add learners, start servers): {settings['admin_token']}
Ctrl-C stops the hub, its proxy and every user's server.""", flush=True)
    hub = Path(sys.executable).parent / "jupyterhub"
    state = args.state.resolve()
    env = dict(os.environ, KV_HUB_STATE=str(state))
    os.chdir(state)
    os.execve(hub, [str(hub), "-f", str(HUB / "jupyterhub_config.py")], env)


if __name__ == "__main__":
    main()
