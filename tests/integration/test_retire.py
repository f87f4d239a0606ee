"""Retiring a node: a real Prometheus scrapes two tiny solo nodes through their file_sd target files; the
one stopped cleanly (SIGTERM) leaves no `up` series behind, so `SwarmnodeDown` (up == 0 for 1m) never
fires for it, while the one killed (SIGKILL, a crash) reads up == 0 and alerts."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from benchmarks.harness.processes import start_node
from swarmnode.metrics_server import TARGET_FILE
from tests.helpers.cli import TINY
from tests.helpers.prometheus import SCRAPE_S, Prometheus

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs Debian's prometheus")


def _up(prom: Prometheus) -> dict[str, float]:
    """peer id -> the latest `up` sample, for every target with a fresh series."""
    result = prom.query('up{job="swarmnode"}')["data"]["result"]
    return {r["metric"]["peer_id"]: float(r["value"][1]) for r in result}


def _wait(prom: Prometheus, done, timeout_s: float) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while not done(up := _up(prom)) and time.monotonic() < deadline:
        time.sleep(SCRAPE_S / 2)
    return up


def _peer_id(target: Path) -> str:
    return json.loads(target.read_text())[0]["labels"]["peer_id"]


def test_a_clean_stop_retires_the_target_and_a_crash_still_alerts(tmp_path: Path) -> None:
    args = ("--config", str(TINY), "--rounds", "1000", "--set", "run.metrics_port=0")
    nodes = [start_node(tmp_path / name, *args, command="solo") for name in ("stopped", "crashed")]
    prom = None
    try:
        for node in nodes:
            node.wait_for_line("status page at", timeout_s=60)
        stopped, crashed = (_peer_id(node.run_dir / TARGET_FILE) for node in nodes)
        prom = Prometheus(tmp_path / "prometheus", [node.run_dir / TARGET_FILE for node in nodes])
        prom.wait_ready()
        up = _wait(prom, lambda up: up == {stopped: 1.0, crashed: 1.0}, timeout_s=20)
        assert up == {stopped: 1.0, crashed: 1.0}, prom.log()

        os.kill(nodes[0].proc.pid, signal.SIGTERM)  # as systemd stops it; Ctrl-C takes the same path
        assert nodes[0].wait(timeout_s=30) == 143, nodes[0].output()
        assert json.loads((nodes[0].run_dir / TARGET_FILE).read_text()) == []
        nodes[1].kill()
        up = _wait(prom, lambda up: up == {crashed: 0.0}, timeout_s=15)
        assert up == {crashed: 0.0}, (up, prom.log())
    finally:
        if prom is not None:
            prom.stop()
        for node in nodes:
            node.stop()
