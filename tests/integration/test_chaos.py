"""Chaos, short version (the long one: benchmarks/chaos.py, figures in docs/reliability.md).

A swarm of three tiny nodes joined through a bootstrap: one node's clock jumps 20 s mid-run and back, one
node's disk fills up (a real tmpfs) for two of its rounds, one node is SIGKILLed mid-round and its newest
checkpoint corrupted before it restarts. No node crashes or waits past its deadline, the restarted node
resumes from its newest valid checkpoint and says which one it skipped, no round is lost. Then links
between network namespaces are cut and restored, and a host drops inbound connections (nft). Needs root
(mount, ip netns) and nftables; skipped otherwise.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest

from benchmarks.harness.processes import NodeProc, start_bootstrap, start_node, stop_all
from benchmarks.reliability.chaos import SLACK_S, run_chaos
from swarmnode import checkpoint
from tests.helpers import netns
from tests.helpers.checkpoints import save, trained

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


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


@needs_root
def test_a_checkpoint_that_does_not_fit_fails_cleanly(small_disk):
    model, optimizer = trained()
    first = save(small_disk, 1, model, optimizer)
    with pytest.raises(OSError, match="(?i)no space left|writing checkpoint round 2 failed"):
        save(small_disk, 2, model, optimizer)
    assert [p.name for p in small_disk.iterdir()] == [first.name]  # no half-written folder left behind
    assert checkpoint.newest_valid(small_disk).round == 1


@needs_root
def test_swarm_survives_kill_corruption_full_disk_and_clock_jump(tmp_path):
    # 8 rounds: the kill must find a node between its 2nd and next-to-last round after the clock jump and
    # the full disk (up to two checkpoint periods); with 6, tiny rounds sometimes ran past that window
    report = run_chaos(
        tmp_path, nodes=3, rounds=8, kills=1, deadline_s=5.0, checkpoint_every=2, clock_jump_s=20.0,
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


@pytest.mark.slow
@needs_root
def test_eight_node_chaos(tmp_path):
    """The long chaos run of docs/reliability.md (about 20 min on 2 cores): ``pytest -m slow``."""
    report = run_chaos(
        tmp_path, nodes=8, rounds=16, kills=4, deadline_s=6.0, checkpoint_every=2, clock_jump_s=20.0,
        disk_full=True, seed=0, time_limit_s=2400,
    )  # fmt: skip
    assert report["problems"] == [], json.dumps(report, indent=1)


# --- network faults between hosts (network namespaces, tests/helpers/netns.py) ---------------------

NETNS_REASON = netns.unavailable_reason(nft=True)
NET_DEADLINE_S = 6.0
# A bound only: the nodes run until c has exchanged again after its cut, then are stopped (SIGINT). c's link
# is down for two of its rounds (~12 s): TCP's retransmission backoff can then leave its connections silent
# for ~13 s more after the link is back, and rounds without a peer to wait for take a fraction of a second.
NET_ROUNDS = 1000
RESUME_LIMIT_S = 180.0  # c exchanges again within this of its link coming back


def _net_args() -> list[str]:
    return [
        "--config", "node_configs/local-swarm.yaml",
        "--rounds", str(NET_ROUNDS),
        "--set", "swarm.swarm_id=it-chaos-net",
        "--set", 'swarm.host_maddrs=["/ip4/0.0.0.0/tcp/0"]',
        "--set", "swarm.min_peers=2",
        "--set", "swarm.wait_for_peers_s=120",
        "--set", f"swarm.share_deadline_s={NET_DEADLINE_S}",
        "--set", "run.checkpoint_every=4",
    ]  # fmt: skip


ROUND_DONE = re.compile(r"^round\s+\d+\s+reward ")  # a round's closing line, not its "round N: ..." phases


def _rounds(node: NodeProc) -> int:
    """Rounds the node has finished, from its output."""
    return sum(1 for line in node.lines if ROUND_DONE.match(line))


def _until(node: NodeProc, rounds: int, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _rounds(node) < rounds and node.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _rounds(node) >= rounds, f"{node.run_dir.name}: no round {rounds}:\n{node.output()}"


def _accepted(node: NodeProc) -> int:
    """Peer groups the node has accepted, as of its last round (status.json is rewritten every round)."""
    return node.status()["rollouts"]["groups_accepted"]


@pytest.mark.slow  # 41 s of the default suite's 15 minutes (netns firewalls: test_netns*.py): pytest -m slow
@pytest.mark.skipif(NETNS_REASON is not None, reason=NETNS_REASON or "")
def test_a_cut_link_and_a_firewall_stall_nobody_and_exchange_resumes(tmp_path):
    """Three hosts and a bootstrap on a bridge. Host c's cable is pulled for two of its rounds and
    plugged back; then host b drops every new inbound TCP connection for a round. Every node finishes
    every round until it is stopped, none waits past its deadline, and c accepts peer groups again once
    reconnected."""
    procs: list[NodeProc] = []
    events = {}
    try:
        with netns.make_network(["boot", "a", "b", "c"], net=78) as net:
            boot = start_bootstrap(tmp_path / "boot", "--port", "31337", prefix=net["boot"].exec_args())
            procs.append(boot)
            peers = [boot.address(f"/ip4/{net['boot'].ip}/tcp/31337/p2p/", 240)]
            nodes = {
                name: start_node(tmp_path / name, *_net_args(), peers=peers, prefix=net[name].exec_args())
                for name in ("a", "b", "c")
            }
            procs += nodes.values()
            for node in nodes.values():
                _until(node, 2)
            net["c"].link_down()
            cut_at = _rounds(nodes["c"])
            _until(nodes["c"], cut_at + 2)
            net["c"].link_up()
            events["c_restored_after_round"] = _rounds(nodes["c"])
            events["c_accepted_before_restore"] = _accepted(nodes["c"])
            _until(nodes["b"], _rounds(nodes["b"]) + 1)
            net["b"].drop_inbound_tcp()
            _until(nodes["b"], _rounds(nodes["b"]) + 1)
            events["b_dropped_syns"] = net["b"].dropped_syns()
            net["b"].allow_inbound_tcp()
            # c exchanges again after its link came back: it accepts peer groups it did not have before
            deadline = time.monotonic() + RESUME_LIMIT_S
            while _accepted(nodes["c"]) <= events["c_accepted_before_restore"]:
                assert time.monotonic() < deadline, (events, nodes["c"].output())
                assert all(node.proc.poll() is None for node in nodes.values()), events
                time.sleep(0.5)
            events["c_accepted_after_restore"] = _accepted(nodes["c"])
            stop_all(list(nodes.values()))
            for node in nodes.values():  # each stopped cleanly by the signal, after a finished round
                assert node.proc.returncode == 130, node.output()
    finally:
        for proc in procs:
            proc.stop()

    shares: dict[str, list[float]] = {}
    c_peer_groups = [r["groups_peer"] for r in nodes["c"].metrics()]
    for name, node in nodes.items():
        records = node.metrics()
        # every round from the first to the one it stopped after, each logged once
        assert [r["round"] for r in records] == list(range(1, len(records) + 1)), node.output()
        shares[name] = [round(r["seconds_share"], 1) for r in records]
        assert max(shares[name]) <= NET_DEADLINE_S + SLACK_S, (name, shares[name], node.output())
        assert node.status()["rejected"] == {}, node.status()
    print(
        f"\nnetwork chaos: {json.dumps(events)}; rounds {json.dumps({k: len(v) for k, v in shares.items()})}"
        f", longest seconds_share {json.dumps({k: max(v) for k, v in shares.items()})}; "
        f"c's peer groups per round {c_peer_groups}"
    )
