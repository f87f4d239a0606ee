"""`swarmnode status` on a run folder: a stopped node's data is not shown as live."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from swarmnode.status import LOCK_FILE, format_status, read_status

ROUND = {"round": 3, "policy_version": 3, "reward_mean": 0.5, "format_rate": 0.75, "groups_local": 4,
         "groups_peer": 2, "groups_kept": 5}  # fmt: skip
SWARM = {
    "peer_id": "12D3KooWexample", "swarm_id": "s", "addrs": ["/ip4/127.0.0.1/tcp/1"], "connected": 1,
    "peers": {"12D3KooWpeer": {"model": "tiny", "policy_version": 3, "round": 3, "seen_s_ago": 2.0,
                               "banned": False}},
    "rollouts": {"groups_published": 4, "batches_published": 1, "batches_received": 1, "groups_accepted": 2,
                 "groups_trained": 2},
    "arrival_s": {"count": 0, "sum": 0.0}, "rejected": {}, "bans": [],
}  # fmt: skip


def _run_folder(tmp_path: Path, age_s: float) -> Path:
    """A run folder as a node leaves it: a round record, its swarm status and the lock file, ``age_s`` old."""
    then = time.time() - age_s
    (tmp_path / "metrics.jsonl").write_text(json.dumps(ROUND) + "\n")
    os.utime(tmp_path / "metrics.jsonl", (then, then))
    (tmp_path / "status.json").write_text(json.dumps({**SWARM, "updated": then}))
    (tmp_path / LOCK_FILE).write_text("pid 4242")
    return tmp_path


def test_a_stopped_node_is_reported_as_not_running_with_the_age_of_its_data(tmp_path):
    folder = _run_folder(tmp_path, age_s=3 * 3600)
    first, *rest = format_status(read_status(folder)).splitlines()
    assert first.startswith("node not running"), first
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(time.time() - 3 * 3600))
    assert when in first and "3.0 h ago" in first, first
    assert rest[0].startswith("round 3"), rest


def test_a_node_holding_the_lock_is_reported_as_running(tmp_path):
    folder = _run_folder(tmp_path, age_s=5)
    with open(folder / LOCK_FILE, "a+") as held:  # what node.py's _lock_run_dir holds for its process's life
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        first = format_status(read_status(folder)).splitlines()[0]
        assert first.startswith("node running (pid 4242)") and "5 s ago" in first, first
    assert format_status(read_status(folder)).startswith("node not running")  # released: stopped again


def test_a_folder_without_a_lock_file_is_not_running(tmp_path):
    folder = _run_folder(tmp_path, age_s=60)
    (folder / LOCK_FILE).unlink()
    assert format_status(read_status(folder)).startswith("node not running")


def test_the_status_command_says_not_running(tmp_path):
    folder = _run_folder(tmp_path, age_s=600)
    proc = subprocess.run(
        [sys.executable, "-m", "swarmnode.cli", "status", "--run-dir", str(folder)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("node not running: its last data below dates from "), proc.stdout
    assert "(10 min ago)" in proc.stdout.splitlines()[0]
