"""How `swarmnode bootstrap` stops: Ctrl-C in a terminal and SIGTERM from systemd or docker.

A terminal's Ctrl-C sends SIGINT to the whole foreground process group; the test starts the bootstrap as
the leader of a group of its own (as a shell does) and signals that group, its own child's, by id.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.harness.processes import REPO, LineReader, node_env
from tests.helpers.swarm_procs import alive, free_port


def _descendants(pid: int) -> list[int]:
    out = []
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except FileNotFoundError:
        return out
    for child in map(int, children):
        out += [child, *_descendants(child)]
    return out


def _start_in_own_group(tmp_path: Path) -> tuple[subprocess.Popen, LineReader]:
    cmd = [sys.executable, "-m", "swarmnode.cli", "bootstrap", "--identity", str(tmp_path / "boot.key"),
           "--port", str(free_port()), "--set", "bootstrap.metrics_port=null"]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=node_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the group leader, as a shell makes a foreground job
    )
    return proc, LineReader(proc.stdout)


def test_ctrl_c_stops_a_bootstrap_quietly_with_status_130_and_leaves_no_process(tmp_path):
    proc, reader = _start_in_own_group(tmp_path)
    try:
        reader.wait_for_line(lambda line: "bootstrap node up" in line, 120, lambda: "\n".join(reader.lines))
        children = _descendants(proc.pid)  # the DHT process and its p2pd
        assert len(children) >= 2, children
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        status = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    output = "\n".join(reader.lines)
    assert status == 130, output
    assert "[ERROR]" not in output and "closed network connection" not in output, output
    assert "Traceback" not in output and "[WARN]" not in output, output
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in children if alive(pid)], "the DHT process or p2pd outlived the bootstrap"
