"""The dial-back check's pure parts: request encoding, which ports and IPs, the verdict."""

import pytest

from swarmnode.swarm.net.reachability import (
    HOLDER_OFFER_FANOUT,
    MAX_PEERS_BEHIND_NAT,
    MAX_PORTS,
    DialbackServer,
    encode_request,
    holder_offer_targets,
    observed_ip,
    tcp_ports,
    verdict,
)


def test_request_is_a_count_then_big_endian_ports():
    assert encode_request([31337, 1]) == bytes([2]) + (31337).to_bytes(2, "big") + (1).to_bytes(2, "big")
    for bad in ([], [0], [65536], list(range(1, MAX_PORTS + 2))):
        with pytest.raises(ValueError):
            encode_request(bad)


def test_tcp_ports_skip_relays_port_zero_and_repeats():
    maddrs = [
        "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWA",
        "/ip4/10.0.0.5/tcp/4001/p2p/12D3KooWA",
        "/ip4/10.0.0.5/tcp/4002",
        "/ip4/1.2.3.4/tcp/31337/p2p/12D3KooWR/p2p-circuit/p2p/12D3KooWA",
        "/ip4/0.0.0.0/tcp/0",
        "/ip4/10.0.0.5/udp/4001/quic",
    ]
    assert tcp_ports(maddrs) == [4001, 4002]


def test_observed_ip_only_for_direct_ip_addresses():
    assert observed_ip("/ip4/10.77.0.3/tcp/40141") == "10.77.0.3"
    assert observed_ip("/ip6/::1/tcp/1") == "::1"
    assert observed_ip("/ip4/1.2.3.4/tcp/1/p2p/12D3KooWR/p2p-circuit") is None
    assert observed_ip("/dns4/example.org/tcp/1") is None
    assert observed_ip("/ip4/not-an-ip/tcp/1") is None


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        ([b"\x00", b"\x01"], "reachable"),  # one peer got through: the port is open
        ([b"\x00\x00", None], "unreachable"),  # the peers that answered could not connect
        ([None, None], "unknown"),  # nobody could check (older peers, or gone)
        ([], "unknown"),
        ([b""], "unknown"),
    ],
)
def test_verdict(answers, expected):
    assert verdict(answers) == expected


def test_the_dialback_server_remembers_peers_it_could_not_reach_within_its_bound():
    server = DialbackServer()
    flood = [f"12D3KooWPeer{i}" for i in range(2 * MAX_PEERS_BEHIND_NAT)]  # one peer id per request
    for peer in flood:
        server._remember(peer, [False, False])
    assert len(server.behind_nat) == MAX_PEERS_BEHIND_NAT
    assert flood[-1] in server.behind_nat and flood[0] not in server.behind_nat  # the oldest went first
    server._remember(flood[-1], [False, True])  # reachable on one port after all: not behind NAT
    assert flood[-1] not in server.behind_nat


def test_a_holder_offers_a_batch_to_at_most_the_fanout_of_live_nat_peers_other_than_author_and_server():
    nat = {f"nat{i}" for i in range(3 * HOLDER_OFFER_FANOUT)} | {"author", "served_by", "gone"}
    live = nat - {"gone"}
    targets = holder_offer_targets(nat, live, {"author", "served_by"})
    assert len(targets) == HOLDER_OFFER_FANOUT == len(set(targets))
    assert not {"author", "served_by", "gone"} & set(targets) and set(targets) <= live
    assert holder_offer_targets({"nat0"}, {"nat0"}, set()) == ["nat0"]
    assert holder_offer_targets(set(), live, set()) == []
