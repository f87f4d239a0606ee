"""The data plane's second stage: candidates checked, new batches pending, pulls bounded in every way.

A candidate's announcement is checked once (``Verifier.check_announcement``); a batch not pulled or accepted
yet becomes *pending* with the holders heard of (its author first, at most MAX_HOLDERS_PER_BATCH). Pending
batches are pulled at most MAX_PARALLEL_PULLS at once, authors with standing first, round-robin across
authors, freshest first, one batch of an author at a time (the next only once the last is verified: a
verification that bans its author or finds it over its byte rate comes before more of its bytes), each from
its first holder not backed off, within ``pull_timeout_s`` of the announced size. A holder that timed out or
could not be reached is backed off (BACKOFF_BASE_S, doubling up to BACKOFF_MAX_S), so a silent peer holds one
slot for one timeout; after MAX_FETCH_ATTEMPTS tries (one for an author without standing) the next holder is
asked. Every failed pull costs the holder score (PULL_PENALTIES), with standing or without: standing is kept
by serving, not by having been trained on. Bytes other than announced (``hash_mismatch``) charge the holder
that sent them, an oversized frame costs a strike, "not found" from the author half of one
(NOT_FOUND_STRIKE_WEIGHT). A batch no holder can serve is given up and its author settled; behind NAT only
after HOLDER_WAIT_S more, since reachable peers offer such a node the batches they verified
(exchange/intake.py).

A round pulls at most K = ``pull_budget(J)`` batches of authors with standing, announced in its window,
half of K kept for the highest scores, one batch each (``round_budget``; "announced" and "freshest" by
``round_budget.local_time``: a signed timestamp clamped to when this node heard of the batch): a node
trains on J peer groups a round, so its work must grow with J, not with the swarm. Past K batches are
dropped, not deferred (a round late they would be stale), and ``Arrivals.pulls_done`` tells the round that
nothing more is coming. Authors without standing new here get K first chances a round of their own, the
least crowded origins first; past those their batches wait, pending, for a later round's. An author once
tried is not charged again: its later batches are bounded per identity.

Bounds whatever the number of identities (exchange/standing.py): MAX_PENDING batches, PENDING_PER_AUTHOR of
one author, PROBATION_PENDING of authors without standing; past any of them the *newest* candidate is dropped
(counted in ``dropped``), never an older entry, except that a batch of an author whose first chance failed
(``Roster.fail_probation``: a pull from it held a slot for its whole timeout, or it served other bytes than
announced), else one of a more crowded origin, makes room for one on its first chance. Batches of authors
without standing have their own PROBATION_PULLS workers and a shorter base timeout, and are pulled only while
their share of the scoring CPU holds enough for one batch. Pending batches expire with their announcement.

Threads: ``consider``, ``start_pulls`` and ``take_result`` run on the service thread; the worker pools only
call ``fetch`` and hand the bytes back through a queue. What arrived goes to ``on_pulled``.
"""

from __future__ import annotations

import logging
import queue
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from swarmnode.common import BoundedSet
from swarmnode.errors import PeerError
from swarmnode.swarm.exchange.arrivals import Arrivals
from swarmnode.swarm.exchange.inbox import Candidate
from swarmnode.swarm.exchange.peers import PeerBook
from swarmnode.swarm.exchange.pending import Pending, Pulled
from swarmnode.swarm.exchange.records import ShareTrace
from swarmnode.swarm.exchange.roster import Roster
from swarmnode.swarm.exchange.round_budget import RoundBudget, local_time
from swarmnode.swarm.exchange.standing import PENDING_PER_AUTHOR, PROBATION_PENDING, PROBATION_PULLS
from swarmnode.swarm.exchange.verify import Verifier
from swarmnode.swarm.wire.limits import MAX_FRAME_BYTES, payload_digest
from swarmnode.swarm.wire.protocol import BatchAnnouncement

logger = logging.getLogger(__name__)

MAX_PARALLEL_PULLS = 8
PULL_TIMEOUT_BASE_S = 3.0  # a pull of n bytes may take PULL_TIMEOUT_BASE_S + n / PULL_BYTES_PER_S ...
PULL_BYTES_PER_S = 512 * 1024
PULL_TIMEOUT_MAX_S = 10.0  # ... and never longer
# the base for an author without standing: each silent identity holds a probation pull
# this long, so PROBATION_PULLS / PROBATION_PULL_TIMEOUT_BASE_S silent identities a second are used up
PROBATION_PULL_TIMEOUT_BASE_S = 1.0
BACKOFF_BASE_S = 2.0  # a holder whose pull timed out is not tried again for this long, doubling ...
BACKOFF_MAX_S = 60.0  # ... per consecutive failure up to this
MAX_BACKOFF_PEERS = 4096  # holders whose back-off is remembered
MAX_FETCH_ATTEMPTS = 2  # tries per (batch, holder) for timeouts and closed or unreachable streams
RETRYABLE_FETCH_FAILURES = frozenset({"timeout", "closed", "unreachable"})
# failures that end the probation of a holder without standing: it held a pull slot for a whole timeout
# (as sending other bytes than announced does); "unreachable"/"closed" are what an honest peer behind NAT
# gives some peers, "oversize" is refused before the body, "not found" from the author is charged
PROBATION_ENDING_FAILURES = frozenset({"timeout"})
# a pull's failure as a score penalty of the holder (standing.PENALTIES); "oversize"/"not_found" strike
PULL_PENALTIES = {"timeout": "pull_timeout", "closed": "pull_failed", "unreachable": "pull_failed"}
MAX_HOLDERS_PER_BATCH = 8  # holders remembered per pending batch (the author first)
HOLDER_WAIT_S = 3.0  # behind NAT: how long a batch whose holders all failed waits for a holder's offer
MAX_PENDING = 1024  # batches announced and not yet pulled
MAX_TRIED_AUTHORS = 16384  # authors given a first chance, remembered (past it the oldest is new again)
PULLS_PER_PEER_GROUP = 2  # K = this x J: a spare batch per group trained on, for failures and
# zero-advantage groups (docs/scaling.md: K = 2 J fills J in every simulated round at 10,000 nodes)
MAX_PULLED = 65536  # (author, digest) already pulled, accepted or not (~100 B each)
# a peer that announces a payload and then answers "not found" is charged half a strike: an honest node
# does it only after a restart (its announcement outlives its payload store), a squatter every time
NOT_FOUND_STRIKE_WEIGHT = 0.5

Fetch = Callable[..., bytes]  # (holder, digest, *, max_bytes, timeout_s) -> bytes, raising PeerError


def pull_budget(peer_groups: int) -> int:
    """K: batches of authors with standing one round pulls, for ``peer_groups`` (J) trained on."""
    return PULLS_PER_PEER_GROUP * peer_groups


def pull_timeout_s(payload_len: int, *, standing: bool = True) -> float:
    """How long a pull of ``payload_len`` announced bytes may take (of an author with ``standing``)."""
    base_s = PULL_TIMEOUT_BASE_S if standing else PROBATION_PULL_TIMEOUT_BASE_S
    return min(base_s + max(payload_len, 0) / PULL_BYTES_PER_S, PULL_TIMEOUT_MAX_S)


class Puller:
    def __init__(
        self,
        *,
        verifier: Verifier,
        book: PeerBook,
        roster: Roster,
        arrivals: Arrivals,
        trace: ShareTrace,
        fetch: Fetch,
        on_pulled: Callable[[Pulled], None],
        wake: Callable[[], None],
        pulls_per_round: int,
        client_mode: Callable[[], bool],
    ):
        """``pulls_per_round``: K, a round's budget of batches of authors with standing, ``pull_budget``;
        ``client_mode``: whether this node cannot be dialled (behind NAT: its transport's client mode)."""
        self.verifier = verifier
        self.book = book
        self.roster = roster
        self.arrivals = arrivals
        self._trace = trace
        self._fetch = fetch
        self._on_pulled = on_pulled
        self._wake = wake
        self._client_mode = client_mode
        self.pending: OrderedDict[tuple[str, bytes], Pending] = OrderedDict()
        self._per_author: Counter[str] = Counter()  # pending batches per author
        # candidates not taken: "author_full", "probation_full", "full", "round_budget", "failed_probation",
        # "crowded_origin"
        self.dropped: Counter[str] = Counter()
        self.budget = RoundBudget(pulls_per_round, arrivals.window)
        self._by_record: dict[bytes, tuple[str, bytes]] = {}  # announcement digest -> pending key
        self._pulled: BoundedSet[tuple[str, bytes]] = BoundedSet(MAX_PULLED)
        # authors without standing whose first chance (a first pull) was given: the exploration share
        # counts the others, the identities new here
        self._tried: BoundedSet[str] = BoundedSet(MAX_TRIED_AUTHORS)
        self.backoff: OrderedDict[str, tuple[float, int]] = OrderedDict()  # holder -> until, failures
        self._done: queue.Queue[tuple] = queue.Queue()  # finished pulls: at most MAX_PARALLEL_PULLS
        # pulls in flight and workers, per share: authors with standing (True) and without (False)
        self._in_flight = {True: 0, False: 0}
        self._authors_pulling: set[str] = set()  # at most one pull per author until it is verified
        self._workers = {
            True: ThreadPoolExecutor(MAX_PARALLEL_PULLS, thread_name_prefix="swarm-pull"),
            False: ThreadPoolExecutor(PROBATION_PULLS, thread_name_prefix="swarm-pull-probation"),
        }

    def stop(self) -> None:
        """Pulls in flight end with their own timeouts or the transport's shutdown."""
        for workers in self._workers.values():
            workers.shutdown(wait=False, cancel_futures=True)

    def consider(self, candidate: Candidate) -> None:
        """Check a candidate's announcement; a new batch becomes pending, a known pending one gains the
        candidate's holder."""
        record_digest = payload_digest(candidate.record)
        key = self._by_record.get(record_digest)
        if key is not None and key in self.pending:
            holders = self.pending[key].holders
            if candidate.holder not in holders and len(holders) < MAX_HOLDERS_PER_BATCH:
                holders.append(candidate.holder)
            return
        author = candidate.author
        announcement = self.verifier.check_announcement(candidate.record, author)
        if announcement is None:
            return
        self.roster.heard_from(author, announcement)
        key = (author, announcement.payload_sha256)
        # data already pulled or accepted, announced anew: never pulled twice
        if key in self._pulled or self.verifier.already_accepted(announcement.payload_sha256):
            self.verifier.count_repeat(announcement, author)
            return
        announced = local_time(announcement.timestamp, candidate.seen)
        if self.book.has_standing(author) and self.budget.spent(announced, author, top=True):  # for good
            self._pulled.add(key)
            self.dropped["round_budget"] += 1
            return
        full = self._full(author)
        if full:  # the newest is dropped: an entry already pending is never pushed out
            self.dropped[full] += 1
            return
        holders = [author] if candidate.holder == author else [author, candidate.holder]
        self.pending[key] = Pending(
            announcement, holders, candidate.via, candidate.get_started, candidate.seen, record_digest,
            candidate.record,
        )  # fmt: skip
        self._by_record[record_digest] = key
        self._per_author[author] += 1

    def _full(self, author: str) -> str:
        """Why a new batch of ``author`` cannot be pending now ("" if it can)."""
        if len(self.pending) >= MAX_PENDING:
            return "full"
        if self._per_author[author] >= PENDING_PER_AUTHOR:
            return "author_full"
        if not self.book.has_standing(author):
            on_probation = sum(n for a, n in self._per_author.items() if not self.book.has_standing(a))
            if on_probation >= PROBATION_PENDING and (
                self.roster.failed_probation(author) or not self._make_probation_room(author)
            ):
                return "probation_full"
        return ""

    def _make_probation_room(self, author: str) -> bool:
        """Room in the probation share for ``author`` on its first chance: drop the oldest pending batch
        (not being pulled) of an author whose first chance failed, else of the most crowded origin if more
        crowded than ``author``'s (exchange/standing.py). False if there is none."""
        idle = [
            key for key, p in self.pending.items() if not p.pulling and not self.book.has_standing(key[0])
        ]
        failed = [key for key in idle if self.roster.failed_probation(key[0])]
        crowded = max(idle, key=lambda key: self.book.crowding(key[0]), default=None)
        if failed:
            victim, why = failed[0], "failed_probation"
        elif crowded is not None and self.book.crowding(crowded[0]) > self.book.crowding(author):
            victim, why = crowded, "crowded_origin"
        else:
            return False
        self._give_up(victim, settle=False)
        self.dropped[why] += 1
        return True

    def start_pulls(self) -> None:
        """Start pulls for pending batches, in ``_pull_order``, while slots (and the round's budget) last."""
        now, wall = time.monotonic(), self.verifier.clock()  # the clock freshness is judged by
        order = self._pull_order()
        tops = self._top_authors()
        waiting = self._tops_waiting(tops)  # the round waits for them (Arrivals: filled) ...
        self.arrivals.expect(waiting)
        self.arrivals.expect(tops - waiting - self.budget.charged, announced=False)  # ... for a while
        for key, pending, standing in order:
            if wall - pending.announced > self.verifier.max_age_s:  # expired unpulled
                self._give_up(key, settle=False)
                continue
            first_pull = not pending.attempts
            top = pending.author in tops
            spent = self.budget.spent(pending.announced, pending.author, top)
            if standing and first_pull and spent:  # for good
                self._give_up(key, settle=False)
                self.dropped["round_budget"] += 1
                continue
            tries = MAX_FETCH_ATTEMPTS if standing else 1
            holder = self._next_holder(pending, now, tries)
            if holder is None:
                if not any(pending.attempts[h] < tries for h in pending.holders):
                    if not self._awaits_offer(pending, now):
                        self._give_up(key)  # every holder failed for good
                continue  # the rest are backed off: later
            if self._in_flight[standing] >= (MAX_PARALLEL_PULLS if standing else PROBATION_PULLS):
                continue
            if pending.author in self._authors_pulling:
                continue
            if not standing and not self.verifier.can_score(pending.author):
                continue
            new_author = not standing and pending.author not in self._tried
            origin = self.book.origin_of(pending.author) if new_author else None
            if new_author and self.budget.exploration_spent(origin):
                continue  # pending for a later round's share
            pending.pulling = True
            pending.attempts[holder] += 1
            if first_pull and standing:
                self.budget.charge(pending.author, top)
            elif new_author:
                self.budget.charge_exploration(origin)
                self._tried.add(pending.author)
            self._in_flight[standing] += 1
            self._authors_pulling.add(pending.author)
            self.arrivals.expect({pending.author})  # the round waits for it (Arrivals: filled)
            self._workers[standing].submit(self._pull, key, pending.announcement, holder, standing)
        self._tell_if_done(tops)

    def _awaits_offer(self, pending: Pending, now: float) -> bool:
        """Behind NAT, whether a batch whose holders all failed still waits for a reachable peer's offer
        (HOLDER_WAIT_S from the moment they had; its author is not settled meanwhile)."""
        if not self._client_mode():
            return False
        if pending.holders_failed_at is None:
            pending.holders_failed_at = now
        return now < pending.holders_failed_at + HOLDER_WAIT_S

    def _tell_if_done(self, tops: set[str]) -> None:
        """Once the budget is spent and its last pull has ended, the round need not wait for more."""
        tops_waiting = self._tops_waiting(tops)
        if not self.budget.round_spent(tops_pending=bool(tops_waiting)) or self._in_flight[True]:
            return
        if any(p.pulling or p.attempts for p in self.pending.values() if self.book.has_standing(p.author)):
            return  # a batch of this round's budget is still between tries
        self.arrivals.pulls_done(self.budget.round)

    def _top_authors(self) -> set[str]:
        """The ``budget.reserved`` live roster members with standing whose scores are the highest here
        (``PeerBook.ranked``): the reserve of K is theirs, measured here, so no claim or race to announce
        first takes their place."""
        members = [peer for peer in self.roster.live_peers() if self.book.has_standing(peer)]
        return set(self.book.ranked(members)[: self.budget.reserved])

    def _tops_waiting(self, tops: set[str]) -> set[str]:
        """Of ``tops``, those with a batch heard of and not yet pulled this round: the round waits for them
        (up to its deadline) before it fills with lower-ranked groups; for those not announced yet only for
        a part of it (``Arrivals.expect``)."""
        charged = self.budget.charged
        return {p.author for p in self.pending.values() if p.author in tops and p.author not in charged}

    def _pull_order(self) -> list[tuple[tuple[str, bytes], Pending, bool]]:
        """Pending batches not being pulled: authors with standing first, round-robin across authors in
        each share, so no author's many batches starve another's; the freshest first (an author's batches
        newest first, authors by their newest); in the probation share, authors on their first chance
        first, of the least crowded origins first."""
        queues: dict[str, list[tuple[str, bytes]]] = {}
        fresh = lambda key: -self.pending[key].announced  # noqa: E731
        for key in sorted((k for k, p in self.pending.items() if not p.pulling), key=fresh):
            queues.setdefault(key[0], []).append(key)
        standing = {author: self.book.has_standing(author) for author in queues}
        order = []
        for share in (True, False):
            lanes = [keys for author, keys in queues.items() if standing[author] == share]  # freshest first
            if not share:  # first chances first, the least crowded origins first (exchange/standing.py)
                lanes.sort(
                    key=lambda keys: (
                        self.roster.failed_probation(keys[0][0]),
                        self.book.crowding(keys[0][0]),
                    )
                )
            for turn in range(max(map(len, lanes), default=0)):
                order.extend(
                    (keys[turn], self.pending[keys[turn]], share) for keys in lanes if turn < len(keys)
                )
        return order

    def take_result(self) -> bool:
        """One finished pull, handled; False if none was waiting."""
        try:
            key, holder, standing, data, error, started, fetched = self._done.get_nowait()
        except queue.Empty:
            return False
        self._in_flight[standing] -= 1
        self._authors_pulling.discard(key[0])  # this call verifies it before any other pull starts
        pending = self.pending.get(key)
        if pending is None:  # given up meanwhile (expired)
            return True
        pending.pulling = False
        ann = pending.announcement
        trace = {
            "peer": key[0], "holder": holder, "via": pending.via, "round": ann.round,
            "announced_ts": ann.timestamp, "get_started": pending.get_started, "seen": pending.seen,
            "fetch_started": started, "fetched": fetched,
        }  # fmt: skip
        if error is None and not self.verifier.check_bytes(ann, data, holder):
            pending.attempts[holder] = MAX_FETCH_ATTEMPTS  # counted and charged; the next holder is asked
            self.roster.fail_probation(holder)
            return True
        if error is not None:
            self._failed(key, pending, holder, error, trace)
            return True
        self._forget(key)
        self._pulled.add(key)
        self.backoff.pop(holder, None)
        self._on_pulled(Pulled(pending, holder, data, trace))
        return True

    def _next_holder(self, pending: Pending, now: float, tries: int) -> str | None:
        """The first holder with tries left that is not backed off and not banned."""
        for holder in pending.holders:
            backed_off = self.backoff.get(holder, (0.0, 0))[0] > now
            if pending.attempts[holder] < tries and not backed_off:
                if not self.book.is_banned(holder):
                    return holder
                pending.attempts[holder] = MAX_FETCH_ATTEMPTS
        return None

    def _pull(
        self, key: tuple[str, bytes], announcement: BatchAnnouncement, holder: str, standing: bool
    ) -> None:
        """Worker thread: fetch only; the result goes back to the service thread."""
        started = time.time()
        data, error = None, None
        try:
            data = self._fetch(
                holder,
                announcement.payload_sha256,
                max_bytes=min(announcement.payload_len, MAX_FRAME_BYTES),
                timeout_s=pull_timeout_s(announcement.payload_len, standing=standing),
            )
        except PeerError as exc:
            error = exc.reason
        except Exception:  # noqa: BLE001 - a worker never dies silently with a slot held
            logger.exception("pull from %s failed", holder)
            error = "closed"
        self._done.put((key, holder, standing, data, error, started, time.time()))
        self._wake()

    def _failed(self, key: tuple[str, bytes], pending: Pending, holder: str, reason: str, trace: dict):
        """Back off a holder that timed out or could not be reached; charge one that sent too much, or
        the author answering "not found" (module docstring)."""
        trace["our_round"] = self.arrivals.fetch_failed(reason)
        self._trace("batch", **trace, error=reason)
        if reason in PROBATION_ENDING_FAILURES:  # a holder without standing had its first chance
            self.roster.fail_probation(holder)
        if reason in PULL_PENALTIES:  # measured here: costs the holder's score, with standing or without
            self.book.penalise(holder, PULL_PENALTIES[reason])
        if reason in RETRYABLE_FETCH_FAILURES:
            _, failures = self.backoff.pop(holder, (0.0, 0))
            delay = min(BACKOFF_BASE_S * 2**failures, BACKOFF_MAX_S)
            self.backoff[holder] = (time.monotonic() + delay, failures + 1)
            while len(self.backoff) > MAX_BACKOFF_PEERS:
                self.backoff.popitem(last=False)
            return
        pending.attempts[holder] = MAX_FETCH_ATTEMPTS
        if reason == "oversize":
            self.book.strike(holder, "oversize")
        elif reason == "not_found" and holder == key[0]:
            self.book.strike(holder, "not_found", NOT_FOUND_STRIKE_WEIGHT)

    def _give_up(self, key: tuple[str, bytes], *, settle: bool = True) -> None:
        """No holder can serve it (or it expired); with ``settle`` its author is not waited for."""
        self._forget(key)
        self._pulled.add(key)
        if settle:
            self.arrivals.settle(key[0])

    def _forget(self, key: tuple[str, bytes]) -> None:
        pending = self.pending.pop(key)
        self._by_record.pop(pending.record_digest, None)
        self._per_author[key[0]] -= 1
        if self._per_author[key[0]] <= 0:
            del self._per_author[key[0]]
