"""The data plane's first stage: what announces peers' batches, turned into candidates to pull.

Two sources: notices (a peer pushes a signed announcement the moment it publishes, ``net.notices``; the
stream's peer is the *holder*, who says it can serve the batch) and the DHT poll (every roster peer's
newest announcement; the author is its own holder). A notice whose author has no card here may come
from a peer that just joined: if it carries the author's card, the card is admitted first (checked as
if read from the DHT); otherwise it is *parked* until a roster read of the author's shard has ended
since it came (one is asked for at once; the reader takes parked authors' shards first), then taken if
the author is known, dropped as ``unknown_author`` after a second such read. Only compatible roster
peers' batches become candidates.

Bounds: at most ``MAX_QUEUED_NOTICES`` notices wait (``add_notice`` refuses beyond, without blocking
the transport's loop), ``MAX_QUEUED_POLLS`` polls (beyond: dropped, the next poll reads them again) and
``MAX_PARKED_NOTICES`` parked notices (beyond: ``unknown_author``). ``drain`` runs on the service thread.
"""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass

from swarmnode.swarm.exchange.roster import Roster

MAX_QUEUED_NOTICES = 256  # notices received and not yet checked (the notice handler drops beyond)
MAX_QUEUED_POLLS = 2  # polls read and not yet checked
MAX_PARKED_NOTICES = 64  # notices whose author is not in the roster yet, waiting for a roster read


@dataclass(frozen=True)
class Candidate:
    """An announcement record to check and, if new, to pull."""

    record: bytes  # the author's signed announcement
    author: str
    holder: str  # who says it can serve the batch (the author itself for polls)
    via: str  # "notice" or "poll"
    get_started: float  # time.time() the read that showed it began (a notice: its arrival)
    seen: float  # time.time() it was known here
    card: bytes = b""  # the author's signed roster card record a notice carried, or b""


class Inbox:
    """Notices and polled records in; ``Candidate``s out through ``on_candidate`` (module docstring)."""

    def __init__(
        self,
        roster: Roster,
        on_candidate: Callable[[Candidate], None],
        count_notice: Callable[[str], None],
        read_roster_soon: Callable[[], None],
        wake: Callable[[], None],
    ):
        self.roster = roster
        self._on_candidate = on_candidate
        self._count_notice = count_notice  # the notice receiver's counts, by outcome
        self._read_roster_soon = read_roster_soon
        self._wake = wake
        self._notices: queue.Queue[Candidate] = queue.Queue(MAX_QUEUED_NOTICES)
        self._polled: queue.Queue[list[Candidate]] = queue.Queue(MAX_QUEUED_POLLS)
        self._parked: list[tuple[Candidate, int]] = []  # each with the roster reads when it was parked

    def add_notice(self, record: bytes, author: str, holder: str, card: bytes = b"") -> bool:
        """A notice: ``holder`` says ``author``'s announcement ``record`` is out. Thread-safe and
        non-blocking (the notice handler calls it on the transport's loop); False when full."""
        now = time.time()
        try:
            self._notices.put_nowait(
                Candidate(bytes(record), author, holder, "notice", now, now, bytes(card))
            )
        except queue.Full:
            return False
        self._wake()
        return True

    def add_polled(self, records: list[tuple[bytes, str]], get_started: float) -> None:
        """(announcement record, author) pairs one DHT poll read (the reader thread)."""
        seen = time.time()
        batch = [Candidate(record, author, author, "poll", get_started, seen) for record, author in records]
        if batch:
            with contextlib.suppress(queue.Full):
                self._polled.put_nowait(batch)
            self._wake()

    def drain(self) -> None:
        """Everything waiting, to ``on_candidate`` or parked (the service thread)."""
        self._take_notices()
        with contextlib.suppress(queue.Empty):
            while True:
                for candidate in self._polled.get_nowait():
                    self._on_candidate(candidate)
        self._take_parked()

    def _take_notices(self) -> None:
        for _ in range(MAX_QUEUED_NOTICES):
            try:
                notice = self._notices.get_nowait()
            except queue.Empty:
                return
            if notice.card and not self._known(notice):  # the author's card came along: checked as if read
                self.roster.admit(notice.author, notice.card, time.time())
            if self._known(notice):
                self._on_candidate(notice)
            elif len(self._parked) < MAX_PARKED_NOTICES:  # a peer that just joined: read the roster
                self._parked.append((notice, self.roster.reads_of(notice.author)))
                self._read_roster_soon()
            else:
                self._count_notice("unknown_author")

    def _take_parked(self) -> None:
        """Parked notices, once a roster read has ended since they came (module docstring)."""
        if not self._parked:
            return
        waiting = []
        for notice, parked_at in self._parked:
            reads = self.roster.reads_of(notice.author)
            if reads > parked_at and self._known(notice):
                self._on_candidate(notice)
            elif reads >= parked_at + 2:
                self._count_notice("unknown_author")
            else:
                waiting.append((notice, parked_at))
        self._parked = waiting
        if waiting:
            self._read_roster_soon()

    def parked_authors(self) -> list[str]:
        """Authors of parked notices, whose roster shards the next roster read takes first (any thread:
        a snapshot of the list the service thread replaces)."""
        return [notice.author for notice, _ in list(self._parked)]

    def _known(self, notice: Candidate) -> bool:
        return self.roster.knows(notice.author, notice.holder)
