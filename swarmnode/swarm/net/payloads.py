"""Serving payloads: a bounded in-memory store of encoded batches, answered by digest on a stream.

``PayloadServer`` is the serving half of a ``Transport`` (its ``payloads``): ``offer`` keeps the newest
``payload_capacity`` payloads; ``handle_stream`` answers one pull on ``PAYLOAD_STREAM`` (PROTOCOL.md
section 9): read a 32-byte digest, write our 4-byte frame header and the body (length 0 = "not here").
The daemon's own length prefixes have no upper bound, so both sides use that header, hard caps and
deadlines.

Serving is bounded so that no peer can exhaust the node: at most ``max_streams_per_peer`` concurrent
pulls per remote peer and ``max_streams`` in all (extra streams are closed unanswered), the 32-byte
request must arrive within ``request_timeout_s`` (``PULL_REQUEST_TIMEOUT_S``, sub-second: a puller writes
it as soon as the stream opens) and the answer must be taken within ``serve_timeout_s``. Slots are kept
for peers in good standing (``set_peer_standing``: the swarm says which, peers whose groups it accepted
and that are not struck): peers not in good standing share at most ``max_streams`` x (1 -
``RESERVED_SLOT_SHARE``) slots, so Sybil ids holding streams cannot starve a known peer. A stream that
finds its slots full evicts the oldest stream of that share still waiting for its request (``evicted``):
an idle stream costs its holder the slot, not the next honest puller. The handler runs on the
transport's event loop and never blocks it; every failure is counted, none escapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from swarmnode.errors import PeerError, TransportError
from swarmnode.swarm.wire.framing import PULL_REQUEST_BYTES, encode_frame_header, parse_pull_request
from swarmnode.swarm.wire.limits import MAX_FRAME_BYTES, ProtocolError

logger = logging.getLogger(__name__)

# peers' batches this node verified and serves on (any holder serves a batch: PROTOCOL.md section 9.2),
# in bytes all together; they never evict this node's own latest batch
MAX_HELD_PAYLOAD_BYTES = 32 * 1024 * 1024
WRITE_CHUNK_BYTES = 64 * 1024  # bytes written per drain: bounds each served stream's send buffer
PULL_REQUEST_TIMEOUT_S = 0.75  # the 32-byte request must arrive this soon after the stream opens
RESERVED_SLOT_SHARE = 0.5  # share of max_streams only peers in good standing may use
SERVING_COUNTERS = (
    "served", "served_bytes", "not_found", "refused", "evicted", "bad_request", "aborted", "errors",
)  # fmt: skip


@dataclass(eq=False)
class _Slot:
    """One stream being served: who holds it, from which share, whether its request is still awaited."""

    peer: str
    good: bool
    writer: asyncio.StreamWriter
    idle: bool = True
    released: bool = False


class PayloadServer:
    """The payload store and the stream handler that serves it (``Transport`` adds the network).

    ``stats`` counters (the transport counts its pulls in the same dict): served / served_bytes
    (payloads sent), not_found (asked for a digest we do not hold), refused (stream closed unanswered:
    filter or caps), evicted (an idle stream closed to make room for a new one), bad_request (no or short
    request in time), aborted (the puller left or was too slow), errors (anything else in the handler).
    """

    def __init__(
        self,
        *,
        payload_capacity: int = 64,
        max_streams_per_peer: int = 4,
        max_streams: int = 64,
        request_timeout_s: float = PULL_REQUEST_TIMEOUT_S,
        serve_timeout_s: float = 30.0,
    ):
        if payload_capacity < 1:
            raise ValueError("payload_capacity must be >= 1")
        self.payload_capacity = payload_capacity
        self.max_streams_per_peer = max_streams_per_peer
        self.max_streams = max_streams
        self.request_timeout_s = request_timeout_s
        self.serve_timeout_s = serve_timeout_s
        self.stats: dict[str, int] = dict.fromkeys(SERVING_COUNTERS, 0)
        self._stats_lock = threading.Lock()
        self._payloads: OrderedDict[bytes, bytes] = OrderedDict()
        self._payloads_lock = threading.Lock()
        self._held: dict[bytes, int] = {}  # digest -> size of the peers' payloads in _payloads
        self._own_latest = b""  # digest of our own newest offer: never evicted
        self._allow: Callable[[str], bool] = lambda _peer: True
        self._good: Callable[[str], bool] = lambda _peer: False
        self.open_slots = max_streams - int(max_streams * RESERVED_SLOT_SHARE)  # for any peer
        # loop thread only: peer id -> streams served; streams by share; idle streams, oldest first
        self._active: dict[str, int] = {}
        self._active_total = 0
        self._active_open = 0  # streams of peers not in good standing
        self._idle: OrderedDict[_Slot, None] = OrderedDict()

    def count(self, key: str, n: int = 1) -> None:
        with self._stats_lock:  # pulls run on caller threads, serving on the loop thread
            self.stats[key] = self.stats.get(key, 0) + n

    def offer(self, digest: bytes, data: bytes, *, held: bool = False) -> None:
        """Serve ``data`` to peers that ask for ``digest``; past payload_capacity the oldest offer goes.

        ``held``: a peer's batch this node verified, served on for others; held payloads together stay
        under MAX_HELD_PAYLOAD_BYTES and never evict our own latest offer."""
        if len(digest) != PULL_REQUEST_BYTES:
            raise ValueError(f"a digest is {PULL_REQUEST_BYTES} bytes")
        if not 0 < len(data) <= MAX_FRAME_BYTES:
            raise TransportError("oversize", f"payload of {len(data)} bytes; it must be 1..{MAX_FRAME_BYTES}")
        digest = bytes(digest)
        with self._payloads_lock:
            if held and digest in self._payloads and digest not in self._held:
                return  # our own batch stays ours
            self._payloads[digest] = bytes(data)
            self._payloads.move_to_end(digest)
            if held:
                self._held[digest] = len(data)
            else:
                self._held.pop(digest, None)
                self._own_latest = digest
            while (
                len(self._payloads) > self.payload_capacity
                or sum(self._held.values()) > MAX_HELD_PAYLOAD_BYTES
            ):
                victim = next(d for d in self._payloads if d != self._own_latest)  # capacity >= 1
                del self._payloads[victim]
                self._held.pop(victim, None)

    def clear(self) -> None:
        with self._payloads_lock:
            self._payloads.clear()
            self._held.clear()

    def set_peer_filter(self, allow: Callable[[str], bool]) -> None:
        """``allow(peer_id)`` is asked for every incoming stream and before every fetch (ban lists)."""
        self._allow = allow

    def set_peer_standing(self, good: Callable[[str], bool]) -> None:
        """``good(peer_id)``: may the peer use the reserved slots (RESERVED_SLOT_SHARE)? Default: nobody."""
        self._good = good

    def _in_good_standing(self, peer_id: str) -> bool:
        try:
            return bool(self._good(peer_id))
        except Exception:
            logger.exception("peer standing raised for %s; treating it as unknown", peer_id)
            return False

    def _take_slot(self, peer: str, writer: asyncio.StreamWriter) -> _Slot | None:
        """A slot for a new stream of ``peer``, evicting the oldest idle stream of its share if need be;
        None if there is none (the stream is refused)."""
        if self._active.get(peer, 0) >= self.max_streams_per_peer:
            return None
        good = self._in_good_standing(peer)
        full_total = self._active_total >= self.max_streams
        if good and full_total or not good and (full_total or self._active_open >= self.open_slots):
            # the oldest idle stream this one competes with: any for a good peer, an open-share one otherwise
            victim = next((s for s in self._idle if good or not s.good), None)
            if victim is None:
                return None
            self._release(victim)
            self.count("evicted")
            with contextlib.suppress(Exception):
                victim.writer.close()
        slot = _Slot(peer, good, writer)
        self._active[peer] = self._active.get(peer, 0) + 1
        self._active_total += 1
        self._active_open += not good
        self._idle[slot] = None
        return slot

    def _release(self, slot: _Slot) -> None:
        if slot.released:
            return
        slot.released = True
        self._idle.pop(slot, None)
        self._active_total -= 1
        self._active_open -= not slot.good
        left = self._active.get(slot.peer, 1) - 1
        if left > 0:
            self._active[slot.peer] = left
        else:
            self._active.pop(slot.peer, None)

    def allowed(self, peer_id: str) -> bool:
        try:
            return bool(self._allow(peer_id))
        except Exception:
            logger.exception("peer filter raised for %s; refusing the peer", peer_id)
            return False

    def local_payload(self, digest: bytes, max_bytes: int) -> bytes:
        with self._payloads_lock:
            data = self._payloads.get(digest)
        if data is None:
            raise PeerError("not_found", "this node does not offer that payload")
        if len(data) > max_bytes:
            raise PeerError("oversize", f"payload of {len(data)} bytes; the limit is {max_bytes}")
        return data

    async def handle_stream(
        self, info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """One pull: read a 32-byte digest, answer with a frame. Every failure is counted, none escapes."""
        peer = "?"
        slot = None
        try:
            peer = info.peer_id.to_base58()
            if not self.allowed(peer):
                self.count("refused")
                return
            slot = self._take_slot(peer, writer)
            if slot is None:
                self.count("refused")
                return
            try:
                request = await asyncio.wait_for(
                    reader.readexactly(PULL_REQUEST_BYTES), self.request_timeout_s
                )
                digest = parse_pull_request(request)
            except (TimeoutError, asyncio.IncompleteReadError, ProtocolError, ConnectionError):
                if not slot.released:  # an evicted stream was counted as such
                    self.count("bad_request")
                return
            if slot.released:  # evicted while its request arrived
                return
            self._idle.pop(slot, None)
            slot.idle = False
            try:
                await asyncio.wait_for(self._send_payload(writer, digest), self.serve_timeout_s)
            except (TimeoutError, ConnectionError):  # too slow a reader, or it hung up
                self.count("aborted")
        except asyncio.CancelledError:  # shutdown
            raise
        except Exception as exc:  # a misbehaving client must never take the node down
            self.count("errors")
            logger.debug("payload stream from %s failed: %r", peer, exc)
        finally:
            if slot is not None:
                self._release(slot)
            with contextlib.suppress(Exception):
                writer.close()

    async def _send_payload(self, writer: asyncio.StreamWriter, digest: bytes) -> None:
        """Write the frame for ``digest`` (length 0 when we do not have it), draining per chunk."""
        with self._payloads_lock:
            data = self._payloads.get(digest)
        if data is None:
            self.count("not_found")
            writer.write(encode_frame_header(0))
            await writer.drain()
            return
        writer.write(encode_frame_header(len(data)))
        view = memoryview(data)
        for offset in range(0, len(data), WRITE_CHUNK_BYTES):
            writer.write(view[offset : offset + WRITE_CHUNK_BYTES])
            await writer.drain()
        self.count("served")
        self.count("served_bytes", len(data))
