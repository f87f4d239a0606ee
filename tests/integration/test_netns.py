"""A small multi-host network on one machine (Linux network namespaces): a bootstrap and two tiny-model
nodes on separate "hosts", one of them behind a firewall that drops every inbound TCP connection.

The nodes know only the bootstrap's address; they find each other through it and train on each other's
rollouts. The firewalled node finds out at start that peers cannot reach it, switches to client mode and
says so; its peer still pulls its rollouts (over the connections the firewalled node opened).
"""

from __future__ import annotations

import pytest

from benchmarks.harness.processes import start_bootstrap, start_node
from tests.helpers import netns

REASON = netns.unavailable_reason(nft=True)
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

SWARM = "it-netns"
BOOT_PORT = 31337


def _node_args(rounds: int) -> list[str]:
    return [
        "--config", "node_configs/local-swarm.yaml",
        "--rounds", str(rounds),
        "--set", f"swarm.swarm_id={SWARM}",
        "--set", 'swarm.host_maddrs=["/ip4/0.0.0.0/tcp/0"]',
        "--set", "swarm.min_peers=1",
        "--set", "swarm.wait_for_peers_s=90",
        "--set", "swarm.share_deadline_s=8",
        "--set", "run.checkpoint_every=10",
    ]  # fmt: skip


def test_network_helpers_clean_up_even_when_the_test_fails():
    with pytest.raises(RuntimeError, match="boom"), netns.make_network(["x", "y"]) as net:
        assert net["y"].run("ip", "-4", "-o", "addr", "show", "eth0").count(net["y"].ip) == 1
        net["x"].drop_inbound_tcp()
        raise RuntimeError("boom")
    assert not [ns for ns in netns.leftover_namespaces() if ns.startswith(net.switch.rsplit("-", 1)[0])]


def test_nodes_meet_through_a_bootstrap_and_a_firewalled_node_takes_part(tmp_path):
    procs = []
    try:
        with netns.make_network(["boot", "a", "c"]) as net:
            boot_host = net["boot"]
            boot = start_bootstrap(tmp_path / "boot", "--port", str(BOOT_PORT), prefix=boot_host.exec_args())
            procs.append(boot)
            boot_addr = boot.address(f"/ip4/{net['boot'].ip}/tcp/{BOOT_PORT}/p2p/", 60)

            net["c"].drop_inbound_tcp()
            a = start_node(tmp_path / "a", *_node_args(3), peers=[boot_addr], prefix=net["a"].exec_args())
            c = start_node(tmp_path / "c", *_node_args(3), peers=[boot_addr], prefix=net["c"].exec_args())
            procs += [a, c]
            for node in (a, c):
                assert node.wait(timeout_s=300) == 0, node.output()

            assert "peers can open connections" in a.wait_for_line("reachability:", 1)
            c_line = c.wait_for_line("reachability:", 1)
            assert "client mode" in c_line and "--announce" in c_line, c_line
            assert net["c"].dropped_syns() >= 1  # the dial-back (at least) really was refused
            statuses = {name: node.status() for name, node in (("a", a), ("c", c))}
            # each knows the other only through the bootstrap, and trained on the other's groups
            assert set(statuses["a"]["peers"]) == {statuses["c"]["peer_id"]}
            assert set(statuses["c"]["peers"]) == {statuses["a"]["peer_id"]}
            for name, node in (("a", a), ("c", c)):
                status = statuses[name]
                assert status["rejected"] == {}, status
                assert status["rollouts"]["groups_trained"] >= 1, node.output()
                assert sum(r["groups_peer"] for r in node.metrics()) >= 1
    finally:
        for proc in procs:
            proc.stop()
    assert not [ns for ns in netns.leftover_namespaces() if ns.startswith(net.switch.rsplit("-", 1)[0])]
