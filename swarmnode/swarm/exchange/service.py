"""The swarm's data plane: a service thread beside the round loop that keeps the verified pool filled.

Peers' batches are found two ways: notices (``swarm.net.notices``: a peer pushes its signed announcement the
moment it publishes) and, as the floor that catches what notices miss, a DHT poll every POLL_INTERVAL_S
(the roster is re-read every ROSTER_REFRESH_S). Either way the record is checked alike
(``Verifier.check_announcement``: signature, freshness, seq) and the batch becomes *pending* with the
holders heard of: its author, plus any peer whose notice carried the author's record (at most
MAX_HOLDERS_PER_BATCH). Pending batches are pulled concurrently, at most MAX_PARALLEL_PULLS at once, each
from its first holder not backed off (the author first), with a timeout proportional to the announced
size (PULL_TIMEOUT_BASE_S + bytes / PULL_BYTES_PER_S, at most PULL_TIMEOUT_MAX_S). A holder whose pull
timed out (or could not be reached) is backed off for BACKOFF_BASE_S, doubling per failure up to
BACKOFF_MAX_S, so one silent peer holds one pull slot for one timeout and is not tried again meanwhile;
each holder gets MAX_FETCH_ATTEMPTS tries per batch, then the next holder is tried, and a batch no holder
can serve is given up (its author is then not waited for). What arrives is verified here
(``Verifier.check_batch``, within its scoring budget), pooled, and, if accepted, offered on to other
peers (``offer(held=True)``: any holder serves a batch, the author's signature travels in the bytes).

Threads: this service thread is the only one that calls the ``Verifier`` once the swarm started (it is
not thread-safe; the round thread only reads its counters for status, a dict copy the GIL makes atomic);
pulls run in a MAX_PARALLEL_PULLS worker pool that only calls ``Transport.fetch`` and hands the bytes
back here; the DHT reads (roster and poll) run on a reader thread of their own, which hands polled
records back here too. ``Swarm.lock`` guards what the round thread shares with this one: the pool,
counters, roster, ``live``, ``_settled`` and ``_round``; ``Swarm.changed`` (its Condition) is notified
whenever a batch settles or the roster changes, and is what ``Swarm.exchange`` waits on. Verification
runs outside the lock, so the round thread never waits on scoring. The ``PeerBook`` has its own lock.
The tokenizer is never touched here: verification scores completion *text* with reasoning-gym, and the
vocabulary size was read once at construction; the ``TaskBank`` is the verifier's own deep copy (its
dataset cache is not safe to share with the sampling thread).

Every loop is bounded: the thread wakes at least every MAX_IDLE_S, each wake drains at most
MAX_QUEUED_NOTICES notices per pass and handles at most MAX_PENDING finished pulls, and pending batches
are capped at MAX_PENDING (oldest dropped) and expire with their announcement.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import Counter, OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from swarmnode.common import BoundedSet
from swarmnode.errors import TransportError
from swarmnode.swarm.net import reachability
from swarmnode.swarm.net.notices import NoticeReceiver, notify
from swarmnode.swarm.wire import protocol

if TYPE_CHECKING:
    from swarmnode.swarm.exchange.swarm import Swarm

logger = logging.getLogger(__name__)

POLL_INTERVAL_S = 2.0  # DHT announcement poll: the floor under notices (each is a DHT get of N keys)
ROSTER_REFRESH_S = 2.0  # the roster (who is live) is re-read this often
# one roster read or poll. They run on a thread of their own, so a slow DHT (a loaded host, dead peers'
# records) delays only the next read, never a notice or a pull
DHT_READ_TIMEOUT_S = 10.0
MAX_PARALLEL_PULLS = 8
PULL_TIMEOUT_BASE_S = 3.0  # a pull of n bytes may take PULL_TIMEOUT_BASE_S + n / PULL_BYTES_PER_S ...
PULL_BYTES_PER_S = 512 * 1024
PULL_TIMEOUT_MAX_S = 10.0  # ... and never longer
BACKOFF_BASE_S = 2.0  # a holder whose pull timed out is not tried again for this long, doubling ...
BACKOFF_MAX_S = 60.0  # ... per consecutive failure up to this
MAX_BACKOFF_PEERS = 4096  # holders whose back-off is remembered
MAX_FETCH_ATTEMPTS = 2  # tries per (batch, holder) for timeouts and closed or unreachable streams
RETRYABLE_FETCH_FAILURES = frozenset({"timeout", "closed", "unreachable"})
MAX_HOLDERS_PER_BATCH = 8  # holders remembered per pending batch (the author first)
MAX_PENDING = 1024  # batches announced and not yet pulled
MAX_QUEUED_NOTICES = 256  # notices received and not yet checked (the notice handler drops beyond)
MAX_QUEUED_POLLS = 2  # polls read and not yet checked (beyond: dropped, the next poll reads them again)
# notices whose author is not in the roster yet (it may have just joined) wait for the next roster read,
# asked for at once but started at most every ROSTER_MIN_GAP_S; beyond this many they are dropped as
# unknown_author
MAX_PARKED_NOTICES = 64
ROSTER_MIN_GAP_S = 0.5
MAX_PULLED = 65536  # (author, digest) already pulled, accepted or not (~100 B each)
MAX_IDLE_S = 0.25  # the thread looks at back-offs and timers at least this often
# a peer that announces a payload and then answers "not found" is charged half a strike: an honest node
# does it only after a restart (its announcement outlives its payload store), a squatter every time
NOT_FOUND_STRIKE_WEIGHT = 0.5


def pull_timeout_s(payload_len: int) -> float:
    """How long a pull of ``payload_len`` announced bytes may take."""
    return min(PULL_TIMEOUT_BASE_S + max(payload_len, 0) / PULL_BYTES_PER_S, PULL_TIMEOUT_MAX_S)


class _Notice(NamedTuple):
    """A notice as received, waiting to be checked."""

    record: bytes  # the author's signed announcement
    author: str
    holder: str  # the stream's peer: who says it can serve the batch
    received: float  # time.time()
    card: bytes  # the author's signed roster card record, or b""


@dataclass
class _Pending:
    """A batch announced and not yet pulled."""

    announcement: protocol.BatchAnnouncement
    holders: list[str]  # the author first, then holders in the order heard of
    via: str  # "notice" or "poll": what showed it first
    get_started: float  # time.time() the read that showed it began (the notice's arrival for notices)
    seen: float  # time.time() it was known here
    record_digest: bytes
    attempts: Counter = field(default_factory=Counter)  # per holder
    pulling: bool = False
    record: bytes = b""  # the author's signed announcement, for notices that offer the batch on


class ExchangeService:
    """Finds, pulls and verifies peers' batches in the background (module docstring)."""

    def __init__(self, swarm: Swarm):
        self.swarm = swarm
        self.notices = NoticeReceiver(self.add_candidate, allow=lambda peer: not swarm.book.is_banned(peer))
        self.live: set[str] = set()  # guarded by swarm.lock
        self.roster_reads = 0  # guarded by swarm.lock: how often the roster was read (0: not yet)
        self.pulls_by_source: Counter[str] = Counter()  # "notice" / "poll" / "holder": batches pulled
        # answers peers' dial-back checks and remembers who failed: peers behind NAT, to offer batches to
        self.dialback = reachability.DialbackServer()
        swarm.transport.stream_handlers[reachability.DIALBACK_STREAM] = self.dialback.handle
        self._inbox: queue.Queue[_Notice] = queue.Queue(MAX_QUEUED_NOTICES)
        self._done: queue.Queue[tuple] = queue.Queue()  # finished pulls: at most MAX_PARALLEL_PULLS
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._pending: OrderedDict[tuple[str, bytes], _Pending] = OrderedDict()
        self._by_record: dict[bytes, tuple[str, bytes]] = {}  # announcement digest -> pending key
        self._pulled: BoundedSet[tuple[str, bytes]] = BoundedSet(MAX_PULLED)
        self._backoff: OrderedDict[str, tuple[float, int]] = OrderedDict()  # holder -> until, failures
        self._in_flight = 0
        self._workers: ThreadPoolExecutor | None = None
        self._thread: threading.Thread | None = None
        self._reader: threading.Thread | None = None
        self._read_roster_now = threading.Event()  # parked notices ask for an early roster read
        # polled (record, author) lists with the read's start and end times
        self._polled: queue.Queue[tuple[list, float, float]] = queue.Queue(MAX_QUEUED_POLLS)
        # notices waiting for a roster read, each with roster_reads when it was parked
        self._parked: list[tuple[_Notice, int]] = []

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._workers = ThreadPoolExecutor(MAX_PARALLEL_PULLS, thread_name_prefix="swarm-pull")
        self._thread = threading.Thread(target=self._run, name="swarm-exchange", daemon=True)
        self._reader = threading.Thread(target=self._read_dht, name="swarm-dht-reader", daemon=True)
        self._thread.start()
        self._reader.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread (pulls in flight end with their own timeouts or the transport's shutdown)."""
        self._stop.set()
        self._wake.set()
        self._read_roster_now.set()
        for thread in (self._thread, self._reader):  # the reader ends once its DHT call returns
            if thread is not None:
                thread.join(timeout_s)
        if self._workers is not None:
            self._workers.shutdown(wait=False, cancel_futures=True)

    # -- entry points from other threads -----------------------------------------------------------

    def add_candidate(self, record: bytes, author: str, holder: str, card: bytes = b"") -> bool:
        """A notice: ``holder`` says ``author``'s announcement ``record`` is out and it can serve the
        batch; ``card`` is the author's roster card record, or empty. Thread-safe and non-blocking (the
        notice handler calls it on the transport's loop); False when MAX_QUEUED_NOTICES wait already."""
        try:
            self._inbox.put_nowait(_Notice(bytes(record), author, holder, time.time(), bytes(card)))
        except queue.Full:
            return False
        self._wake.set()
        return True

    # -- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        self._guarded(self._step, "exchange service step")

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
        """Notices, polled records and finished pulls; never a DHT call (the reader thread makes those).
        Pulls start before any verification and again after each one: they wait on the network, while
        verifying a batch takes CPU (tenths of a second on a busy host) and would hold them up."""
        self._wake.clear()
        self._take_announcements()
        for _ in range(MAX_PENDING):
            if not self._take_result():
                break
            self._take_announcements()
        self._wake.wait(MAX_IDLE_S)

    def _take_announcements(self) -> None:
        """Everything that announces batches (notices, polls, notices parked for the roster), then pulls."""
        self._take_notices()
        self._take_polled()
        self._take_parked()
        self._start_pulls()

    # -- the DHT reader thread -----------------------------------------------------------------------

    def _read_dht(self) -> None:
        next_roster = next_poll = 0.0
        last_roster = -ROSTER_MIN_GAP_S

        def step() -> None:
            nonlocal next_roster, next_poll, last_roster
            now = time.monotonic()
            if self._read_roster_now.is_set() and now >= last_roster + ROSTER_MIN_GAP_S:
                next_roster = now
            if now >= next_roster:
                self._read_roster_now.clear()
                last_roster = now
                self._refresh_roster()
                next_roster = time.monotonic() + ROSTER_REFRESH_S
            elif now >= next_poll:
                self._poll()
                next_poll = time.monotonic() + POLL_INTERVAL_S
            self._read_roster_now.wait(max(min(next_roster, next_poll) - time.monotonic(), 0.0))

        self._guarded(step, "DHT read")

    def _refresh_roster(self) -> None:
        live = self.swarm._live_peers(time.monotonic() + DHT_READ_TIMEOUT_S)  # takes swarm.lock itself
        with self.swarm.lock:
            self.live = live
            self.roster_reads += 1
            self.swarm.changed.notify_all()
        self._wake.set()  # parked notices: their authors may be known now

    def _poll(self) -> None:
        swarm = self.swarm
        with swarm.lock:
            peers = [p for p in swarm.roster if not swarm.book.is_banned(p)]
        keys = {protocol.announce_key(swarm.swarm_id, peer): peer for peer in peers}
        t_get = time.time()
        found = swarm.transport.get_many_records(list(keys), DHT_READ_TIMEOUT_S)
        records = [(found[key][peer], peer) for key, peer in keys.items() if peer in found.get(key, {})]
        if records:
            with contextlib.suppress(queue.Full):  # MAX_QUEUED_POLLS wait: the next poll reads these again
                self._polled.put_nowait((records, t_get, time.time()))
            self._wake.set()

    # -- on the service thread -----------------------------------------------------------------------

    def _take_polled(self) -> None:
        while True:
            try:
                records, t_get, t_seen = self._polled.get_nowait()
            except queue.Empty:
                return
            for record, peer in records:
                self._consider(record, peer, peer, "poll", t_get, t_seen)

    def _take_parked(self) -> None:
        """Notices whose authors had no card here, once a roster read has ended since they came: taken
        if the author is known now; dropped if not, after a second read (the first may have begun before
        the author's card was stored)."""
        if not self._parked:
            return
        with self.swarm.lock:
            reads = self.roster_reads
        waiting = []
        for notice, parked_at in self._parked:
            if reads > parked_at and self._known(notice):
                self._consider_notice(notice)
            elif reads >= parked_at + 2:
                self.notices.count("unknown_author")
            else:
                waiting.append((notice, parked_at))
        self._parked = waiting
        if waiting:
            self._read_roster_now.set()

    def _take_notices(self) -> None:
        for _ in range(MAX_QUEUED_NOTICES):
            try:
                notice = self._inbox.get_nowait()
            except queue.Empty:
                return
            if notice.card and not self._known(notice):  # the author's card came along: checked as if read
                self.swarm.admit_card(notice.author, notice.card, time.time())
            if self._known(notice):
                self._consider_notice(notice)
            elif len(self._parked) < MAX_PARKED_NOTICES:  # a peer that just joined: read the roster
                with self.swarm.lock:
                    self._parked.append((notice, self.roster_reads))
                self._read_roster_now.set()
            else:
                self.notices.count("unknown_author")

    def _known(self, notice: _Notice) -> bool:
        """Only compatible peers' batches are pulled (the roster holds no others)."""
        with self.swarm.lock:
            return notice.author in self.swarm.roster and notice.holder not in self.swarm._incompatible

    def _consider_notice(self, notice: _Notice) -> None:
        self._consider(
            notice.record, notice.author, notice.holder, "notice", notice.received, notice.received
        )

    def _consider(self, record: bytes, author: str, holder: str, via: str, get_started: float, seen: float):
        """Check an announcement read from the DHT or a notice; a new one becomes pending, a known pending
        one gains ``holder``."""
        record_digest = protocol.payload_digest(record)
        key = self._by_record.get(record_digest)
        if key is not None and key in self._pending:
            holders = self._pending[key].holders
            if holder not in holders and len(holders) < MAX_HOLDERS_PER_BATCH:
                holders.append(holder)
            return
        verifier = self.swarm.verifier
        announcement = verifier.check_announcement(record, author)
        if announcement is None:
            return
        self.swarm.heard_from(author, announcement.timestamp)
        key = (author, announcement.payload_sha256)
        # data already pulled or accepted, announced anew: never pulled twice
        if key in self._pulled or verifier.already_accepted(announcement.payload_sha256):
            verifier.count_repeat(announcement, author)
            return
        while len(self._pending) >= MAX_PENDING:
            self._forget(next(iter(self._pending)))
        holders = [author] if holder == author else [author, holder]
        self._pending[key] = _Pending(
            announcement, holders, via, get_started, seen, record_digest, record=record
        )
        self._by_record[record_digest] = key

    def _forget(self, key: tuple[str, bytes]) -> None:
        pending = self._pending.pop(key)
        self._by_record.pop(pending.record_digest, None)

    def _start_pulls(self) -> None:
        now, wall = time.monotonic(), self.swarm.verifier.clock()  # the clock freshness is judged by
        max_age = self.swarm.verifier.max_age_s
        for key, pending in list(self._pending.items()):
            if pending.pulling:
                continue
            if wall - pending.announcement.timestamp > max_age:  # expired unpulled: an old round's batch
                self._give_up(key, settle=False)
                continue
            holder = self._next_holder(pending, now)
            if holder is None:
                if not any(pending.attempts[h] < MAX_FETCH_ATTEMPTS for h in pending.holders):
                    self._give_up(key)  # every holder failed for good
                continue  # the rest are backed off: later
            if self._in_flight >= MAX_PARALLEL_PULLS:
                return
            pending.pulling = True
            pending.attempts[holder] += 1
            self._in_flight += 1
            assert self._workers is not None
            self._workers.submit(self._pull, key, pending.announcement, holder)

    def _next_holder(self, pending: _Pending, now: float) -> str | None:
        """The first holder with tries left that is not backed off and not banned."""
        for holder in pending.holders:
            backed_off = self._backoff.get(holder, (0.0, 0))[0] > now
            if pending.attempts[holder] < MAX_FETCH_ATTEMPTS and not backed_off:
                if not self.swarm.book.is_banned(holder):
                    return holder
                pending.attempts[holder] = MAX_FETCH_ATTEMPTS
        return None

    def _pull(self, key: tuple[str, bytes], announcement: protocol.BatchAnnouncement, holder: str) -> None:
        """Worker thread: fetch only; the result goes back to the service thread."""
        started = time.time()
        data, error = None, None
        try:
            data = self.swarm.transport.fetch(
                holder,
                announcement.payload_sha256,
                max_bytes=min(announcement.payload_len, protocol.MAX_FRAME_BYTES),
                timeout_s=pull_timeout_s(announcement.payload_len),
            )
        except TransportError as exc:
            error = exc.reason
        except Exception:  # noqa: BLE001 - a worker never dies silently with a slot held
            logger.exception("pull from %s failed", holder)
            error = "closed"
        self._done.put((key, holder, data, error, started, time.time()))
        self._wake.set()

    def _take_result(self) -> bool:
        """One finished pull, handled (verified if it arrived); False if none was waiting."""
        try:
            key, holder, data, error, started, fetched = self._done.get_nowait()
        except queue.Empty:
            return False
        self._in_flight -= 1
        pending = self._pending.get(key)
        if pending is not None:  # else dropped meanwhile (MAX_PENDING)
            pending.pulling = False
            ann = pending.announcement
            trace = {
                "peer": key[0], "holder": holder, "via": pending.via, "round": ann.round,
                "announced_ts": ann.timestamp, "get_started": pending.get_started, "seen": pending.seen,
                "fetch_started": started, "fetched": fetched,
            }  # fmt: skip
            if error is None:
                self._received(key, pending, holder, data, trace)
            else:
                self._failed(key, pending, holder, error, trace)
        return True

    def _failed(self, key: tuple[str, bytes], pending: _Pending, holder: str, reason: str, trace: dict):
        """Back off a holder that timed out or could not be reached; an oversized frame costs its sender a
        strike, "not found" from the author itself half of one (NOT_FOUND_STRIKE_WEIGHT)."""
        swarm = self.swarm
        with swarm.lock:
            swarm.counters.fetch_failures[reason] += 1
            trace["our_round"] = swarm._round
        swarm._trace("batch", **trace, error=reason)
        if reason in RETRYABLE_FETCH_FAILURES:
            _, failures = self._backoff.pop(holder, (0.0, 0))
            delay = min(BACKOFF_BASE_S * 2**failures, BACKOFF_MAX_S)
            self._backoff[holder] = (time.monotonic() + delay, failures + 1)
            while len(self._backoff) > MAX_BACKOFF_PEERS:
                self._backoff.popitem(last=False)
            return
        pending.attempts[holder] = MAX_FETCH_ATTEMPTS
        if reason == "oversize":
            swarm.book.strike(holder, "oversize")
        elif reason == "not_found" and holder == key[0]:
            swarm.book.strike(holder, "not_found", NOT_FOUND_STRIKE_WEIGHT)

    def _received(self, key: tuple[str, bytes], pending: _Pending, holder: str, data: bytes, trace: dict):
        swarm, ann = self.swarm, pending.announcement
        self._forget(key)
        self._pulled.add(key)
        self._backoff.pop(holder, None)
        groups = swarm.verifier.check_batch(ann, data, holder)  # outside the lock: scoring takes time
        verified = time.time()
        if swarm.verifier.already_accepted(ann.payload_sha256):
            swarm.transport.offer(ann.payload_sha256, data, held=True)  # we hold it now: serve it on
            if not swarm.transport.client_mode:  # reachable: tell peers behind NAT they can pull it here
                self._offer_held(key[0], holder, pending.record)
        source = "holder" if holder != key[0] else pending.via
        with swarm.lock:
            self.pulls_by_source[source] += 1
            swarm.counters.batches_received += 1
            fresh, duplicates = swarm.pool.unseen(groups)
            swarm.counters.duplicate_groups += duplicates
            if fresh:
                swarm.counters.arrival.observe(verified - ann.timestamp)
                swarm.counters.groups_accepted += len(fresh)
                swarm.pool.add(fresh, swarm._round)
            trace["our_round"] = swarm._round
            swarm._settled.add(key[0])
            swarm.changed.notify_all()
        swarm._trace("batch", **trace, verified=verified, groups=len(fresh), bytes=len(data))

    def _offer_held(self, author: str, served_by: str, record: bytes) -> None:
        """Notices to at most HOLDER_OFFER_FANOUT live peers behind NAT (reachability.py) that this node
        holds ``author``'s batch: they may not reach its author, but they reach us."""
        with self.swarm.lock:
            live = set(self.live)
        peers = reachability.holder_offer_targets(self.dialback.behind_nat, live, {author, served_by})
        if peers:
            notify(self.swarm.transport, peers, author, record)

    def _give_up(self, key: tuple[str, bytes], *, settle: bool = True) -> None:
        """No holder can serve it (or it expired); with ``settle`` its author is not waited for this round."""
        self._forget(key)
        self._pulled.add(key)
        if not settle:
            return
        with self.swarm.lock:
            self.swarm._settled.add(key[0])
            self.swarm.changed.notify_all()
