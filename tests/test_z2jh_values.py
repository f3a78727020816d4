"""The Kubernetes set-up (hub/z2jh-values.yaml, hub/exchange-pvc.yaml, hub/Dockerfile) is the
one-machine hub's class where it need not differ, and uses only keys Zero to JupyterHub
documents. Without `helm` here, the values are checked against those keys (the chart's
configuration reference), not rendered by the chart."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
import tomllib
import yaml
from traitlets.config.loader import PyFileConfigLoader

NUMBER = (int, float)
# The keys of the chart's configuration reference this file may use: a mapping lists the
# documented keys below it ("*": any name, as for files, services and roles), a type is a leaf.
DOCUMENTED = {
    "hub": {
        "config": {"*": dict},  # JupyterHub's own settings, by class name
        "services": {"*": {"name": str, "admin": bool, "url": str, "command": (str, list),
                           "api_token": str, "apiToken": str}},
        "loadRoles": {"*": {"name": str, "description": str, "scopes": list, "users": list,
                            "services": list, "groups": list}},
        "db": {"type": str, "url": str, "pvc": {"storage": str, "accessModes": list,
                                                "storageClassName": str}},
        "extraConfig": {"*": str},
    },
    "proxy": {
        "service": {"type": str, "loadBalancerIP": str, "nodePorts": {"http": int, "https": int}},
        "https": {"enabled": bool, "type": str, "hosts": list,
                  "letsencrypt": {"contactEmail": str}},
    },
    "singleuser": {
        "image": {"name": str, "tag": str, "pullPolicy": str, "pullSecrets": list},
        "defaultUrl": str, "startTimeout": int, "cmd": (str, list), "uid": int, "fsGid": int,
        "cpu": {"limit": NUMBER, "guarantee": NUMBER},
        "memory": {"limit": (str, *NUMBER), "guarantee": (str, *NUMBER)},
        "storage": {"type": str, "capacity": str, "homeMountPath": str, "extraVolumes": list,
                    "extraVolumeMounts": list,
                    "dynamic": {"storageClass": str, "storageAccessModes": list}},
        "extraFiles": {"*": {"mountPath": str, "stringData": str, "data": dict,
                             "binaryData": str, "mode": int}},
        "extraEnv": dict,
        "profileList": list,
    },
}


def undocumented(values, documented, where: str = "") -> list[str]:
    """Every key of ``values`` the reference does not list, or of another type."""
    if not isinstance(documented, dict):
        if isinstance(values, documented):
            return []
        return [f"{where.lstrip('.')}: {type(values).__name__}"]
    if not isinstance(values, dict):
        return [f"{where.lstrip('.')}: not a mapping"]
    wrong = []
    for key, value in values.items():
        below = documented.get(key, documented.get("*"))
        if below is None:
            wrong.append(f"{where}.{key}".lstrip("."))
        else:
            wrong += undocumented(value, below, f"{where}.{key}")
    return wrong


@pytest.fixture(scope="module")
def values(repo) -> dict:
    return yaml.safe_load((repo / "hub" / "z2jh-values.yaml").read_text())


@pytest.fixture(scope="module")
def local_hub(repo, tmp_path_factory, monkeypatch_module) -> tuple:
    """The one-machine hub's JupyterHub settings and the class's nbgrader settings, as
    hub/jupyterhub_config.py and hub/launch.py give them."""
    state = tmp_path_factory.mktemp("state")
    (state / "hub.json").write_text(json.dumps({
        "ip": "127.0.0.1", "port": 8000, "hub_port": 8081, "proxy_api_port": 8001,
        "instructor": "instructor", "learner_password": "x" * 8,
        "instructor_password": "y" * 32, "admin_token": "z"}))
    monkeypatch_module.setenv("KV_HUB_STATE", str(state))
    hub = PyFileConfigLoader("jupyterhub_config.py", path=str(repo / "hub")).load_config()
    spec = importlib.util.spec_from_file_location("launch", repo / "hub" / "launch.py")
    launch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launch)
    (state / "nbgrader_config.py").write_text(launch.class_config())
    return hub, PyFileConfigLoader("nbgrader_config.py", path=str(state)).load_config()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_the_values_use_only_keys_zero_to_jupyterhub_documents(values):
    assert undocumented(values, DOCUMENTED) == []
    user = values["singleuser"]
    assert {"hub", "proxy", "singleuser"} <= set(values)
    assert {"image", "cpu", "memory", "storage", "extraFiles"} <= set(user)
    assert {"extraVolumes", "extraVolumeMounts"} <= set(user["storage"])
    assert all(name[0].isupper() for name in values["hub"]["config"])  # class names
    for file in user["extraFiles"].values():
        assert "mountPath" in file and len({"data", "stringData", "binaryData"} & set(file)) == 1
    for resource in ("cpu", "memory"):
        assert {"guarantee", "limit"} <= set(user[resource])


def test_the_class_has_the_local_hubs_nbgrader_settings(values, local_hub, tmp_path):
    files = {f["mountPath"]: f["stringData"] for f in values["singleuser"]["extraFiles"].values()}
    (tmp_path / "nbgrader_config.py").write_text(files["/etc/jupyter/nbgrader_config.py"])
    pods = PyFileConfigLoader("nbgrader_config.py", path=str(tmp_path)).load_config()
    _, local = local_hub
    assert pods.CourseDirectory.course_id == local.CourseDirectory.course_id
    assert pods.Exchange.root == local.Exchange.root
    assert pods == local  # nothing else differs either


def test_every_user_pod_mounts_the_shared_exchange_read_write_many(values, local_hub, repo):
    storage = values["singleuser"]["storage"]
    _, local = local_hub
    mount = next(m for m in storage["extraVolumeMounts"] if m["mountPath"] == local.Exchange.root)
    assert not mount.get("readOnly")
    volume = next(v for v in storage["extraVolumes"] if v["name"] == mount["name"])
    claim = yaml.safe_load((repo / "hub" / "exchange-pvc.yaml").read_text())
    assert claim["kind"] == "PersistentVolumeClaim" and claim["apiVersion"] == "v1"
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


def test_the_hub_is_the_local_hub_where_it_need_not_differ(values, local_hub):
    hub, _ = local_hub
    config = values["hub"]["config"]
    assert config["JupyterHub"]["authenticator_class"] == hub.JupyterHub.authenticator_class
    assert set(config["Authenticator"]["admin_users"]) == hub.Authenticator.admin_users
    assert config["Authenticator"]["allow_all"] == hub.Authenticator.allow_all
    roles = {r["name"]: r for r in hub.JupyterHub.load_roles}
    for name, role in values["hub"]["loadRoles"].items():
        assert role["scopes"] == roles[name]["scopes"]
        assert role["services"] == roles[name]["services"]
    assert set(values["hub"]["services"]) == {s["name"] for s in hub.JupyterHub.services}
    assert values["singleuser"]["defaultUrl"] == hub.Spawner.default_url


def test_the_image_is_the_course_wheel_of_this_version(values, repo):
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    assert values["singleuser"]["image"]["tag"] == project["version"]
    wheel = re.sub(r"[-_.]+", "_", project["name"])
    dockerfile = (repo / "hub" / "Dockerfile").read_text()
    assert f"COPY ${{COURSE}}/{wheel}-*.whl" in dockerfile and "ARG COURSE=dist" in dockerfile
    assert re.search(rf"pip install .*{wheel}-\*\.whl\)\" \"nbgrader", dockerfile)
    assert f":{project['version']}" in dockerfile  # the tag it tells you to build
