"""Serving payloads: a bounded in-memory store of encoded batches, answered by digest on a stream.

``PayloadServer`` is the serving half of a ``Transport`` (its ``payloads``): ``offer`` keeps the newest
``payload_capacity`` payloads; ``handle_stream`` answers one pull on ``PAYLOAD_STREAM`` (PROTOCOL.md
section 9): read a 32-byte digest, write our 4-byte frame header and the body (length 0 = "not here").
The daemon's own length prefixes have no upper bound, so both sides use that header, hard caps and
deadlines.

Serving is bounded so that no peer can exhaust the node: at most ``max_streams_per_peer`` concurrent
pulls per remote peer and ``max_streams`` in all (extra streams are closed unanswered), the 32-byte
request must arrive within ``request_timeout_s`` (``PULL_REQUEST_TIMEOUT_S``, sub-second: a puller writes
it as soon as the stream opens) and an answer of n bytes must be taken within SERVE_BASE_S + n /
SERVE_MIN_BYTES_PER_S, at most ``serve_timeout_s`` (SERVE_MAX_S): a stream past it is aborted and its
slot freed. That is never shorter than a puller waits (``exchange.puller.pull_timeout_s``: 3 s + n / 512
KiB/s, at most 10 s), so serving never gives up on a pull its puller still waits for.

Slots are kept for peers in good standing (``set_peer_standing``: the swarm says which, peers with standing:
groups of theirs it trained on, exchange/standing.py): peers not in good standing share at most
``max_streams`` x (1 - ``RESERVED_SLOT_SHARE``) slots, so Sybil ids holding streams cannot starve a known
peer; of those, one origin network (``net.origins``: IPv4 /24, IPv6 /48; loopback exempt unless configured
otherwise) holds at most MAX_OPEN_STREAMS_PER_ORIGIN (``origin_cap``). A stream that finds its slots full
evicts (``evicted``) the oldest stream of that share still waiting for its request, else the oldest *stalled*
one of a peer holding more streams than the newcomer would: a stream being served for over SERVE_BASE_S whose
reader took less than SERVE_MIN_BYTES_PER_S since (a reader that asked and never reads). An idle or stalled
stream costs its holder the slot, not the next honest puller; and a peer cannot evict its way past its fair
share, so Sybils that ask and never read cannot churn each other out to keep every slot fresh. The handler
runs on the transport's event loop and never blocks it; every failure is counted, none escapes.

The server also remembers who took this node's own batches (``recent_pullers``: the peers served one of
its last PULLED_BATCHES own offers in full, at most MAX_PULLERS): a peer that pulled our last batch is one
that wants our next, and its notice should not hang on our place in its ring (exchange/fanout.py). It is
what this node measured (a stream it served), never what a peer says."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from swarmnode.errors import PeerError, TransportError
from swarmnode.swarm.net.counts import ServingCounts, Tally
from swarmnode.swarm.net.origins import origin_of
from swarmnode.swarm.wire.framing import PULL_REQUEST_BYTES, encode_frame_header, parse_pull_request
from swarmnode.swarm.wire.limits import MAX_FRAME_BYTES, ProtocolError

logger = logging.getLogger(__name__)

# peers' batches this node verified and serves on (any holder serves a batch: PROTOCOL.md section 9.2),
# in bytes all together; they never evict this node's own latest batch
MAX_HELD_PAYLOAD_BYTES = 32 * 1024 * 1024
WRITE_CHUNK_BYTES = 64 * 1024  # bytes written per drain: bounds each served stream's send buffer
PULL_REQUEST_TIMEOUT_S = 0.75  # the 32-byte request must arrive this soon after the stream opens
SERVE_BASE_S = 3.0  # an answer of n bytes must be taken within SERVE_BASE_S + n / SERVE_MIN_BYTES_PER_S ...
SERVE_MIN_BYTES_PER_S = 256 * 1024  # ... (half the rate a puller waits for) ...
SERVE_MAX_S = 15.0  # ... and at most this (a 4 MiB answer: 15 s; a puller waits at most 10 s)
RESERVED_SLOT_SHARE = 0.5  # share of max_streams only peers in good standing may use
MAX_OPEN_STREAMS_PER_ORIGIN = 8  # of the open share, streams from one IPv4 /24 or IPv6 /48 (a quarter)
PULLED_BATCHES = 2  # own offers whose pullers count as recent (the last one's pulls may still be going on)
MAX_PULLERS = 64  # pullers remembered, the most recently served (a stream each, so a bounded set anyway)


@dataclass(eq=False)
class _Slot:
    """One stream being served: who holds it, from which share and origin, whether its request is still
    awaited, and since when (``time.monotonic``) it is answered and how many bytes its reader took."""

    peer: str
    good: bool
    writer: asyncio.StreamWriter
    origin: str | None = None  # counted against MAX_OPEN_STREAMS_PER_ORIGIN (open share only)
    idle: bool = True
    released: bool = False
    answered_at: float = 0.0
    sent: int = 0

    def stalled(self, now: float) -> bool:
        """Answered for over SERVE_BASE_S and its reader took less than SERVE_MIN_BYTES_PER_S since."""
        return not self.idle and self.sent < (now - self.answered_at - SERVE_BASE_S) * SERVE_MIN_BYTES_PER_S


class PayloadServer:
    """The payload store and the stream handler that serves it (``Transport`` adds the network).

    ``counts()``: what serving did (``ServingCounts``), counted here alone. ``exempt_loopback`` (the
    transport sets it from ``swarm.origin_cap_exempt_loopback``): loopback streams have no origin.
    """

    def __init__(
        self,
        *,
        payload_capacity: int = 64,
        max_streams_per_peer: int = 4,
        max_streams: int = 64,
        request_timeout_s: float = PULL_REQUEST_TIMEOUT_S,
        serve_timeout_s: float = SERVE_MAX_S,
    ):
        if payload_capacity < 1:
            raise ValueError("payload_capacity must be >= 1")
        self.payload_capacity = payload_capacity
        self.max_streams_per_peer = max_streams_per_peer
        self.max_streams = max_streams
        self.request_timeout_s = request_timeout_s
        self.serve_timeout_s = serve_timeout_s
        self._counts = Tally(ServingCounts())  # counted on the loop thread, read from others
        self._payloads: OrderedDict[bytes, bytes] = OrderedDict()
        self._payloads_lock = threading.Lock()
        self._held: dict[bytes, int] = {}  # digest -> size of the peers' payloads in _payloads
        self._own_latest = b""  # digest of our own newest offer: never evicted
        self._own_recent: deque[bytes] = deque(maxlen=PULLED_BATCHES)  # our last own offers, oldest first
        self._pullers: OrderedDict[str, bytes] = OrderedDict()  # peer -> own digest last served, newest last
        self._allow: Callable[[str], bool] = lambda _peer: True
        self._good: Callable[[str], bool] = lambda _peer: False
        self.open_slots = max_streams - int(max_streams * RESERVED_SLOT_SHARE)  # for any peer
        self.exempt_loopback = True
        # loop thread only: peer id -> streams served; streams by share; open-share streams per origin;
        # idle streams and streams being answered, oldest first
        self._active: dict[str, int] = {}
        self._active_total = 0
        self._active_open = 0  # streams of peers not in good standing
        self._per_origin: dict[str, int] = {}
        self._idle: OrderedDict[_Slot, None] = OrderedDict()
        self._answering: OrderedDict[asyncio.StreamWriter, _Slot] = OrderedDict()

    def counts(self) -> ServingCounts:
        return self._counts.read()

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
                self._own_recent.append(digest)
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
            self._own_recent.clear()
            self._pullers.clear()

    def recent_pullers(self) -> list[str]:
        """The peers served one of our last PULLED_BATCHES own offers in full, the most recent first."""
        with self._payloads_lock:
            recent = set(self._own_recent)
            return [peer for peer, digest in reversed(self._pullers.items()) if digest in recent]

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

    def _take_slot(self, peer: str, writer: asyncio.StreamWriter, origin: str | None = None) -> _Slot | None:
        """A slot for a new stream of ``peer`` from ``origin``, evicting an idle or stalled stream of its
        share if need be (module docstring); None if there is none (the stream is refused)."""
        held = self._active.get(peer, 0)
        if held >= self.max_streams_per_peer:
            return None
        good = self._in_good_standing(peer)
        origin = None if good else origin
        if origin is not None and self._per_origin.get(origin, 0) >= MAX_OPEN_STREAMS_PER_ORIGIN:
            self._counts.add("origin_cap")
            return None
        full_total = self._active_total >= self.max_streams
        if good and full_total or not good and (full_total or self._active_open >= self.open_slots):
            victim = self._victim(good, held + 1, time.monotonic())
            if victim is None:
                return None
            self._release(victim)
            self._counts.add("evicted")
            _abort(victim.writer)
        slot = _Slot(peer, good, writer, origin)
        self._active[peer] = held + 1
        self._active_total += 1
        self._active_open += not good
        if origin is not None:
            self._per_origin[origin] = self._per_origin.get(origin, 0) + 1
        self._idle[slot] = None
        return slot

    def _victim(self, good: bool, holding: int, now: float) -> _Slot | None:
        """The stream a new one of a peer that would then hold ``holding`` streams may evict: one it
        competes with (any for a good peer, an open-share one otherwise), the oldest still waiting for its
        request, else the oldest stalled one of a peer holding more than ``holding``."""
        idle = next((s for s in self._idle if good or not s.good), None)
        if idle is not None:
            return idle
        return next(
            (
                s
                for s in self._answering.values()
                if (good or not s.good) and self._active.get(s.peer, 0) > holding and s.stalled(now)
            ),
            None,
        )

    def _answering_now(self, slot: _Slot) -> None:
        self._idle.pop(slot, None)
        slot.idle = False
        slot.answered_at = time.monotonic()
        self._answering[slot.writer] = slot

    def _took(self, writer: asyncio.StreamWriter, sent: int) -> None:
        """The reader of ``writer``'s stream has taken ``sent`` bytes of its answer (for the stall rule)."""
        slot = self._answering.get(writer)
        if slot is not None:
            slot.sent = sent

    def _release(self, slot: _Slot) -> None:
        if slot.released:
            return
        slot.released = True
        self._idle.pop(slot, None)
        self._answering.pop(slot.writer, None)
        self._active_total -= 1
        self._active_open -= not slot.good
        left = self._active.get(slot.peer, 1) - 1
        if left > 0:
            self._active[slot.peer] = left
        else:
            self._active.pop(slot.peer, None)
        if slot.origin is not None:
            left = self._per_origin.get(slot.origin, 1) - 1
            if left > 0:
                self._per_origin[slot.origin] = left
            else:
                self._per_origin.pop(slot.origin, None)

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
        done = False
        try:
            peer = info.peer_id.to_base58()
            if not self.allowed(peer):
                self._counts.add("refused")
                return
            origin = origin_of(getattr(info, "addr", ""), exempt_loopback=self.exempt_loopback)
            slot = self._take_slot(peer, writer, origin)
            if slot is None:
                self._counts.add("refused")
                return
            try:
                request = await asyncio.wait_for(
                    reader.readexactly(PULL_REQUEST_BYTES), self.request_timeout_s
                )
                digest = parse_pull_request(request)
            except (TimeoutError, asyncio.IncompleteReadError, ProtocolError, ConnectionError):
                if not slot.released:  # an evicted stream was counted as such
                    self._counts.add("bad_request")
                return
            if slot.released:  # evicted while its request arrived
                return
            self._answering_now(slot)
            try:
                await asyncio.wait_for(self._send_payload(writer, digest), self.answer_deadline_s(digest))
                done = True
                self._served(peer, digest)
            except (TimeoutError, ConnectionError):  # too slow a reader, it hung up, or it was evicted
                if not slot.released:
                    self._counts.add("aborted")
        except asyncio.CancelledError:  # shutdown
            raise
        except Exception as exc:  # a misbehaving client must never take the node down
            self._counts.add("errors")
            logger.debug("payload stream from %s failed: %r", peer, exc)
        finally:
            if slot is not None:
                self._release(slot)
            if done:
                with contextlib.suppress(Exception):
                    writer.close()  # flushes what is left: the reader took the answer in time
            else:
                _abort(writer)

    def _served(self, peer: str, digest: bytes) -> None:
        """``peer`` took the whole answer for ``digest``: a puller, if it is one of our own offers."""
        with self._payloads_lock:
            if digest not in self._own_recent or digest not in self._payloads:  # a "not here" is no pull
                return
            self._pullers.pop(peer, None)
            self._pullers[peer] = digest
            while len(self._pullers) > MAX_PULLERS:
                self._pullers.popitem(last=False)

    def answer_deadline_s(self, digest: bytes) -> float:
        """How long the reader may take to take the answer for ``digest``: SERVE_BASE_S + its bytes /
        SERVE_MIN_BYTES_PER_S, at most ``serve_timeout_s`` (which a payload not held also gets: the
        4-byte "not here", or what a subclass answers instead)."""
        with self._payloads_lock:
            data = self._payloads.get(digest)
        if data is None:
            return self.serve_timeout_s
        return min(SERVE_BASE_S + len(data) / SERVE_MIN_BYTES_PER_S, self.serve_timeout_s)

    async def _send_payload(self, writer: asyncio.StreamWriter, digest: bytes) -> None:
        """Write the frame for ``digest`` (length 0 when we do not have it), draining per chunk and telling
        ``_took`` what the reader took."""
        with self._payloads_lock:
            data = self._payloads.get(digest)
        if data is None:
            self._counts.add("not_found")
            writer.write(encode_frame_header(0))
            await writer.drain()
            return
        writer.write(encode_frame_header(len(data)))
        view = memoryview(data)
        for offset in range(0, len(data), WRITE_CHUNK_BYTES):
            writer.write(view[offset : offset + WRITE_CHUNK_BYTES])
            await writer.drain()
            self._took(writer, offset + WRITE_CHUNK_BYTES)
        self._counts.add("served")
        self._counts.add("served_bytes", len(data))


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close a stream now, dropping what it has not sent: ``close`` would wait for a reader that does not
    read, holding the socket (and p2pd's stream) open."""
    with contextlib.suppress(Exception):
        writer.transport.abort()
