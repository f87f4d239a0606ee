"""Start-up mistakes end in one line within EARLY_S of the start, before the model loads and before the
run folder is made: a taken p2p or metrics port, an initial peer's address that does not parse or that
another peer answers; initial peers where nothing answers are named as early, and the start goes on."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from benchmarks.harness.processes import node_env, start_bootstrap
from tests.helpers.cli import COMMAND, TINY, swarmnode

EARLY_S = 5.0
PEER_ID = "12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq"


@contextmanager
def _taken_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        yield taken.getsockname()[1]


def _fails_early(tmp_path: Path, *args: str) -> str:
    """Run a start that must fail; its one error line (exit 2, no traceback, no model, no run folder)."""
    run_dir = tmp_path / "run"
    start = time.monotonic()
    proc = swarmnode(*args, "--config", str(TINY), "--run-dir", str(run_dir), cwd=tmp_path)
    took = time.monotonic() - start
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert took < EARLY_S, f"{took:.1f}s: {lines[0]}"
    assert not run_dir.exists()
    return lines[0]


@pytest.mark.parametrize("command", ["solo", "join"])
def test_a_taken_metrics_port(tmp_path: Path, command: str) -> None:
    with _taken_port() as port:
        line = _fails_early(tmp_path, command, "--set", f"run.metrics_port={port}")
    assert "run.metrics_port" in line and str(port) in line


def test_a_taken_p2p_port(tmp_path: Path) -> None:
    with _taken_port() as port:
        line = _fails_early(tmp_path, "join", "--set", f'swarm.host_maddrs=["/ip4/127.0.0.1/tcp/{port}"]')
    assert f"TCP port {port}" in line and "swarm.host_maddrs" in line


def test_an_initial_peer_without_a_port(tmp_path: Path) -> None:
    addr = f"/ip4/127.0.0.1/tcp//p2p/{PEER_ID}"
    line = _fails_early(tmp_path, "join", "--peers", addr)
    assert addr in line and "swarm.initial_peers" in line


def test_an_initial_peer_that_answers_as_another_peer(tmp_path: Path) -> None:
    """The address is right but its /p2p/ id is not who answers there (a node that changed identity, or
    an id pasted from another node): the line names the peer id that did answer."""
    bootstrap = start_bootstrap(
        tmp_path / "bootstrap", "--set", 'bootstrap.host_maddrs=["/ip4/127.0.0.1/tcp/0"]'
    )
    try:
        addr = bootstrap.address()
        real = addr.rsplit("/p2p/", 1)[1]
        line = _fails_early(tmp_path, "join", "--peers", addr.replace(real, PEER_ID))
    finally:
        bootstrap.stop()
    assert PEER_ID in line and real in line and "swarm.initial_peers" in line


def test_initial_peers_where_nothing_answers_are_named_within_seconds(tmp_path: Path) -> None:
    """A port nobody listens on (bound here, never listening, so nothing else takes it): one line names
    the address within EARLY_S, before the model loads, and the start goes on (the DHT start tries the
    peers again and ends in its own error: a bootstrap started at the same moment may need those seconds).
    The node is ended here, by its PID, once the line is read."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        addr = f"/ip4/127.0.0.1/tcp/{silent.getsockname()[1]}/p2p/{PEER_ID}"
        start = time.monotonic()
        proc = subprocess.Popen(
            [*COMMAND, "join", "--peers", addr, "--config", str(TINY), "--run-dir", str(tmp_path / "run")],
            cwd=tmp_path,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=node_env(),
        )
        try:
            first = proc.stderr.readline()
            took = time.monotonic() - start
            going_on = proc.poll() is None
        finally:
            proc.kill()
            proc.wait()
    assert "swarm.initial_peers: nothing answers yet" in first and addr in first, first
    assert took < EARLY_S, f"{took:.1f}s: {first}"
    assert going_on, "the start ended at the line instead of trying the peers again"
