"""The dial-back check: request encoding, which ports and IPs, the verdict, and the asker's tries against
real libp2p peers on loopback."""

import asyncio
import time

import pytest

from swarmnode.swarm.net import reachability
from swarmnode.swarm.net.reachability import (
    ASK_RETRY_S,
    DIALBACK_STREAM,
    HOLDER_OFFER_FANOUT,
    MAX_PEERS_BEHIND_NAT,
    MAX_PORTS,
    DialbackServer,
    ask,
    encode_request,
    holder_offer_targets,
    note,
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
        ([b"\x00\x00", "peer2: gone"], "unreachable"),  # the peers that answered could not connect
        (["peer1: no such handler", "peer2: gone"], "unknown"),  # nobody could check (older peers, or gone)
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


def test_the_unknown_note_says_why_each_peer_gave_no_answer():
    line = note("unknown", ["Boot0001: no answer within 12 s", "Boot0002: P2PHandlerError"], [4001])
    assert "Boot0001: no answer within 12 s; Boot0002: P2PHandlerError" in line and "full DHT node" in line


async def _asker_and_peer():
    """Two libp2p hosts on loopback, the asker connected to the peer; and a TCP port the asker listens on
    (what the peer dials back)."""
    from hivemind.p2p import P2P

    peer = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    peer_addr = str((await peer.get_visible_maddrs())[0])
    asker = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=[peer_addr])
    listener = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    return asker, peer, listener


async def _shut(asker, peer, listener) -> None:
    listener.close()
    await asker.shutdown()
    await peer.shutdown()


def test_an_ask_that_fails_at_once_is_tried_again_until_the_peer_serves_the_check():
    """At start the peer may not serve the check yet (or the connection is still settling): a stream that
    fails at once is not the verdict "unknown" (which would keep a node behind NAT a full DHT server)."""

    async def run():
        asker, peer, listener = await _asker_and_peer()
        try:
            port = listener.sockets[0].getsockname()[1]
            asking = asyncio.create_task(ask(asker, peer.peer_id.to_base58(), [port]))
            await asyncio.sleep(ASK_RETRY_S / 2)  # the first try has failed: no handler yet
            await peer.add_binary_stream_handler(DIALBACK_STREAM, DialbackServer().handle)
            return await asking
        finally:
            await _shut(asker, peer, listener)

    assert asyncio.run(run()) == b"\x01"


def test_an_ask_ends_within_its_window_whatever_the_peer_does(monkeypatch):
    """The worst cases: a peer that takes the request and never answers, and one that never serves the
    check (every try fails at once). Either way the asker has a reason, not an answer, within the window."""
    monkeypatch.setattr(reachability, "ASK_WINDOW_S", 1.5)

    async def silent(_info, reader, _writer):
        await reader.read()  # holds the stream open, never answers

    async def run():
        asker, peer, listener = await _asker_and_peer()
        try:
            port = listener.sockets[0].getsockname()[1]
            peer_id = peer.peer_id.to_base58()
            started = time.monotonic()
            no_handler = await ask(asker, peer_id, [port])
            no_handler_s = time.monotonic() - started
            await peer.add_binary_stream_handler(DIALBACK_STREAM, silent)
            started = time.monotonic()
            never = await ask(asker, peer_id, [port])
            return no_handler, no_handler_s, never, time.monotonic() - started
        finally:
            await _shut(asker, peer, listener)

    no_handler, no_handler_s, never, never_s = asyncio.run(run())
    assert isinstance(no_handler, str) and peer_tail(no_handler)
    assert ASK_RETRY_S <= no_handler_s < 1.5 + 0.5  # tried again, and given up within the window
    assert isinstance(never, str) and "no answer within 1.5 s" in never
    assert never_s < 1.5 + 0.5


def peer_tail(reason: str) -> bool:
    """A reason names the peer by the tail of its id."""
    return len(reason.split(": ", 1)[0]) == 8
