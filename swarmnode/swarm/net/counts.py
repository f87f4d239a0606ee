"""What the network layer counts, as frozen records, and ``Tally``: counters with one owner.

Each counting part owns its counters: the payload server what serving did (``ServingCounts``), the DHT
records the calls that failed (``DHTCounts``), the transport its pulls and the notices sent
(``PullCounts``); ``Transport.counts`` hands out all three at once (``TransportCounts``). Readers use
the records' fields. Counters are written from several threads (pulls on callers' threads, serving on
the transport's loop), so an owner keeps its record in a ``Tally``: each ``add`` replaces it under the
tally's lock, and a record once handed out never changes, so a reader needs neither lock nor copy.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar

T = TypeVar("T")


class Tally(Generic[T]):
    def __init__(self, zero: T):
        self._now = zero
        self._lock = threading.Lock()

    def add(self, name: str, n: int = 1, *, key: str | None = None) -> None:
        """Add ``n`` to the record's field ``name``; with ``key``, to that entry of a field that counts
        by reason (a dict, replaced too). An unknown ``name`` raises."""
        with self._lock:
            now = getattr(self._now, name)
            new = now + n if key is None else {**now, key: now.get(key, 0) + n}
            self._now = replace(self._now, **{name: new})

    def read(self) -> T:
        with self._lock:
            return self._now


@dataclass(frozen=True)
class ServingCounts:
    """What serving did (``PayloadServer.counts``): served / served_bytes (payloads sent), not_found
    (asked for a digest we do not hold), refused (stream closed unanswered: filter or caps), origin_cap
    (refused: its origin holds ``payloads.MAX_OPEN_STREAMS_PER_ORIGIN``), evicted (an idle or stalled
    stream closed to make room for a new one), bad_request (no or short request in time), aborted (the
    puller left or took the answer too slowly), errors (anything else in the handler)."""

    served: int = 0
    served_bytes: int = 0
    not_found: int = 0
    refused: int = 0
    origin_cap: int = 0
    evicted: int = 0
    bad_request: int = 0
    aborted: int = 0
    errors: int = 0


@dataclass(frozen=True)
class DHTCounts:
    """DHT calls that failed (``DHTRecords.counts``): gets and stores."""

    read_failed: int = 0
    store_failed: int = 0


@dataclass(frozen=True)
class PullCounts:
    """This node's pulls and notices (``Transport``): pulls that succeeded and their bytes, pulls that
    failed by reason (``transport.FETCH_FAILURE_REASONS``, those seen), connections closed after a
    timed-out pull (to be dialled afresh), notices sent (attempted: a send may still fail)."""

    fetch_ok: int = 0
    fetch_bytes: int = 0
    fetch_failed: dict[str, int] = field(default_factory=dict)
    disconnected_after_timeout: int = 0
    notices_sent: int = 0

    @property
    def started(self) -> int:
        """Pulls started: those that succeeded and those that failed."""
        return self.fetch_ok + sum(self.fetch_failed.values())


@dataclass(frozen=True)
class TransportCounts:
    """A transport's counters at one moment (``Transport.counts``)."""

    serving: ServingCounts = field(default_factory=ServingCounts)
    pulls: PullCounts = field(default_factory=PullCounts)
    dht: DHTCounts = field(default_factory=DHTCounts)
