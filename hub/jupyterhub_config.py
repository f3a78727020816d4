# A JupyterHub for one class on one machine (`make hub`; hub/README.md says what it starts).
# `hub/launch.py` prepares the state folder and writes the settings this file reads
# (`$KV_HUB_STATE/hub.json`), then starts `jupyterhub -f hub/jupyterhub_config.py`.
import json
import os
import sys
from pathlib import Path

HUB = Path(__file__).resolve().parent
STATE = Path(os.environ["KV_HUB_STATE"]).resolve()
settings = json.loads((STATE / "hub.json").read_text())
# The environment the hub runs in (the project's .venv) runs every user's server and kernels,
# so the course is installed for everyone and `import course` works in every notebook.
BIN = Path(sys.executable).parent
ETC = STATE / "etc"

c = get_config()  # noqa: F821 (defined by JupyterHub when it loads this file)

# --- where it listens: the public URL, and two loopback ports only the hub and proxy use ---
c.JupyterHub.bind_url = f"http://{settings['ip']}:{settings['port']}"
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{settings['hub_port']}"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{settings['proxy_api_port']}"
c.ConfigurableHTTPProxy.command = [str(HUB / "node_modules" / ".bin" / "configurable-http-proxy")]
c.ConfigurableHTTPProxy.pid_file = str(STATE / "proxy.pid")
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
# Stopping the hub (Ctrl-C) stops the proxy and every user's server with it.
c.JupyterHub.cleanup_servers = True
c.JupyterHub.cleanup_proxy = True

# --- who logs in: one password for the learners, another for the instructor ---
# JupyterHub's shared-password authenticator (DummyAuthenticator's password is deprecated in its
# favour). With the learners' password anyone may log in under any name but the instructor's:
# the instructor's account, which holds the gradebook and the solutions, takes its own password.
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = settings["learner_password"]
c.SharedPasswordAuthenticator.admin_password = settings["instructor_password"]
c.Authenticator.admin_users = {settings["instructor"]}
c.Authenticator.allow_all = True

# A token for scripts that manage the class (add learners, start and stop their servers),
# without access to anyone's files.
c.JupyterHub.services = [{"name": "class-admin", "api_token": settings["admin_token"]}]
c.JupyterHub.load_roles = [{"name": "class-admin", "scopes": ["admin:users", "admin:servers"],
                            "services": ["class-admin"]}]

# --- each user's server: a process of this machine's user, with a home of its own ---
# SimpleLocalProcessSpawner needs no system account per learner. It isolates nothing: every
# server runs as the OS user that started the hub (see hub/README.md for a real deployment).
c.JupyterHub.spawner_class = "jupyterhub.spawner.SimpleLocalProcessSpawner"
c.SimpleLocalProcessSpawner.home_dir_template = str(STATE / "home" / "{username}")
c.Spawner.cmd = [str(BIN / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
# A terminal is a login shell by default, and /etc/profile would put the system's Python first
# on the PATH; a plain bash keeps the course's environment, so `nbgrader` is the class's.
c.Spawner.args = ["--ServerApp.terminado_settings=shell_command=/bin/bash"]
if os.getuid() == 0:  # a server refuses to run as root unless told to (containers, class VMs)
    c.Spawner.args.append("--ServerApp.allow_root=True")


def _config_path(spawner) -> str:
    """nbgrader's settings for this user: the class's (course id, exchange) for everyone, and
    for learners the student id nbgrader's submit records (the hub user, not the OS user all
    servers share). The instructor's commands read student_id as a filter over the class."""
    folders = [ETC / "jupyter"]
    if spawner.user.name != settings["instructor"]:
        folders.insert(0, ETC / "learners")
    return os.pathsep.join(map(str, folders))


c.Spawner.environment = {
    "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "/usr/bin:/bin")]),
    "JUPYTER_CONFIG_PATH": _config_path,
}
