"""A running tiny node serves /metrics (valid Prometheus text) and /health, and writes its scrape target."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from swarmnode.config import load_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    from swarmnode.node import Node

    run_dir = tmp_path_factory.mktemp("metrics-node")
    cfg = load_config(REPO / "node_configs" / "tiny.yaml", {"run.run_dir": str(run_dir), "run.rounds": 2})
    node = Node(cfg)
    node.run()
    yield node
    node.close()


def _get(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode(), response.headers["Content-Type"]


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_reflect_the_last_round(node):
    text, ctype = _get(node.metrics_server.url + "/metrics")
    assert ctype.startswith("text/plain")
    samples = _samples(text)
    last = node.runlog.records()[-1]
    assert samples[("swarmnode_rounds_total", ())] == 2
    assert samples[("swarmnode_round", ())] == last["round"] == 2
    assert samples[("swarmnode_policy_version", ())] == last["policy_version"]
    assert samples[("swarmnode_reward", (("source", "local"),))] == pytest.approx(last["reward_mean"])
    for task, value in last["reward_by_task"].items():
        assert samples[("swarmnode_task_reward", (("task", task),))] == pytest.approx(value)
    for phase in ("sample", "score", "train"):
        assert samples[("swarmnode_round_phase_seconds", (("phase", phase),))] == pytest.approx(
            last[f"seconds_{phase}"]
        )
    assert samples[("swarmnode_checkpoint_timestamp_seconds", ())] > 0
    assert samples[("swarmnode_process_resident_memory_bytes", ())] > 10e6
    info = {labels: v for (name, labels), v in samples.items() if name == "swarmnode_node_info"}
    [(labels, value)] = info.items()
    assert value == 1 and dict(labels)["peer_id"] == node.peer_id and dict(labels)["model"] == "tiny-llama"


def test_health_and_scrape_target(node):
    body, ctype = _get(node.metrics_server.url + "/health")
    assert ctype == "application/json"
    health = json.loads(body)
    assert health["status"] == "ok" and health["round"] == 2
    target = json.loads((node.run_dir / "prometheus_target.json").read_text())
    assert target == [
        {
            "targets": [f"127.0.0.1:{node.metrics_server.port}"],
            "labels": {"peer_id": node.peer_id, "model": "tiny-llama"},
        }
    ]
    assert node.metrics_server.host == "127.0.0.1"  # localhost unless asked


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed"
)
def test_promtool_accepts_the_exposition(node):
    text, _ = _get(node.metrics_server.url + "/metrics")
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
