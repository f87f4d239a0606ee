"""A bootstrap node under a store flood keeps its memory under a stated bound.

A hostile DHT peer in its own process (tests/helpers/dht_attacker.py ``flood``) stores ~12,000 validly
signed, fresh roster cards of ~8 KiB each (~94 MiB) at a real ``swarmnode bootstrap``. BoundedStorage keeps
at most MAX_STORED_RECORDS (4096) records, ~32 MiB of values: the resident memory of the bootstrap's DHT
process may grow by at most FLOOD_RSS_BOUND_MIB, and the bootstrap still answers /health.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

from benchmarks.harness.processes import REPO, LineReader, start_bootstrap
from tests.helpers.swarm_procs import HELPERS, end_group, free_port

MIB = 1024 * 1024
MAX_STORED_RECORDS = 4096  # swarm.dht_guard's bound (not imported: the test also runs on older code)
FLOOD_RSS_BOUND_MIB = 64  # 4096 x 8 KiB of values, twice over for hivemind's bookkeeping
FLOOD_TIMEOUT_S = 400.0


def _dht_process(pid: int) -> psutil.Process:
    """The bootstrap's DHT process: its python child (p2pd is that child's child)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        kids = [p for p in psutil.Process(pid).children() if "python" in p.name().lower()]
        if kids:
            return kids[0]
        time.sleep(0.5)
    raise AssertionError("the bootstrap has no DHT process")


@pytest.mark.slow  # ~50 s, 12 000 signed cards; the storage bounds are unit-tested (test_dht_guard)
def test_a_store_flood_leaves_the_bootstrap_dht_memory_under_its_bound(tmp_path):
    port = free_port()
    boot = start_bootstrap(tmp_path / "boot", "--port", str(port))
    attacker = None
    try:
        address = boot.address(f"/ip4/127.0.0.1/tcp/{port}/p2p/", 90)
        metrics_url = boot.wait_for_line("metrics at ", 10).split("metrics at ", 1)[1].split()[0]
        dht = _dht_process(boot.proc.pid)
        time.sleep(2.0)
        before = dht.memory_info().rss
        cmd = [sys.executable, str(HELPERS / "dht_attacker.py"), address, "flood-0", "nobody", "flood"]
        attacker = subprocess.Popen(
            cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,  # its own process group: it, its bare DHT process and p2pd
        )  # fmt: skip
        out = LineReader(attacker.stdout)
        line = out.wait_for_line(
            lambda s: s.startswith("STORED "), FLOOD_TIMEOUT_S, lambda: "\n".join(out.lines)
        )
        stored = json.loads(line.removeprefix("STORED "))["flood"]
        after = dht.memory_info().rss
        grown = (after - before) / MIB
        print(
            f"flood: {stored} records accepted; DHT process RSS {before / MIB:.0f} -> {after / MIB:.0f} MiB"
        )
        assert stored <= MAX_STORED_RECORDS, stored
        assert grown < FLOOD_RSS_BOUND_MIB, f"the DHT process grew by {grown:.0f} MiB"
        with urllib.request.urlopen(metrics_url.removesuffix("/metrics") + "/health", timeout=30) as reply:
            assert json.loads(reply.read())["status"] == "ok"
    finally:
        if attacker is not None:
            end_group(attacker)
        boot.stop()
