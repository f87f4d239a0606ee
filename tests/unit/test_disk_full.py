"""A full disk outside checkpoints never stops the node: the round log, status.json and peer_groups.jsonl
skip the write, say so once per file and count it (``swarmnode_disk_write_failures_total``)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest

from swarmnode.common import WriteFailures
from swarmnode.runlog import RunLog

TMPFS_KIB = 64


@pytest.fixture
def full_disk(tmp_path) -> Path:
    """A tiny tmpfs filled to the last byte (root only: skipped elsewhere); unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "full"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_KIB}k", "tmpfs", str(mnt)], check=True)
    try:
        with contextlib.suppress(OSError), (mnt / "filler").open("wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_the_round_log_skips_a_record_on_a_full_disk_and_says_so_once(full_disk, capsys):
    log = RunLog(full_disk)
    log.append({"round": 1})
    log.append({"round": 2})
    assert log.write_failures.count == 2
    assert capsys.readouterr().err.count("cannot write") == 1


def test_status_and_peer_groups_writes_skip_on_a_full_disk(full_disk, capsys):
    from swarmnode.config import NodeConfig
    from swarmnode.identity import Identity
    from swarmnode.swarm.exchange import records
    from swarmnode.swarm.exchange.status import SwarmStatus, write_status
    from swarmnode.tasks import TaskBank
    from tests.helpers.verify_world import Peer

    cfg = NodeConfig.model_validate({"tasks": {"mix": {"basic_arithmetic": {}}, "seed": 1}})
    groups = Peer(Identity.generate(), TaskBank(cfg.tasks, default_seed=0)).groups(2)
    failures = WriteFailures()
    for round_ in (1, 2):
        write_status(full_disk, SwarmStatus(round=round_, model="x" * 8192), failures)
        records.append_peer_groups(full_disk, round_, groups, failures)
    assert failures.count == 4
    assert capsys.readouterr().err.count("cannot write") == 2  # once per file
