"""PayloadServer's slot policy, without a network: half the slots are kept for peers in good standing,
and a stream that finds its share full evicts the oldest stream of that share still waiting for its
request (never one already being served)."""

from __future__ import annotations

from swarmnode.swarm.net.payloads import RESERVED_SLOT_SHARE, PayloadServer


class FakeWriter:
    closed = False

    def close(self) -> None:
        self.closed = True


def _server(good: set[str]) -> PayloadServer:
    server = PayloadServer(
        payload_capacity=4, max_streams_per_peer=4, max_streams=64, request_timeout_s=0.75, serve_timeout_s=30
    )
    server.set_peer_standing(lambda peer: peer in good)
    return server


def _fill_with_sybils(server: PayloadServer) -> list:
    slots = []
    for i in range(16):  # 16 Sybil ids x 4 streams, as many as the per-peer cap lets each open
        for _ in range(4):
            slot = server._take_slot(f"sybil-{i}", FakeWriter())
            if slot is not None:
                slots.append(slot)
    return slots


def test_sybils_get_only_the_open_share_and_a_known_peer_still_gets_a_slot():
    server = _server(good={"known"})
    sybil_slots = _fill_with_sybils(server)
    assert server._active_total == server.open_slots == 64 - int(64 * RESERVED_SLOT_SHARE)
    assert server.stats["evicted"] == len(sybil_slots) - server.open_slots  # late Sybils evicted early ones
    assert server._take_slot("known", FakeWriter()) is not None
    assert server.stats["evicted"] == len(sybil_slots) - server.open_slots  # from the reserved share


def test_a_newcomer_evicts_the_oldest_idle_stream_but_never_one_being_served():
    server = _server(good=set())
    slots = _fill_with_sybils(server)
    live = [s for s in slots if not s.released]
    oldest = live[0]
    newcomer = server._take_slot("newcomer", FakeWriter())
    assert newcomer is not None and oldest.released and oldest.writer.closed
    for slot in [s for s in slots if not s.released]:  # every Sybil stream now sent its request
        server._idle.pop(slot, None)
        slot.idle = False
    server._idle.pop(newcomer, None)
    assert server._take_slot("late", FakeWriter()) is None  # nothing idle to evict: refused


def test_released_slots_are_counted_once():
    server = _server(good=set())
    slot = server._take_slot("p", FakeWriter())
    server._release(slot)
    server._release(slot)
    assert server._active_total == 0 and server._active == {} and server._active_open == 0
