"""The dial-back check's pure parts: request encoding, which ports and IPs, the verdict."""

import pytest

from swarmnode.swarm.reachability import MAX_PORTS, encode_request, observed_ip, tcp_ports, verdict


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
