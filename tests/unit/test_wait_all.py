"""benchmarks.common.wait_all: a learning part's nodes are awaited with a bounded wait and progress lines."""

from __future__ import annotations

import subprocess
import sys
import time

from benchmarks.common import wait_all
from swarmnode.experiment.processes import NodeProc


def sleeper(tmp_path, seconds: float) -> NodeProc:
    """A process that lives ``seconds``; wait_all only watches ``proc`` (no log reader needed)."""
    proc = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])
    return NodeProc(run_dir=tmp_path, proc=proc, reader=None)


def test_progress_is_printed_while_nodes_run_and_the_wait_ends_when_all_exit(tmp_path, capsys):
    nodes = [sleeper(tmp_path, 0.6), sleeper(tmp_path, 1.2)]
    calls = []

    def progress() -> str:
        calls.append(sum(node.proc.poll() is None for node in nodes))
        return f"running {calls[-1]}"

    t0 = time.monotonic()
    assert wait_all(nodes, time.monotonic() + 30, progress, every_s=0.25) is False
    assert time.monotonic() - t0 < 10
    assert all(node.proc.returncode == 0 for node in nodes)
    assert len(calls) >= 3 and calls[0] == 2 and calls[-1] == 1
    assert "running 2" in capsys.readouterr().err


def test_the_wait_ends_at_the_limit_with_a_node_still_running(tmp_path):
    node = sleeper(tmp_path, 60)
    try:
        t0 = time.monotonic()
        assert wait_all([node], time.monotonic() + 0.5, every_s=0.1) is True
        assert 0.5 <= time.monotonic() - t0 < 5
        assert node.proc.poll() is None
    finally:
        node.proc.kill()
        node.proc.wait()
