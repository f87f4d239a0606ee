"""Acceptance 2 of #15: two nodes behind NAT (every inbound TCP connection dropped) and one reachable
node, a bootstrap, each on its own network-namespace "host". Each NATed node trains on the other's groups.

Which path carries them: the circuit relay. Both NATed nodes find at start that peers cannot dial them,
run in client mode and reserve a relay slot on the bootstrap (their initial peer, started public); each
pulls the other's batches from the author itself over a stream relayed by the bootstrap. The test checks
that path from outside the nodes too: neither NATed host ever holds a TCP connection to the other (``ss``),
only to the bootstrap, and the bootstrap holds no batches, so it cannot have served them as a holder.
The hosts get public-looking addresses (``public=True``): libp2p makes relayed addresses only from a
relay's public ones.

Both tests run their NATed nodes until each has what it should get from the other, bounded in rounds and
time, not for a fixed number of rounds: a round waits for a peer without standing only until it misses one
(exchange/roster.py), so with the tiny model's sub-second rounds a node whose peer was slow to deliver its
first batch ran its remaining rounds without it (CI: a finished 3 rounds having trained on nothing of b's).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from benchmarks.harness.processes import NodeProc, read_jsonl, start_bootstrap, start_node
from swarmnode.status import format_status, read_status
from swarmnode.swarm.exchange.records import SHARE_TRACE_ENV, SHARE_TRACE_FILE
from tests.helpers import netns

REASON = netns.unavailable_reason(nft=True)
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

SWARM = "it-netns-nat"
BOOT_PORT = 31337
RUN_LIMIT_S = 300
SAMPLE_EVERY_S = 1.0
HOLDER_DEADLINE_S = 20
MAX_ROUNDS = 40  # the NATed nodes run until they got each other's batches, at most this
PAIRS = (("a", "b"), ("b", "a"))


def _node_args(*, min_peers: int = 1, share_deadline_s: int = 8, rounds: int = MAX_ROUNDS) -> list[str]:
    return [
        "--config", "node_configs/local-swarm.yaml",
        "--rounds", str(rounds),
        "--set", f"swarm.swarm_id={SWARM}",
        "--set", 'swarm.host_maddrs=["/ip4/0.0.0.0/tcp/0"]',
        "--set", f"swarm.min_peers={min_peers}",
        "--set", "swarm.wait_for_peers_s=90",
        "--set", f"swarm.share_deadline_s={share_deadline_s}",
        "--set", "run.checkpoint_every=10",
    ]  # fmt: skip


def test_two_nodes_behind_nat_train_on_each_others_groups_through_a_relay(tmp_path):
    procs = []
    try:
        with netns.make_network(["boot", "a", "b"], net=79, public=True) as net:
            boot_host = net["boot"]
            boot = start_bootstrap(tmp_path / "boot", "--port", str(BOOT_PORT), prefix=boot_host.exec_args())
            procs.append(boot)
            boot_addr = boot.address(f"/ip4/{net['boot'].ip}/tcp/{BOOT_PORT}/p2p/", 60)

            nodes = {}
            for name in ("a", "b"):
                net[name].drop_inbound_tcp()
                nodes[name] = start_node(
                    tmp_path / name, *_node_args(), peers=[boot_addr], prefix=net[name].exec_args()
                )
                procs.append(nodes[name])
            talked_to: dict[str, set[str]] = {name: set() for name in nodes}
            ids = _PeerIds(nodes)

            def producers(name: str) -> set[str]:
                return {line["producer"] for line in read_jsonl(tmp_path / name / "peer_groups.jsonl")}

            def sample_connections() -> None:  # while they run: whom each holds TCP connections to
                for name in nodes:
                    talked_to[name] |= net[name].tcp_peer_ips()

            _run_until(
                nodes,
                lambda: all(ids.get(other) in producers(name) for name, other in PAIRS),
                sample_connections,
            )

            statuses = {name: node.status() for name, node in nodes.items()}
            for name, other in PAIRS:
                node, status = nodes[name], statuses[name]
                assert "client mode" in node.wait_for_line("reachability:", 1)
                assert net[name].dropped_syns() >= 1  # the dial-back, at least, really was refused
                assert status["rejected"] == {}, status
                # trained on the other NATed node's groups, pulled from it (not from a holder)
                assert producers(name) == {ids.get(other)}, (producers(name), node.output())
                assert "holder" not in status["pulls_by_source"], status["pulls_by_source"]
                # what `swarmnode status` prints names that peer with what was trained from it (#30: it
                # listed only the relay), and says how the node is connected
                shown = format_status(read_status(tmp_path / name)).splitlines()
                assert any(
                    ids.get(other) in line and "trained on " in line and "on none" not in line
                    for line in shown
                ), shown
                assert any(line.startswith("connection: client mode") for line in shown), shown
                # ... and the bytes went through the bootstrap: never a TCP connection between the two
                assert talked_to[name] == {net["boot"].ip}, talked_to
    finally:
        for proc in procs:
            proc.stop()
    assert not [ns for ns in netns.leftover_namespaces() if ns.startswith(net.switch.rsplit("-", 1)[0])]


def test_without_a_relay_a_reachable_node_holds_and_offers_each_nat_nodes_batches_to_the_other(
    tmp_path, monkeypatch
):
    """Private addresses (10.x): libp2p makes no relayed addresses, so no circuit can carry the batches.
    The reachable node r (the swarm's first node, training too) pulls each NATed node's batch over the
    connection that node opened, verifies it, and offers it to the other NATed node, which pulls it from r:
    a holder carried it (``pulls_by_source``, the share trace); r learnt at their dial-back checks that both
    cannot be dialled. Fails without holder offers: each NATed node then has r's batches only.

    The NATed nodes run until each has verified a batch of the other from a holder (bounded in rounds and
    time), not for a fixed number of rounds: a round waits only for peers with standing once it has one
    (exchange/roster.py), so a NATed node whose first rounds came after r's batches ran them on r's alone,
    and in CI one finished its 3 rounds before the other's first batch was offered to it."""
    monkeypatch.setenv(SHARE_TRACE_ENV, "1")  # each node's batch events: who served which batch
    procs = []
    try:
        with netns.make_network(["r", "a", "b"], net=81) as net:
            fixed_port = f'swarm.host_maddrs=["/ip4/0.0.0.0/tcp/{BOOT_PORT}"]'
            args = _node_args(min_peers=2, share_deadline_s=HOLDER_DEADLINE_S, rounds=MAX_ROUNDS)
            # r runs longer than a and b: it serves their batches until they are done
            r = start_node(tmp_path / "r", *args, "--set", fixed_port, "--rounds", str(2 * MAX_ROUNDS),
                           prefix=net["r"].exec_args())  # fmt: skip
            procs.append(r)
            r_addr = r.address(f"/ip4/{net['r'].ip}/tcp/{BOOT_PORT}/p2p/", 120)
            nodes = {}
            for name in ("a", "b"):
                net[name].drop_inbound_tcp()
                nodes[name] = start_node(tmp_path / name, *args, peers=[r_addr], prefix=net[name].exec_args())
                procs.append(nodes[name])
            ids = _PeerIds(nodes)

            def from_holder(name: str, other: str) -> list[dict]:
                """``name``'s verified batches of ``other`` that a holder (not ``other``) served."""
                author = ids.get(other)
                return [
                    e for e in read_jsonl(tmp_path / name / SHARE_TRACE_FILE)
                    if e["event"] == "batch" and author is not None and e["peer"] == author
                    and e.get("holder") != author and "verified" in e
                ]  # fmt: skip

            def counted(name: str) -> bool:
                """``name``'s status.json counts a holder's pull: it is rewritten once a round, so it may
                lag the share trace by a round (CI stopped a node in between once)."""
                path = tmp_path / name / "status.json"
                return path.exists() and nodes[name].status()["pulls_by_source"].get("holder", 0) >= 1

            _run_until(
                nodes, lambda: all(from_holder(name, other) and counted(name) for name, other in PAIRS)
            )

            for name, other in PAIRS:
                status = nodes[name].status()
                trace = [e for e in read_jsonl(tmp_path / name / SHARE_TRACE_FILE) if e["event"] != "publish"]
                assert from_holder(name, other), (status["pulls_by_source"], trace, nodes[name].output())
                assert status["pulls_by_source"].get("holder", 0) >= 1, status["pulls_by_source"]
                # a holder's offer may carry an older announcement than one already read: superseded, and
                # not counted against its author as a replay
                assert status["rejected"] == {}, status
    finally:
        for proc in procs:
            proc.stop()


class _PeerIds:
    """Each node's peer id, read from its status.json once the node has written one."""

    def __init__(self, nodes: dict[str, NodeProc]):
        self._nodes, self._ids = nodes, {}

    def get(self, name: str) -> str | None:
        node = self._nodes[name]
        if name not in self._ids and (node.run_dir / "status.json").exists():
            self._ids[name] = node.status()["peer_id"]
        return self._ids.get(name)


def _run_until(
    nodes: dict[str, NodeProc], done: Callable[[], bool], each: Callable[[], None] = lambda: None
) -> None:
    """Let ``nodes`` run until ``done()`` holds (checked every SAMPLE_EVERY_S, ``each`` called as often), all
    have exited, or RUN_LIMIT_S passes; then stop those still running. Each must end cleanly: done with
    its rounds (0) or stopped (130)."""
    deadline = time.monotonic() + RUN_LIMIT_S
    while time.monotonic() < deadline and any(node.proc.poll() is None for node in nodes.values()):
        each()
        if done():
            break
        time.sleep(SAMPLE_EVERY_S)
    for node in nodes.values():
        assert (node.interrupt() if node.proc.poll() is None else node.proc.returncode) in (0, 130), (
            node.output()
        )
