"""Origins: the network of a stream's remote address, and the bounded memory of peer ids per origin."""

from __future__ import annotations

from swarmnode.config import SwarmConfig
from swarmnode.swarm.net.origins import ORIGIN_MEMORY_S, OriginCaps, origin_of


def test_an_origin_is_the_ipv4_slash_24_or_ipv6_slash_48_of_the_remote_address():
    assert origin_of("/ip4/203.0.113.7/tcp/4001") == "203.0.113.0/24"
    assert origin_of("/ip4/203.0.113.250/udp/4001/quic") == "203.0.113.0/24"
    assert origin_of("/ip6/2001:db8:1:2:3::9/tcp/4001") == "2001:db8:1::/48"
    assert origin_of("/ip6/::ffff:198.51.100.9/tcp/1") == "198.51.100.0/24"  # IPv4-mapped: its IPv4 /24


def test_loopback_is_exempt_unless_configured_and_relayed_or_unknown_addresses_have_no_origin():
    assert origin_of("/ip4/127.0.0.1/tcp/5") is None and origin_of("/ip6/::1/tcp/5") is None
    assert origin_of("/ip4/127.0.0.1/tcp/5", exempt_loopback=False) == "127.0.0.0/24"
    assert origin_of("/ip6/::1/tcp/5", exempt_loopback=False) == "::/48"
    for addr in ("/ip4/203.0.113.7/tcp/4001/p2p/12D3KooWrelay/p2p-circuit", "/dns4/example.org/tcp/1",
                 "", "/ip4/not-an-ip/tcp/1", "garbage"):  # fmt: skip
        assert origin_of(addr) is None, addr


def test_an_origin_admits_at_most_its_cap_of_distinct_ids_and_forgets_them_after_its_memory():
    caps = OriginCaps(3)
    assert all(caps.admit("203.0.113.0/24", f"peer-{i}", now=0.0) for i in range(3))
    assert not caps.admit("203.0.113.0/24", "peer-3", now=1.0)  # a fourth id from the same network
    assert caps.admit("203.0.113.0/24", "peer-0", now=2.0)  # one already admitted, seen again
    assert caps.admit("198.51.100.0/24", "peer-3", now=2.0)  # another network
    assert caps.admit(None, "peer-4", now=2.0)  # no origin: not capped
    assert caps.admit("203.0.113.0/24", "peer-3", now=1.0 + ORIGIN_MEMORY_S + 0.5)  # 1, 2 forgotten


def test_the_memory_is_bounded_whatever_the_number_of_origins():
    caps = OriginCaps(2, max_origins=64)
    for i in range(10_000):
        caps.admit(f"10.{i // 256 % 256}.{i % 256}.0/24", f"peer-{i}", now=float(i))
    assert len(caps._ids) == 64 and all(len(ids) <= 2 for ids in caps._ids.values())


def test_the_caps_come_from_the_swarm_config():
    caps = OriginCaps.from_config(SwarmConfig(identities_per_origin=5, origin_cap_exempt_loopback=False))
    assert caps.per_origin == 5 and caps.origin("/ip4/127.0.0.1/tcp/1") == "127.0.0.0/24"
    default = OriginCaps.from_config(SwarmConfig())
    assert default.per_origin == 16 and default.origin("/ip4/127.0.0.1/tcp/1") is None
