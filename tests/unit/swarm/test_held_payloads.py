"""Peers' batches a node holds and serves on (any holder serves a batch) are bounded and never push out
the node's own latest batch."""

from __future__ import annotations

from swarmnode.swarm.net import payloads
from swarmnode.swarm.net.payloads import PayloadServer


def _server(capacity: int) -> PayloadServer:
    return PayloadServer(
        payload_capacity=capacity,
        max_streams_per_peer=4,
        max_streams=64,
        request_timeout_s=1,
        serve_timeout_s=1,
    )


def _held(server: PayloadServer) -> set[bytes]:
    return set(server._held)


def test_held_payloads_never_evict_our_own_latest_batch():
    server = _server(capacity=3)
    server.offer(b"\x00" * 32, b"own old")
    server.offer(b"\x01" * 32, b"own latest")
    for i in range(10):
        server.offer(bytes([0x10 + i]) * 32, b"held", held=True)
    assert server.local_payload(b"\x01" * 32, 100) == b"own latest"
    assert len(server._payloads) == 3 and len(_held(server)) == 2


def test_held_payloads_stay_under_their_byte_bound(monkeypatch):
    monkeypatch.setattr(payloads, "MAX_HELD_PAYLOAD_BYTES", 10)
    server = _server(capacity=64)
    server.offer(b"\x01" * 32, b"own" * 10)
    for i in range(5):
        server.offer(bytes([0x10 + i]) * 32, b"four", held=True)
    assert sum(server._held.values()) <= 10 and len(_held(server)) == 2
    assert server.local_payload(b"\x01" * 32, 100) == b"own" * 10


def test_a_held_offer_of_our_own_digest_keeps_it_ours():
    server = _server(capacity=2)
    server.offer(b"\x01" * 32, b"own")
    server.offer(b"\x01" * 32, b"own", held=True)
    server.offer(b"\x02" * 32, b"held", held=True)
    server.offer(b"\x03" * 32, b"held", held=True)
    assert server.local_payload(b"\x01" * 32, 100) == b"own"
