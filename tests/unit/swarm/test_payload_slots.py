"""PayloadServer's slot policy, without a network: half the slots are kept for peers in good standing,
a stream that finds its share full evicts the oldest stream of that share still waiting for its request,
else the oldest stalled one (asked, and reads slower than SERVE_MIN_BYTES_PER_S) of a peer holding more
streams than it would (never one whose reader keeps up); one origin holds a bounded part of the open
share."""

from __future__ import annotations

import hashlib
import time

from swarmnode.swarm.net.payloads import (
    MAX_OPEN_STREAMS_PER_ORIGIN,
    RESERVED_SLOT_SHARE,
    SERVE_BASE_S,
    SERVE_MAX_S,
    SERVE_MIN_BYTES_PER_S,
    PayloadServer,
)
from swarmnode.swarm.wire.limits import MAX_FRAME_BYTES


class FakeWriter:
    """A stream's writer: closed (flushing) or aborted (``transport.abort``, as evictions do)."""

    closed = False

    def __init__(self) -> None:
        self.transport = self

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
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
    assert server.counts().evicted == len(sybil_slots) - server.open_slots  # late Sybils evicted early ones
    assert server._take_slot("known", FakeWriter()) is not None
    assert server.counts().evicted == len(sybil_slots) - server.open_slots  # from the reserved share


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


def _stall(slot, answered_s_ago: float, sent: int = 0) -> None:
    """``slot`` sent its request ``answered_s_ago`` seconds ago and its reader took ``sent`` bytes since."""
    assert not slot.released
    slot.idle = False
    slot.answered_at = time.monotonic() - answered_s_ago
    slot.sent = sent


def _answering(server: PayloadServer, slots: list) -> None:
    for slot in slots:
        server._idle.pop(slot, None)
        server._answering[slot.writer] = slot


def _open_share_full_of_readers(server: PayloadServer) -> list:
    """8 Sybils x 4 streams: the whole open share, every stream past its request (being answered)."""
    slots = [server._take_slot(f"sybil-{i}", FakeWriter()) for i in range(8) for _ in range(4)]
    assert all(slots) and server._active_open == server.open_slots
    _answering(server, slots)
    return slots


def test_a_reader_that_asked_and_does_not_read_is_evicted_for_a_newcomer_once_it_is_behind():
    server = _server(good=set())
    slots = _open_share_full_of_readers(server)
    late = SERVE_BASE_S + 1.0
    for slot in slots:  # every open slot answering: within the grace, or reading fast enough
        _stall(slot, answered_s_ago=SERVE_BASE_S / 2)
    _stall(slots[0], answered_s_ago=late, sent=int(2 * SERVE_MIN_BYTES_PER_S))
    assert server._take_slot("newcomer", FakeWriter()) is None  # nobody stalled: refused
    _stall(slots[1], answered_s_ago=late, sent=int(0.5 * SERVE_MIN_BYTES_PER_S))  # behind: 0.5 s of 1 s
    newcomer = server._take_slot("newcomer", FakeWriter())
    assert newcomer is not None and slots[1].released and server.counts().evicted > 0


def test_a_peer_cannot_evict_stalled_streams_past_its_fair_share():
    server = _server(good=set())
    slots = _open_share_full_of_readers(server)
    for slot in slots:
        _stall(slot, answered_s_ago=SERVE_BASE_S + 10)
    newcomer = server._take_slot("newcomer", FakeWriter())  # it holds 1 then, its victim's peer 4
    assert newcomer is not None and slots[0].released and server._active["sybil-0"] == 3
    _answering(server, [newcomer])
    _stall(newcomer, answered_s_ago=0.1)  # its request is in; it reads
    # the peer that lost a stream may not take one back from a peer holding 4 (it would hold 4 too), so
    # Sybils cannot churn each other's stalled streams out to keep every slot fresh
    assert server._take_slot("sybil-0", FakeWriter()) is None
    assert server.counts().evicted == 1
    assert server._take_slot("newcomer", FakeWriter()) is not None  # 2 < 4: still below its victims


def test_the_open_share_holds_at_most_a_few_streams_of_one_origin_and_good_peers_are_not_capped():
    server = _server(good={"known"})
    taken = [server._take_slot(f"sybil-{i}", FakeWriter(), "203.0.113.0/24") for i in range(16)]
    assert sum(s is not None for s in taken) == MAX_OPEN_STREAMS_PER_ORIGIN
    assert server.counts().origin_cap == 16 - MAX_OPEN_STREAMS_PER_ORIGIN
    assert server._take_slot("other", FakeWriter(), "198.51.100.0/24") is not None
    assert server._take_slot("known", FakeWriter(), "203.0.113.0/24") is not None
    server._release(next(s for s in taken if s is not None))
    assert server._take_slot("sybil-99", FakeWriter(), "203.0.113.0/24") is not None  # a slot freed


def test_the_answer_deadline_grows_with_the_payload_and_never_cuts_a_pull_its_puller_waits_for():
    server = PayloadServer()

    def deadline(size: int) -> float:
        data = b"x" * size
        digest = hashlib.sha256(data).digest()
        server.offer(digest, data)
        return server.answer_deadline_s(digest)

    assert deadline(SERVE_MIN_BYTES_PER_S) == SERVE_BASE_S + 1
    assert deadline(MAX_FRAME_BYTES) == SERVE_MAX_S
    for size in (1, 100_000, 1 << 20, 2 << 20, MAX_FRAME_BYTES):  # exchange.puller.pull_timeout_s
        assert deadline(size) >= min(3.0 + size / (512 * 1024), 10.0)
    assert server.answer_deadline_s(b"\0" * 32) == SERVE_MAX_S  # not held: "not here" is 4 bytes
