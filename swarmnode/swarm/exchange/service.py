"""The swarm's data plane: a service thread beside the round loop that keeps the verified pool filled.

A peer's batch takes four stages, each handed what it uses and passing its result on by callback:

1. ``Inbox`` (exchange/inbox.py): notices and the DHT poll's records become candidates (unknown authors
   wait for a roster read);
2. ``Puller`` (exchange/puller.py): the announcement is checked, a new batch becomes pending and is
   pulled from a holder, with bounded concurrency, timeouts and back-off;
3. ``Intake`` (exchange/intake.py): the bytes are verified (the ``Verifier`` re-scores every group) and
   served on;
4. the pool (``Arrivals``, exchange/arrivals.py), from which the round takes J groups.

This module runs them. The service thread drains the inbox, starts pulls and handles finished ones,
pulls first and again after each verification (pulls wait on the network, verifying a batch takes CPU).
A reader thread of its own makes the DHT reads (a page of ROSTER_PAGE_SHARDS roster shards, back to back
until the first pass is done, then every ``roster_page_gap_s``, or FULL_VIEW_PAGE_GAP_S while the view is
full, sooner when parked notices ask, at most every ROSTER_MIN_GAP_S; the announcement poll
every POLL_INTERVAL_S, the floor under notices, of at most MAX_POLL_KEYS members), so a slow DHT delays
only the next read, never a notice or a pull. The service thread is the only one that calls the
``Verifier`` once the swarm started (it is not thread-safe; the round thread only reads its counts,
``Verifier.rejected``); the tokenizer is never touched here (verification scores completion *text*); the
``TaskBank`` is the verifier's own copy.

Every loop is bounded: the thread wakes at least every MAX_IDLE_S, and each wake handles at most
MAX_RESULTS_PER_WAKE finished pulls; every queue and table a stage keeps has its own cap.
"""

from __future__ import annotations

import logging
import threading
import time

from swarmnode.swarm.exchange.arrivals import Arrivals
from swarmnode.swarm.exchange.inbox import Inbox
from swarmnode.swarm.exchange.intake import Intake
from swarmnode.swarm.exchange.peers import PeerBook
from swarmnode.swarm.exchange.puller import MAX_PENDING, Puller
from swarmnode.swarm.exchange.records import ShareTrace
from swarmnode.swarm.exchange.roster import Roster
from swarmnode.swarm.exchange.verify import Verifier
from swarmnode.swarm.net import dht, reachability
from swarmnode.swarm.net.notices import NOTICE_STREAM, NoticeReceiver
from swarmnode.swarm.net.origins import OriginCaps
from swarmnode.swarm.net.transport import Transport
from swarmnode.swarm.wire import dht_rules

logger = logging.getLogger(__name__)

POLL_INTERVAL_S = 2.0  # DHT announcement poll: the floor under notices (each is a DHT get of N keys) ...
MAX_POLL_KEYS = 64  # ... of at most this many roster members, whatever the roster's size
# a page of the roster (who is live) is of this many of its shards (at most 2 x 64 cards, 1 MiB), never
# all: the shards of authors whose notices wait for their card first, then in turn; back to back, every
# ROSTER_MIN_GAP_S, until the first pass is done, then every roster_page_gap_s
ROSTER_PAGE_SHARDS = 2
ROSTER_PASSES_PER_TTL = 8  # ... that many passes over the 8 shards a record lifetime ...
ROSTER_REFRESH_S = 2.0  # ... but never more often than this
# once the view is full (swarm.view_size cards), a page this often: the DHT roster is then where members come
# from, not how they stay (members with standing stay live by their announcements, which the poll reads;
# one silent for a record lifetime leaves, the view is short again, and pages come at the lifetime's pace)
FULL_VIEW_PAGE_GAP_S = 60.0
# one roster read or poll; on the reader thread, so a slow DHT delays only the next read
DHT_READ_TIMEOUT_S = 10.0
ROSTER_MIN_GAP_S = 0.5  # roster reads asked for by parked notices start at most this often
MAX_IDLE_S = 0.25  # the thread looks at back-offs and timers at least this often
MAX_RESULTS_PER_WAKE = MAX_PENDING


def roster_page_gap_s(ttl_s: float) -> float:
    """Seconds between roster pages once the first pass is done. A pass every ttl / ROSTER_PASSES_PER_TTL
    reads a member's card (re-signed every ttl / 4) long before the ttl / 2 that keeps it live, even if it
    announces nothing, and costs a node the same at every record lifetime; newcomers do not wait for it
    (their notices carry their cards, or ask for their shard at once). Past 64 nodes a page holds up to
    128 cards whatever the swarm's size: how often it is read is what the roster costs (docs/scaling.md)."""
    pages_per_pass = dht_rules.ROSTER_SHARDS / ROSTER_PAGE_SHARDS
    return max(ROSTER_REFRESH_S, ttl_s / ROSTER_PASSES_PER_TTL / pages_per_pass)


class ExchangeService:
    """Finds, pulls and verifies peers' batches in the background (module docstring). Registers its
    stream handlers (notices, dial-back) on ``transport``: construct it before the transport starts."""

    def __init__(
        self,
        *,
        transport: Transport,
        swarm_id: str,
        roster: Roster,
        verifier: Verifier,
        book: PeerBook,
        arrivals: Arrivals,
        trace: ShareTrace,
        origins: OriginCaps | None = None,
        pulls_per_round: int,
    ):
        """``arrivals``: where verified groups go (the round takes them there); ``trace``: the opt-in
        share trace. ``origins``: the identities one origin network may bring in through notices (this
        node's ``swarm.identities_per_origin``; None: the defaults). ``pulls_per_round``: K, the round's
        budget of batches of authors with standing (``puller.pull_budget`` of J)."""
        self.transport = transport
        self.swarm_id = swarm_id
        self.roster = roster
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._read_roster_now = threading.Event()  # parked notices ask for an early roster read
        # answers peers' dial-back checks and remembers who failed: peers behind NAT, to offer batches to
        self.dialback = reachability.DialbackServer()
        self.intake = Intake(
            verifier=verifier, arrivals=arrivals, trace=trace, roster=roster, transport=transport,
            behind_nat=lambda: self.dialback.behind_nat,
        )  # fmt: skip
        self.puller = Puller(
            verifier=verifier, book=book, roster=roster, arrivals=arrivals, trace=trace,
            fetch=transport.fetch, on_pulled=self.intake.take, wake=self._wake.set,
            pulls_per_round=pulls_per_round, client_mode=lambda: transport.client_mode,
        )  # fmt: skip
        self.inbox = Inbox(
            roster, self.puller.consider, lambda outcome: self.notices.count(outcome),
            self.read_roster_soon, self._wake.set,
        )  # fmt: skip
        self.notices = NoticeReceiver(
            self.inbox.add_notice, allow=lambda peer: not book.is_banned(peer), origins=origins,
            on_origin=book.note_origin,  # the colocation penalty: where each authenticated sender is
        )  # fmt: skip
        transport.serve(NOTICE_STREAM, self.notices.handle)
        transport.serve(reachability.DIALBACK_STREAM, self.dialback.handle)
        self._threads: list[threading.Thread] = []
        self._poll_offset = 0  # where the next poll's page of roster members starts
        self._roster_next_shard = 0  # where the next roster page's turn starts ...
        self._roster_passes = 0  # ... and how often the turn went round every shard

    def start(self) -> None:
        self._threads = [
            threading.Thread(target=self._guarded, args=(self._step, "exchange service step"),
                             name="swarm-exchange", daemon=True),
            threading.Thread(target=self._read_dht, name="swarm-dht-reader", daemon=True),
        ]  # fmt: skip
        for thread in self._threads:
            thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the threads (the reader ends once its DHT call returns)."""
        self._stop.set()
        self._wake.set()
        self._read_roster_now.set()
        for thread in self._threads:
            thread.join(timeout_s)
        self.puller.stop()

    def read_roster_soon(self) -> None:
        """Ask for the next roster page at once (the start's wait for peers: pages every ROSTER_MIN_GAP_S
        while it waits, as parked notices get)."""
        self._read_roster_now.set()

    def refresh_roster(self, shards: list[int] | None = None) -> set[str]:
        """Read these roster shards now (None: every shard, as a test or a start may; the reader thread
        reads a page, ``_roster_page``, every ROSTER_REFRESH_S); the live peers."""
        cards = dht.read_roster(self.transport.records, self.swarm_id, DHT_READ_TIMEOUT_S, shards)
        live = self.roster.take_read(cards, shards)
        self._wake.set()  # parked notices: their authors may be known now
        return live

    def _guarded(self, step, what: str) -> None:
        """Run ``step`` until stopped; one failure is logged, and the thread goes on."""
        failures_logged = False
        while not self._stop.is_set():
            try:
                step()
            except Exception:  # noqa: BLE001 - the data plane must outlive any one bad step
                if not failures_logged:
                    logger.exception("%s failed; going on", what)
                    failures_logged = True
                self._stop.wait(MAX_IDLE_S)

    def _step(self) -> None:
        self._wake.clear()
        self._take_announcements()
        for _ in range(MAX_RESULTS_PER_WAKE):
            if not self.puller.take_result():
                break
            self._take_announcements()
        self._wake.wait(MAX_IDLE_S)

    def _take_announcements(self) -> None:
        self.inbox.drain()
        self.puller.start_pulls()

    def _read_dht(self) -> None:
        next_roster = next_poll = 0.0
        last_roster = -ROSTER_MIN_GAP_S

        def step() -> None:
            nonlocal next_roster, next_poll, last_roster
            now = time.monotonic()
            if (
                self._read_roster_now.is_set()
            ):  # parked notices want a read: as soon as the gap since the last one allows
                next_roster = min(next_roster, last_roster + ROSTER_MIN_GAP_S)
            if now >= next_roster:
                self._read_roster_now.clear()
                last_roster = now
                self.refresh_roster(self._roster_page())
                gap = self._page_gap_s() if self._roster_passes else ROSTER_MIN_GAP_S
                next_roster = time.monotonic() + gap
            elif now >= next_poll:
                get_started = time.time()
                found = dht.read_announcements(
                    self.transport.records, self.swarm_id, self._poll_page(), DHT_READ_TIMEOUT_S
                )
                self.inbox.add_polled(found, get_started)
                next_poll = time.monotonic() + POLL_INTERVAL_S
            wake_at = min(next_roster, next_poll)
            if self._read_roster_now.is_set():  # asked already: waiting on the set event would spin
                self._stop.wait(max(min(wake_at, last_roster + ROSTER_MIN_GAP_S) - time.monotonic(), 0.0))
            else:
                self._read_roster_now.wait(max(wake_at - time.monotonic(), 0.0))

        self._guarded(step, "DHT read")

    def _page_gap_s(self) -> float:
        """Seconds to the next roster page after the first pass: FULL_VIEW_PAGE_GAP_S while the view is
        full, else the record lifetime's pace (``roster_page_gap_s``)."""
        if len(self.roster) >= self.roster.view_size:
            return max(FULL_VIEW_PAGE_GAP_S, roster_page_gap_s(self.roster.ttl_s))
        return roster_page_gap_s(self.roster.ttl_s)

    def _poll_page(self) -> list[str]:
        """The roster members whose announcement keys this poll reads: at most MAX_POLL_KEYS, rotating
        through the roster from one poll to the next (PROTOCOL.md section 9.1)."""
        members = self.roster.members()
        if len(members) <= MAX_POLL_KEYS:
            return members
        start = self._poll_offset % len(members)
        self._poll_offset = start + MAX_POLL_KEYS
        return (members[start:] + members[:start])[:MAX_POLL_KEYS]

    def _roster_page(self) -> list[int]:
        """The ROSTER_PAGE_SHARDS shards the next roster read takes: those of parked notices' authors
        first (a peer that just joined), but never all of the page, so that notices naming unknown authors
        in every shard cannot stop the turn (and peers' cards would go unread); the rest in turn."""
        page = list(dict.fromkeys(dht_rules.roster_shard(a) for a in self.inbox.parked_authors()))
        page = page[: ROSTER_PAGE_SHARDS - 1]
        while len(page) < min(ROSTER_PAGE_SHARDS, dht_rules.ROSTER_SHARDS):
            shard = self._roster_next_shard
            self._roster_next_shard = (shard + 1) % dht_rules.ROSTER_SHARDS
            self._roster_passes += self._roster_next_shard == 0
            if shard not in page:
                page.append(shard)
        return page
