"""A restarted node finds its swarm: the run folder's known_peers.json (bounded, damage-tolerant), the
network settings a restart derives from it, and the join hint that carries what a joiner needs."""

from __future__ import annotations

import json
import socket
from types import SimpleNamespace

import pytest

from swarmnode.config import SwarmConfig
from swarmnode.identity import Identity
from swarmnode.join import KnownPeersWriter, join_command, rejoin_network
from swarmnode.run_folder import (
    KNOWN_PEERS_FILE,
    MAX_KNOWN_PEERS,
    MAX_KNOWN_PEERS_BYTES,
    KnownPeers,
    load_known_peers,
    save_known_peers,
)
from tests.helpers.swarm_procs import free_port


def _addr(i: int, port: int = 40000) -> str:
    return f"/ip4/127.0.0.1/tcp/{port + i}/p2p/{Identity.from_seed(bytes([i]) * 32).peer_id}"


def test_known_peers_round_trip_and_keep_at_most_the_cap(tmp_path):
    save_known_peers(tmp_path, KnownPeers(41000, tuple(_addr(i) for i in range(3 * MAX_KNOWN_PEERS))))
    known = load_known_peers(tmp_path)
    assert known is not None and known.port == 41000
    assert known.peers == tuple(_addr(i) for i in range(MAX_KNOWN_PEERS))
    assert load_known_peers(tmp_path / "nothing-here") is None


def test_the_writer_keeps_the_newest_peers_one_direct_address_each_and_writes_only_on_change(tmp_path):
    def card(i: int) -> SimpleNamespace:
        relay = f"/ip4/10.0.0.1/tcp/1/p2p/12D3KooWRelay/p2p-circuit{_addr(i)[-60:]}"
        return SimpleNamespace(addrs=(relay, _addr(i), _addr(i, port=50000)))

    writer = KnownPeersWriter(tmp_path, 41000)
    roster = {f"peer{i}": card(i) for i in range(MAX_KNOWN_PEERS + 5)}
    writer.update(roster)
    known = load_known_peers(tmp_path)
    assert known.peers == tuple(_addr(i) for i in range(5, MAX_KNOWN_PEERS + 5))
    (tmp_path / KNOWN_PEERS_FILE).unlink()
    writer.update(roster)  # nothing changed: not written again
    assert not (tmp_path / KNOWN_PEERS_FILE).exists()


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[1, 2, 3]",
        json.dumps({"port": "41000", "peers": []}),
        json.dumps({"port": 70000, "peers": []}),
        json.dumps({"peers": [_addr(1)]}),
        "[" * 50_000 + "]" * 50_000,  # nesting past the JSON parser's recursion limit
        " " * (MAX_KNOWN_PEERS_BYTES + 1) + "{}",  # larger than any file this version writes
    ],
    ids=["not-json", "a-list", "port-a-string", "port-out-of-range", "no-port", "deep", "huge"],
)
def test_a_damaged_known_peers_file_is_ignored_with_one_line(tmp_path, capsys, content):
    (tmp_path / KNOWN_PEERS_FILE).write_text(content)
    assert load_known_peers(tmp_path) is None
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "ignoring" in lines[0] and KNOWN_PEERS_FILE in lines[0]


def test_unusable_addresses_in_the_file_are_dropped(tmp_path):
    good = _addr(1)
    bad = [7, "", "no-slash/p2p/x", "/ip4/1.2.3.4/tcp/1", "/ip4/1.2.3.4/tcp/1/p2p/x y",
           "/" + "a" * 300 + "/p2p/x", "/ip4/1.2.3.4/tcp/1/p2p/R/p2p-circuit/p2p/T"]  # fmt: skip
    (tmp_path / KNOWN_PEERS_FILE).write_text(json.dumps({"port": None, "peers": [*bad, good]}))
    assert load_known_peers(tmp_path) == KnownPeers(None, (good,))


def test_a_restart_reuses_a_free_previous_port_and_dials_the_saved_peers():
    port = free_port()
    swarm, dial_saved = rejoin_network(SwarmConfig(), KnownPeers(port, (_addr(1),)))
    assert swarm.host_maddrs == [f"/ip4/127.0.0.1/tcp/{port}"]
    assert swarm.initial_peers == [_addr(1)] and dial_saved


def test_saved_addresses_hivemind_cannot_parse_are_not_dialed():
    swarm, dial_saved = rejoin_network(SwarmConfig(), KnownPeers(None, ("/nonsense/p2p/x", _addr(2))))
    assert swarm.initial_peers == [_addr(2)] and dial_saved
    swarm, dial_saved = rejoin_network(SwarmConfig(), KnownPeers(None, ("/nonsense/p2p/x",)))
    assert swarm.initial_peers == [] and not dial_saved


def test_a_taken_previous_port_gives_way_to_a_new_one(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        swarm, _ = rejoin_network(SwarmConfig(), KnownPeers(port, ()))
    assert swarm.host_maddrs == ["/ip4/127.0.0.1/tcp/0"]
    assert f"previous listen port {port} is taken" in capsys.readouterr().err


def test_explicit_peers_and_ports_win_over_the_saved_ones():
    port = free_port()
    given = SwarmConfig(initial_peers=[_addr(9)], host_maddrs=["/ip4/127.0.0.1/tcp/31999"])
    swarm, dial_saved = rejoin_network(given, KnownPeers(port, (_addr(1),)))
    assert swarm.initial_peers == [_addr(9)] and swarm.host_maddrs == ["/ip4/127.0.0.1/tcp/31999"]
    assert not dial_saved
    assert rejoin_network(SwarmConfig(), None) == (SwarmConfig(), False)


def test_the_join_hint_names_the_swarm_and_the_config_file():
    hint = join_command(_addr(1), "my-swarm", None)
    assert hint == f"swarmnode join --peers {_addr(1)} --set swarm.swarm_id=my-swarm"
    hint = join_command(_addr(1), "my-swarm", "configs/my node.yaml")
    assert hint.endswith("--config 'configs/my node.yaml' --set swarm.swarm_id=my-swarm")
