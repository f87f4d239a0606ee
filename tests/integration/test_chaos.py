"""Chaos, short version (the long one: benchmarks/chaos.py, figures in docs/reliability.md).

A swarm of three tiny nodes joined through a bootstrap: one node's clock jumps 20 s mid-run and back, one
node's disk fills up (a real tmpfs) for two of its rounds, one node is SIGKILLed mid-round and its newest
checkpoint corrupted before it restarts. No node crashes or waits past its deadline, the restarted node
resumes from its newest valid checkpoint and says which one it skipped, no round is lost. Needs root
(mount); skipped otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from benchmarks.chaos import run_chaos
from swarmnode import checkpoint
from tests.unit.test_checkpoint import save, trained

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs: room for one tiny-model checkpoint (~2.3 MB), not two."""
    path = tmp_path / "disk"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_a_checkpoint_that_does_not_fit_fails_cleanly(small_disk):
    model, optimizer = trained()
    first = save(small_disk, 1, model, optimizer)
    with pytest.raises(OSError, match="(?i)no space left|writing checkpoint round 2 failed"):
        save(small_disk, 2, model, optimizer)
    assert [p.name for p in small_disk.iterdir()] == [first.name]  # no half-written folder left behind
    assert checkpoint.newest_valid(small_disk).round == 1


def test_swarm_survives_kill_corruption_full_disk_and_clock_jump(tmp_path):
    report = run_chaos(
        tmp_path, nodes=3, rounds=6, kills=1, deadline_s=5.0, checkpoint_every=2, clock_jump_s=20.0,
        disk_full=True, seed=1, time_limit_s=600,
    )  # fmt: skip
    summary = {
        k: report[k] for k in ("wall_s", "events", "kills", "max_share_s", "rounds_lost", "rounds_rerun")
    }
    print(f"\nchaos: {json.dumps(summary)}")
    assert report["problems"] == [], json.dumps(report, indent=1)
    [kill] = report["kills"]
    assert kill["corrupted"] is not None and kill["corrupt_reported"]
    assert report["per_node"]["node02"]["checkpoint_failures"] >= 1
