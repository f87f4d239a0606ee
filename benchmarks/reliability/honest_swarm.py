"""The honest side of the Sybil studies (``sybil_flood``, ``sybil_mix``): tiny ``swarmnode join`` processes
on 127.0.0.1 with their share traces on, and what is read back from their run folders.

``start_honest`` starts ``nodes`` nodes on node_configs/tiny.yaml in one swarm (the first is the others'
initial peer) and waits, bounded, until each has finished a round: the swarm runs before any attacker
comes. Their rounds go on until they are stopped (``stop_all``). What the studies read: a node's peer id
and status (``status.json``), the lines of its log that say something broke (``errors``), and whether
a process still lives (``alive``).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from benchmarks.harness.processes import REPO, NodeProc, start_node
from swarmnode.swarm.exchange.records import SHARE_TRACE_ENV

CONFIG = REPO / "node_configs" / "tiny.yaml"
MAX_ROUNDS = 10_000  # the nodes run until the study is over and they are stopped
ERROR_MARKERS = ("Traceback", "CRITICAL", "EOFError", "Resource temporarily unavailable")


def join_args(swarm_id: str, min_peers: int, deadline_s: float) -> list[str]:
    """A study node's ``swarmnode join`` options: tiny.yaml, rounds until stopped, one CPU thread."""
    return [
        "--config", str(CONFIG), "--rounds", str(MAX_ROUNDS),
        "--set", f"swarm.swarm_id={swarm_id}", "--set", f"swarm.min_peers={min_peers}",
        "--set", f"swarm.share_deadline_s={deadline_s}", "--set", "swarm.wait_for_peers_s=300",
        "--set", "run.checkpoint_every=1000", "--set", "run.cpu_threads=1",
    ]  # fmt: skip


@contextlib.contextmanager
def share_traces() -> Iterator[None]:
    """Nodes started inside write their share traces (share.jsonl: what pulled what, when)."""
    old = os.environ.get(SHARE_TRACE_ENV)
    os.environ[SHARE_TRACE_ENV] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(SHARE_TRACE_ENV, None)
        else:
            os.environ[SHARE_TRACE_ENV] = old


def start_honest(
    workdir: Path, swarm_id: str, nodes: int, deadline_s: float, until: float, started: list[NodeProc]
) -> str:
    """Start ``nodes`` honest nodes (run folders ``node00``...) into ``started`` (so that the caller stops
    them whatever happens) and wait until each finished a round, at the latest at ``until``
    (time.monotonic()). Returns the first node's address."""
    started.append(start_node(workdir / "node00", *join_args(swarm_id, nodes - 1, deadline_s)))
    address = started[0].address(timeout_s=300.0)
    for i in range(1, nodes):
        started.append(
            start_node(workdir / f"node{i:02d}", *join_args(swarm_id, nodes - 1, deadline_s), peers=[address])
        )
    for node in started:
        node.wait_for_round(1, timeout_s=max(until - time.monotonic(), 1.0))
    return address


def save_logs(nodes: list[NodeProc]) -> None:
    """Each node's console output as ``node.log`` in its run folder."""
    for node in nodes:
        (node.run_dir / "node.log").write_text("\n".join(node.lines) + "\n")


def errors(node: NodeProc) -> list[str]:
    """The first lines of the node's log that say something broke (ERROR_MARKERS)."""
    return [line for line in node.lines if any(marker in line for marker in ERROR_MARKERS)][:10]


def status_summary(node: NodeProc) -> dict:
    """What the node refused and dropped, and its DHT's health, from status.json."""
    status = read_status(node)
    return {
        key: status.get(key) for key in ("roster_refused", "rejected", "fetch_failures", "notices", "dht")
    }


def read_status(node: NodeProc) -> dict:
    """status.json ({} while it is missing or being replaced)."""
    try:
        return json.loads((node.run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def peer_id(node: NodeProc) -> str:
    return read_status(node).get("peer_id", "")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
