"""Notices: a peer tells this node directly that a batch exists, so discovery does not wait for a DHT poll.

One notice per stream on ``NOTICE_STREAM`` (PROTOCOL.md section 9.3), sender to receiver, no answer: a
4-byte big-endian length n (1..MAX_NOTICE_BYTES), then n bytes: one byte a, the author's base58 peer id
in a bytes (1..MAX_PEER_ID_BYTES), a 2-byte big-endian length r, the author's signed announcement record
in r bytes (the same bytes it stored in the DHT), and the rest: the author's signed roster card record,
or nothing. The stream's peer is the *holder*: the author itself, or a peer that holds the batch and can
serve it (``notify_one``). A notice is a hint, not a trust anchor: the records are checked exactly like
ones read from the DHT (signature, freshness, seq; the card also for its task fingerprint) by the
exchange service, and the batch pulled is checked against the author's signature whoever serves it. The
card lets a receiver whose roster reads time out (a loaded DHT) learn of the author at once.

Receiving (``NoticeReceiver.handle``, on the transport's event loop; it never blocks it): a sender the
peer filter refuses, or one past MAX_NOTICE_STREAMS streams at once, is closed unread; so is one whose
origin network (``net.origins``: the stream's IPv4 /24 or IPv6 /48) already brought
``swarm.identities_per_origin`` other peer ids in the last ``origins.ORIGIN_MEMORY_S`` (``origin_cap``),
and a notice carrying another author's card from such an origin is dropped the same way, so one network
cannot fill the roster with free identities through notices; each sender spends one token of a bucket
refilled at NOTICES_PER_MIN (NOTICE_BURST deep; MAX_NOTICE_SENDERS senders remembered); the frame must
arrive within NOTICE_READ_TIMEOUT_S and a length over MAX_NOTICE_BYTES is refused before the body. A
well-formed notice goes to ``on_notice(record, author, holder, card)`` (the service's non-blocking
``add_candidate``), which returns False when its bounded queue is full. Every outcome is counted in
``counts`` by ``NOTICE_OUTCOMES``; none escapes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

from swarmnode.config import SwarmConfig
from swarmnode.swarm.net.origins import OriginCaps
from swarmnode.swarm.net.streams import open_stream
from swarmnode.swarm.wire.framing import FRAME_HEADER_BYTES, encode_frame_header, parse_frame_header
from swarmnode.swarm.wire.limits import MAX_PEER_ID_BYTES, MAX_RECORD_BYTES, ProtocolError

logger = logging.getLogger(__name__)

NOTICE_STREAM = "/swarmnode/notice/2"  # /1 carried no roster card
RECORD_LENGTH_BYTES = 2
MAX_NOTICE_BYTES = 1 + MAX_PEER_ID_BYTES + RECORD_LENGTH_BYTES + 2 * MAX_RECORD_BYTES  # id, two DHT records
NOTICE_READ_TIMEOUT_S = 1.0  # the sender writes its frame as soon as the stream opens
NOTICE_SEND_TIMEOUT_S = 2.0  # fire-and-forget: a peer that does not take a notice in time misses it
NOTICES_PER_MIN = 120.0  # per sender: an honest node sends one per batch (a holder one per batch it holds)
NOTICE_BURST = 16
MAX_NOTICE_SENDERS = 4096  # senders whose token bucket is remembered (least recently seen go first)
MAX_NOTICE_STREAMS = 32  # notice streams read at once, all senders together
MAX_PARALLEL_NOTICE_SENDS = 32  # streams this node opens at once to send one notice to its peers
NOTICE_OUTCOMES = (
    "received", "refused", "origin_cap", "rate_limited", "oversize", "bad_frame", "timeout", "queue_full",
    "unknown_author", "errors",
)  # fmt: skip


def encode_notice(author: str, record: bytes, card: bytes = b"") -> bytes:
    """The whole notice frame: header, author id, announcement record, roster card record (or none)."""
    author_bytes = author.encode("ascii")
    if not 0 < len(author_bytes) <= MAX_PEER_ID_BYTES or not 0 < len(record) <= MAX_RECORD_BYTES:
        raise ValueError("a notice carries one peer id and one DHT record")
    if len(card) > MAX_RECORD_BYTES:
        raise ValueError("a roster card is one DHT record")
    body = bytes([len(author_bytes)]) + author_bytes + len(record).to_bytes(RECORD_LENGTH_BYTES, "big")
    body += bytes(record) + bytes(card)
    return encode_frame_header(len(body), MAX_NOTICE_BYTES) + body


def parse_notice(body: bytes) -> tuple[str, bytes, bytes]:
    """(author, announcement record, card record or b"") from a notice body; ProtocolError("malformed")
    if it is not one."""
    n = body[0] if body else 0
    start = 1 + n + RECORD_LENGTH_BYTES
    if not 0 < n <= MAX_PEER_ID_BYTES or len(body) < start:
        raise ProtocolError("malformed", "a notice is an author id and a record")
    try:
        author = body[1 : 1 + n].decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError("malformed", "the author id is not ASCII") from None
    r = int.from_bytes(body[1 + n : start], "big")
    card = body[start + r :]
    if not 0 < r <= MAX_RECORD_BYTES or len(body) < start + r or len(card) > MAX_RECORD_BYTES:
        raise ProtocolError("malformed", "the records' lengths do not fit the notice")
    return author, body[start : start + r], card


class NoticeReceiver:
    """The notice stream handler and its bounds (module docstring); ``counts`` is thread-safe to read.

    ``origins``: the identities-per-origin cap (``OriginCaps.from_config(transport.swarm)``); without it,
    the config's defaults. ``on_origin(holder, origin)``: told the origin network of each notice's
    authenticated sender once it passed the caps (the swarm's colocation measure); never of the author
    named in the bytes. Called on the event loop: it must not block."""

    def __init__(
        self,
        on_notice: Callable[[bytes, str, str, bytes], bool],
        allow: Callable[[str], bool],
        origins: OriginCaps | None = None,
        on_origin: Callable[[str, str | None], None] | None = None,
    ):
        self._on_notice = on_notice
        self._allow = allow
        self._on_origin = on_origin
        self.origins = origins if origins is not None else OriginCaps.from_config(SwarmConfig())
        self.counts: Counter[str] = Counter()
        self._counts_lock = threading.Lock()  # the service counts unknown authors from its own thread
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # sender -> tokens, refilled at
        self._streams = 0  # loop thread only, like _buckets

    def count(self, outcome: str) -> None:
        with self._counts_lock:
            self.counts[outcome] += 1

    def snapshot(self) -> dict[str, int]:
        with self._counts_lock:
            return dict(self.counts)

    def _take_token(self, sender: str, now: float) -> bool:
        tokens, at = self._buckets.pop(sender, (float(NOTICE_BURST), now))
        tokens = min(float(NOTICE_BURST), tokens + (now - at) * NOTICES_PER_MIN / 60.0)
        allowed = tokens >= 1.0
        self._buckets[sender] = (tokens - allowed, now)  # most recently seen last
        while len(self._buckets) > MAX_NOTICE_SENDERS:
            self._buckets.popitem(last=False)
        return allowed

    async def handle(self, info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read one notice and hand it on; every failure is counted, none escapes."""
        reading = False
        try:
            holder = info.peer_id.to_base58()
            if self._streams >= MAX_NOTICE_STREAMS or not self._allow(holder):
                self.count("refused")
                return
            origin = self.origins.origin(getattr(info, "addr", ""))
            if not self.origins.admit(origin, holder):
                self.count("origin_cap")
                return
            if self._on_origin is not None:
                self._on_origin(holder, origin)
            if not self._take_token(holder, time.monotonic()):
                self.count("rate_limited")
                return
            self._streams += 1
            reading = True
            body = await asyncio.wait_for(_read_frame(reader), NOTICE_READ_TIMEOUT_S)
            author, record, card = parse_notice(body)
            if card and author != holder and not self.origins.admit(origin, author):
                self.count("origin_cap")  # a card brings its author into the roster: one more identity
                return
            self.count("received" if self._on_notice(record, author, holder, card) else "queue_full")
        except TimeoutError:
            self.count("timeout")
        except (asyncio.IncompleteReadError, ConnectionError):
            self.count("bad_frame")  # closed before a whole frame
        except ProtocolError as exc:
            self.count("oversize" if exc.reason == "oversize" else "bad_frame")
        except asyncio.CancelledError:  # shutdown
            raise
        except Exception as exc:  # a misbehaving sender must never take the node down
            self.count("errors")
            logger.debug("notice stream failed: %r", exc)
        finally:
            self._streams -= reading
            with contextlib.suppress(Exception):
                writer.close()


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    length = parse_frame_header(await reader.readexactly(FRAME_HEADER_BYTES), MAX_NOTICE_BYTES)
    if length == 0:
        raise ProtocolError("malformed", "an empty notice")
    return await reader.readexactly(length)


async def _send(p2p: Any, peer_id: str, frame: bytes, slots: asyncio.Semaphore) -> bool:
    """Write ``frame`` on a new notice stream to ``peer_id`` and wait for the receiver to close it (so the
    frame is not cut off by our close); False on any failure or past NOTICE_SEND_TIMEOUT_S."""

    writer = None

    async def exchange() -> None:
        nonlocal writer
        reader, writer = await open_stream(p2p, peer_id, NOTICE_STREAM)
        writer.write(frame)
        await writer.drain()
        await reader.read(1)  # EOF: the receiver has read the frame

    async with slots:
        try:
            await asyncio.wait_for(exchange(), NOTICE_SEND_TIMEOUT_S)
            return True
        except Exception as exc:  # unreachable, no such protocol, timeout: the DHT poll is the fallback
            logger.debug("notice to %s not delivered: %r", peer_id, exc)
            return False
        finally:
            if writer is not None:
                with contextlib.suppress(Exception):
                    writer.close()


def notify(
    transport: Any, peers: list[str], author: str, record: bytes, card: bytes = b""
) -> concurrent.futures.Future | None:
    """Push ``author``'s announcement ``record`` (and its roster ``card``, if given) to ``peers`` at once,
    concurrently (at most MAX_PARALLEL_NOTICE_SENDS streams), without waiting: the future's result is how
    many took it. None if the transport is not running. A peer that misses it finds the batch at its next
    DHT poll."""
    if not peers:
        return None
    frame = encode_notice(author, record, card)
    transport.count_notices_sent(len(peers))  # attempted; the future says how many took it

    async def broadcast(p2p: Any) -> int:
        slots = asyncio.Semaphore(MAX_PARALLEL_NOTICE_SENDS)
        return sum(await asyncio.gather(*(_send(p2p, peer, frame, slots) for peer in peers)))

    try:
        return transport.submit(broadcast)
    except Exception as exc:  # shut down meanwhile
        logger.debug("notices not sent: %r", exc)
        return None


def notify_one(transport: Any, peer: str, author: str, record: bytes) -> concurrent.futures.Future | None:
    """One notice to one peer, without waiting. For "I hold this" notices: a node that verified
    ``author``'s batch tells a peer that cannot reach the author (behind NAT) that it can pull it from us."""
    return notify(transport, [peer], author, record)
