"""`swarmnode bootstrap`, joining by the public-demo config, and the start-up errors users can fix.

Everything runs on 127.0.0.1 with real processes and real hivemind DHTs: a local stand-in bootstrap
replaces the public list exactly as docs/operators.md describes (``--peers`` overrides
``swarm.initial_peers``); the nodes use the tiny model so that a round takes seconds.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.harness.processes import CLOCK_JUMP, REPO, start_bootstrap, start_node
from swarmnode.config import SwarmConfig
from swarmnode.errors import TransportError
from swarmnode.identity import Identity
from swarmnode.swarm.exchange.compat import roster_extra
from swarmnode.swarm.net.transport import Transport
from swarmnode.swarm.wire import dht_rules
from tests.helpers.swarm_procs import alive, free_port

PUBLIC_DEMO = "node_configs/public-demo.yaml"
# the public-demo config itself, made fast: the tiny model and its easy tasks, short rounds
FAST = [
    "--set", "model.name=tiny",
    "--set", "tasks.mix={propositional_logic: {weight: 3}, basic_arithmetic: {}}",
    "--set", "sampling.questions_per_round=4",
    "--set", "sampling.completions_per_question=4",
    "--set", "sampling.max_new_tokens=16",
    "--set", "train.lr=1e-3",
    "--set", "swarm.share_deadline_s=8",
    "--set", "swarm.wait_for_peers_s=90",
    "--set", "run.cpu_threads=1",
    # minting the demo's 26 bits takes an exponentially distributed time (mean ~35 s on one core here,
    # longer than 120 s one start in 30); test_identity covers minting, these tests the joining
    "--set", "swarm.identity_work_bits=16",
]  # fmt: skip


def _identity(path: Path) -> str:
    identity = Identity.generate()
    identity.save(path)
    return identity.peer_id


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def _peak_metrics(url: str, nodes: list, names: tuple[str, ...], timeout_s: float = 300) -> dict[str, float]:
    """The highest value of each gauge, scraped every 0.2 s until all are >= 1 or every node has exited."""
    peak = dict.fromkeys(names, 0.0)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and min(peak.values()) < 1:
        text = _scrape(url)
        peak = {name: max(peak[name], _metric(text, name, missing=0.0)) for name in names}
        if all(node.proc.poll() is not None for node in nodes):
            break
        time.sleep(0.2)
    return peak


def _children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _metric(text: str, name: str, missing: float | None = None) -> float:
    """The gauge's value; ``missing`` where it is not exported yet (None: that is an error)."""
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
    if not values and missing is None:
        raise AssertionError(f"{name} is not in the scrape:\n{text}")
    return values[0] if values else missing


def test_public_demo_config_joins_through_a_stand_in_bootstrap(tmp_path):
    port = free_port()
    procs = []
    try:
        boot = start_bootstrap(tmp_path / "boot", "--port", str(port), "--set", "bootstrap.report_every_s=1")
        procs.append(boot)
        address = boot.address(f"/ip4/127.0.0.1/tcp/{port}/p2p/", 60)
        metrics_url = boot.wait_for_line("metrics at ", 5).split("metrics at ", 1)[1].split()[0]
        nodes = [
            start_node(tmp_path / name, "--config", PUBLIC_DEMO, "--rounds", "2", *FAST, peers=[address])
            for name in ("a", "b")
        ]
        procs += nodes
        # read while the nodes run: the bootstrap drops peers from its table once they have left
        # (connections to a bootstrap can be brief: after the first lookups nodes talk to each other)
        gauges = (
            "swarmnode_dht_routing_table_peers",
            "swarmnode_dht_stored_records",
            "swarmnode_peers_connected",
        )
        seen = _peak_metrics(metrics_url, nodes, gauges)
        assert seen["swarmnode_dht_routing_table_peers"] >= 1, (
            seen,
            nodes[0].output(),
        )  # the nodes were in its table
        assert seen["swarmnode_dht_stored_records"] >= 1, (
            seen,
            nodes[0].output(),
        )  # rosters and announcements
        for node in nodes:
            assert node.wait(timeout_s=300) == 0, node.output()
            assert "swarm swarmnode-public-demo" in node.wait_for_line("swarm swarmnode-public-demo", 1)
            assert "peers can open connections" in node.wait_for_line("reachability:", 1)
            status = node.status()
            assert len(status["peers"]) == 1 and status["rejected"] == {}, status
            # the peer's batches arrived and passed verification (training on them needs nonzero
            # advantages, which a random tiny model does not always produce in two rounds)
            assert status["rollouts"]["batches_received"] >= 1, node.output()
            assert status["rollouts"]["groups_accepted"] >= 1, node.output()

        assert "swarmnode_bootstrap_info{" in _scrape(metrics_url)
        assert seen["swarmnode_peers_connected"] >= 1, seen  # it saw the nodes connected
        status_lines = [line for line in boot.lines if line.startswith("peers connected ")]
        assert any(", routing table 0," not in line for line in status_lines), boot.output()  # and says so

        children = _children(boot.proc.pid)  # its DHT process (which owns p2pd)
        assert children, "the bootstrap runs its DHT in a child process"
        os.kill(boot.proc.pid, signal.SIGTERM)  # clean shutdown on SIGTERM (systemd, docker stop)
        assert boot.wait(timeout_s=30) == 0, boot.output()
        assert any("stopping the bootstrap node" in line for line in boot.lines)
        deadline = time.monotonic() + 15
        while [pid for pid in children if alive(pid)] and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not [pid for pid in children if alive(pid)], "the DHT process outlived the bootstrap"

        again = start_bootstrap(tmp_path / "boot", "--port", str(port))  # same key file, same port
        procs.append(again)
        assert again.wait_for_line(address, 60)  # the address in everyone's config is still valid
    finally:
        for proc in procs:
            proc.stop()


def test_join_without_any_bootstrap_in_the_public_config_says_what_to_pass(tmp_path):
    node = start_node(tmp_path / "a", "--config", PUBLIC_DEMO, *FAST)
    assert node.wait(timeout_s=60) == 2
    assert "swarm.initial_peers is empty" in node.output() and "--peers MULTIADDR" in node.output()


def test_no_bootstrap_answering_names_every_address_tried(tmp_path):
    silent = [f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/{_identity(tmp_path / f'{i}.key')}" for i in range(2)]
    node = start_node(tmp_path / "a", "--config", PUBLIC_DEMO, *FAST, peers=silent)
    assert node.wait(timeout_s=120) == 2, node.output()
    error = next(line for line in node.lines if line.startswith("error:"))
    assert "none of the initial peers answered" in error
    assert all(addr in error for addr in silent)
    assert "firewall" in error


def test_port_taken_is_reported_before_the_daemon_starts(tmp_path):
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        boot = start_bootstrap(tmp_path / "boot", "--port", str(port))
        assert boot.wait(timeout_s=60) == 2, boot.output()
    error = next(line for line in boot.lines if line.startswith("error:"))
    assert f"TCP port {port}" in error and "already in use" in error and "ss -ltnp" in error


def test_a_second_bootstrap_on_the_same_port_is_refused(tmp_path):
    """p2pd binds with SO_REUSEPORT: without our check the second daemon would share the port silently."""
    port = free_port()
    first = start_bootstrap(tmp_path / "one", "--port", str(port))
    try:
        first.wait_for_line("bootstrap node up", 60)
        second = start_bootstrap(tmp_path / "two", "--port", str(port))
        assert second.wait(timeout_s=60) == 2, second.output()
        assert "already in use" in second.output()
    finally:
        first.stop()


def test_daemon_that_cannot_start_says_why(tmp_path):
    key = tmp_path / "a.key"
    _identity(key)
    transport = Transport(key, SwarmConfig(host_maddrs=["/ip4/192.0.2.77/tcp/0"]))  # not this machine's
    try:
        transport.start()
        raise AssertionError("started on an address this machine does not have")
    except TransportError as exc:
        assert exc.reason == "startup"
        assert "p2pd" in str(exc) and "cannot assign requested address" in str(exc)  # the daemon's own why
        assert "host_maddrs" in str(exc)
    finally:
        transport.shutdown()


def test_clock_far_off_the_peers_is_named_with_the_offset_and_the_fix(tmp_path):
    key = tmp_path / "boot.key"
    _identity(key)
    with Transport(key, SwarmConfig()) as boot:
        address = boot.start()[0]
        with ThreadPoolExecutor(2) as pool:  # side by side: each start waits seconds on its DHT and shutdown
            control, skewed = pool.map(lambda s: _start_with_clock_offset(tmp_path, s, address), (0, 30))
    assert control.startswith("STARTED"), control  # the same start with a right clock joins fine
    assert skewed.startswith("ERROR clock_skew"), skewed
    assert "ahead of" in skewed and "3 s" in skewed and "timedatectl set-ntp true" in skewed
    offset = float(skewed.split("clock is ", 1)[1].split(" s ")[0])
    assert 29 <= offset <= 31


def _start_with_clock_offset(tmp_path: Path, seconds: int, initial_peer: str) -> str:
    """``swarmnode join --rounds 0`` in a process whose clock is off by ``seconds`` (``_clock_jump.py``):
    "STARTED" if it joined and exited cleanly, else "ERROR <its one-line message>"."""
    offset_file = tmp_path / f"offset{seconds}"
    offset_file.write_text(str(seconds))
    done = subprocess.run(
        [sys.executable, str(CLOCK_JUMP), str(offset_file),
         sys.executable, "-m", "swarmnode.cli", "join", "--config", "node_configs/tiny.yaml",
         "--run-dir", str(tmp_path / f"clock{seconds}"), "--rounds", "0", "--set", "run.metrics_port=null",
         "--peers", initial_peer],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if done.returncode == 0:
        return "STARTED"
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    return "ERROR " + errors[-1].removeprefix("error: ") if errors else done.stderr[-2000:]


def test_foreign_and_newer_protocol_peers_are_ignored_with_one_line(tmp_path, capsys):
    """Roster cards of another protocol version under our swarm's key in a real DHT: the node skips them
    and says so once per peer; a card of another swarm is not even stored there; compatible peers are
    unaffected."""
    from types import SimpleNamespace

    from swarmnode.config import NodeConfig
    from swarmnode.swarm.exchange.swarm import Swarm
    from swarmnode.swarm.wire import codec, protocol, work
    from swarmnode.tasks import TaskBank

    keys = {name: tmp_path / f"{name}.key" for name in ("node", "foreign", "newer", "honest")}
    ids = {name: Identity.generate() for name in keys}
    for name, identity in ids.items():
        identity.save(keys[name])
    cfg = NodeConfig.model_validate({"swarm": {"swarm_id": "ours"}})
    policy = SimpleNamespace(name="tiny-llama", tokenizer_fingerprint="ab" * 32, tokenizer=range(512))
    bank = TaskBank(cfg.tasks, default_seed=0)
    bits = cfg.swarm.identity_work_bits
    nonces = {name: work.mint(identity.public_key, bits) for name, identity in ids.items()}
    node = Swarm(
        cfg, identity=ids["node"], bank=bank, policy=policy, identity_path=keys["node"], run_dir=tmp_path,
        work_nonce=nonces["node"],
    )  # fmt: skip
    address = node.start()[0]
    writer = Transport(keys["honest"], SwarmConfig(initial_peers=[address]))
    try:
        writer.start()
        for name, swarm_id, version in (
            ("foreign", "theirs", 1),
            ("newer", "ours", 2),
            ("honest", "ours", 1),
        ):
            card = protocol.RosterCard(
                peer_id=ids[name].peer_id, swarm_id=swarm_id, model_name="m", tokenizer_fingerprint="ab",
                policy_version=0, round=0, addrs=(), timestamp=time.time(), seq=1, protocol_version=version,
                extra=roster_extra(bank.fingerprint), work_nonce=nonces[name],
            )  # fmt: skip
            record = codec.encode_message(ids[name], swarm_id, card)
            stored = writer.records.put(
                dht_rules.roster_key("ours", ids[name].peer_id), ids[name].peer_id, record, 60
            )
            # a card of another swarm names another key: the storing nodes' validators refuse it
            assert stored == (swarm_id == "ours")
        assert node.service.refresh_roster() == {ids["honest"].peer_id}
        assert node.service.refresh_roster() == {ids["honest"].peer_id}  # asked again: no new lines
    finally:
        writer.shutdown()
        node.shutdown()
    lines = [line for line in capsys.readouterr().err.splitlines() if "ignoring peer" in line]
    assert len(lines) == 1, lines
    assert any("protocol v2" in line and ids["newer"].peer_id[:16] in line for line in lines)
