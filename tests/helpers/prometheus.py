"""A real Prometheus on 127.0.0.1 for tests: monitoring/prometheus.yml with a short scrape interval,
discovering nodes through file_sd target files linked into its own targets folder (as the shipped config
documents), and its HTTP query API. Stopped only through its own pid."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from tests.helpers.swarm_procs import free_port

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS_YML = REPO / "monitoring" / "prometheus.yml"
ALERTS_YML = REPO / "monitoring" / "alerts.yml"
SCRAPE_S = 1  # the tests' scrape interval (monitoring/prometheus.yml uses 5 s)


class Prometheus:
    """Prometheus scraping the nodes whose target files it is given, every SCRAPE_S; `query` runs PromQL."""

    def __init__(self, work: Path, target_files: list[Path]):
        targets = work / "targets"
        targets.mkdir(parents=True)
        for i, path in enumerate(target_files):  # the documented way: link each node's file into targets/
            (targets / f"node{i}.json").symlink_to(path)
        config = yaml.safe_load(PROMETHEUS_YML.read_text())
        config["global"].update(
            scrape_interval=f"{SCRAPE_S}s", scrape_timeout=f"{SCRAPE_S}s", evaluation_interval=f"{SCRAPE_S}s"
        )
        config["rule_files"] = [str(ALERTS_YML)]
        [job] = config["scrape_configs"]
        job["file_sd_configs"] = [{"files": [str(targets / "*.json")], "refresh_interval": "1s"}]
        self.config_path = work / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.log_path = work / "prometheus.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={self.config_path}",
                    f"--storage.tsdb.path={work / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.url = f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text()[-3000:]

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "prometheus exited:\n" + self.log()
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            time.sleep(0.3)
        raise AssertionError(f"prometheus not ready within {timeout_s}s:\n" + self.log())

    def query(self, expr: str) -> dict:
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:  # 400 for a parse error, with a JSON body
            return json.loads(e.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
