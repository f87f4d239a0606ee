"""A round's arrivals: the pool of verified peer groups and what the round thread waits on, with one owner.

The data plane's stages (service thread) ``add`` a verified batch's groups (deduplicated by content, pooled
with this node's current round as their freshness tier, its author settled), say which authors' batches are to
come (``expect``: being pulled, or the reserve's), ``settle`` an author whose batch cannot arrive, count a
failed pull (``fetch_failed``) and say when a round's pull budget is spent with its pulls ended
(``pulls_done``). The pool counts as filled only with groups that no batch still to come could outrank (by the
peer book's score): identities that race to fill a round first do not end its wait while a batch of a peer
this node keeps training on is to come (the wait still ends at the share deadline). The round thread opens its
round (``open_round``), waits for its peers (``wait_for``) and takes J groups (``take``); anyone reads a
frozen ``snapshot``. The round is this node's round as the pool's freshness tiers see it: batches arriving
while round r runs count for round r, and from the end of its exchange (``take``) for round r + 1.

Everything here is under one lock that nothing else shares, and the exchange's totals (``SwarmCounters``)
change under it with what they count, so a snapshot's pool and counters agree. The round thread's wait
wakes once for each change that can end it (an informative group pooled, a peer settled, the pulls done,
a roster read: ``wake``) and for nothing else (duplicates, zero-advantage groups, a peer settled again):
a batch that cannot end the wait costs the round thread nothing. What ``wait_for`` is handed, and the
ranking, are called under the lock, so they may take the roster's and the peer book's locks but never
wait on this object (the lock order is arrivals, then roster, then peer book; neither calls back in here
while holding its own).
"""

from __future__ import annotations

import copy
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from swarmnode.rollouts import RolloutGroup
from swarmnode.swarm.exchange.pool import GroupPool, Ranking
from swarmnode.swarm.exchange.records import ArrivalHistogram, SwarmCounters

# the share of a round's wait (from its start to the share deadline) during which a batch not announced
# yet of an author the pull reserve is kept for still counts as to come (``expect``)
TOP_GRACE_SHARE = 0.25
# ... and meanwhile the pool counts as filled with groups of producers ranked at least this share of the
# lowest-ranked of them: in an honest swarm the peers this node trains on nearly as much fill the round at
# once, identities whose standing was bought with one canned group do not
UNANNOUNCED_RANK_SHARE = 0.5


@dataclass(frozen=True)
class ArrivalsSnapshot:
    """The arrivals at one moment: our round and when it opened (time.time()), the last round whose
    pulls are done (-1: none yet), the peers settled this exchange, the groups pooled, the pulls by
    source and the exchange's totals."""

    round: int
    round_opened: float
    pulls_done_round: int
    settled: frozenset[str]
    pooled: int
    pulls_by_source: dict[str, int]
    counters: SwarmCounters


@dataclass(frozen=True)
class Taken:
    """What a round's ``take`` took: the groups chosen, and of the peers it waited for, how many
    delivered and which did not."""

    groups: list[RolloutGroup]
    delivered: int
    missed: frozenset[str]


class Arrivals:
    """The pool and the round's wait (module docstring). ``pool``: ties broken by os.urandom unless given.
    ``ranking``: what this node measured of producers (the peer book), for the choice and for when the
    pool is filled; None: every producer alike."""

    def __init__(self, pool: GroupPool | None = None, ranking: Ranking | None = None):
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._pool = pool if pool is not None else GroupPool()
        self._ranking = ranking
        self._rank: Callable[[str], float] = ranking.score if ranking is not None else (lambda _: 0.0)
        self._expected: set[str] = set()  # authors whose batch is to come this exchange (``expect``) ...
        self._unannounced: set[str] = set()  # ... and those whose batch is not even announced yet
        self._grace_end = 0.0  # until when the round's wait counts the unannounced ones (monotonic)
        # peers not to wait for any more this exchange: their batch arrived (accepted or rejected) or
        # cannot arrive (the pull failed for good, e.g. the peer left right after publishing)
        self._settled: set[str] = set()
        self._round = 0
        self._round_opened = 0.0  # time.time() when the round last changed
        self._pulls_done_round = -1
        self._pulls_by_source: Counter[str] = Counter()  # "notice" / "poll" / "holder"
        self._batches_published = self._groups_published = 0
        self._received = self._accepted = self._duplicates = self._trained = 0
        self._fetch_failures: Counter[str] = Counter()
        self._arrival = ArrivalHistogram()

    def open_round(self, round_: int) -> None:
        """From now on arriving batches count for our round ``round_`` (the pool's tier, the pull budget)."""
        with self._lock:
            self._open(round_)

    def _open(self, round_: int) -> None:
        if round_ != self._round:
            self._round, self._round_opened = round_, time.time()

    def window(self) -> tuple[int, float]:
        """Our round and when it opened (``RoundBudget``: batches announced before are the last wave's)."""
        with self._lock:
            return self._round, self._round_opened

    def add(self, author: str, groups: list[RolloutGroup], *, source: str, delay_s: float) -> tuple[int, int]:
        """``author``'s verified batch of ``groups``, found by ``source`` (PULL_SOURCES), verified
        ``delay_s`` after its signed announcement: its groups never seen before are pooled, its author is
        settled. Returns (groups pooled, our round). ``source``: "notice", "poll" or "holder"."""
        with self._lock:
            self._pulls_by_source[source] += 1
            self._received += 1
            fresh, duplicates = self._pool.unseen(groups)
            self._duplicates += duplicates
            if fresh:
                self._arrival.observe(delay_s)
                self._accepted += len(fresh)
                self._pool.add(fresh, self._round)
            usable = any(group.informative for group in fresh)  # what ``GroupPool.can_fill`` counts
            if self._settle(author) or usable:
                self._changed.notify_all()
            return len(fresh), self._round

    def expect(self, authors: set[str], *, announced: bool = True) -> None:
        """Batches of ``authors`` are to come this exchange (being pulled, or of the authors the pull budget
        keeps its reserve for): until each is settled, the pool counts as filled only with groups of
        producers ranked at least as high (``_over``). Not ``announced`` yet (a reserve author's next
        batch): only for the first TOP_GRACE_SHARE of the round's wait and with a floor of
        UNANNOUNCED_RANK_SHARE of their rank, so a slower peer does not hold every round, and a race to
        announce first does not take the round from the peers ranked highest."""
        with self._lock:
            (self._expected if announced else self._unannounced).update(authors)

    def settle(self, peer: str) -> None:
        """``peer`` is not waited for any more this exchange (its batch cannot arrive)."""
        with self._lock:
            if self._settle(peer):
                self._changed.notify_all()

    def _settle(self, peer: str) -> bool:
        """Whether ``peer`` was not settled yet; the caller holds the lock."""
        new = peer not in self._settled
        self._settled.add(peer)
        return new

    def fetch_failed(self, reason: str) -> int:
        """A pull failed for ``reason``; returns our round (the share trace's)."""
        with self._lock:
            self._fetch_failures[reason] += 1
            return self._round

    def pulls_done(self, round_: int) -> None:
        """Round ``round_``'s pull budget is spent and its pulls have ended: nothing more arrives for it."""
        with self._lock:
            if round_ > self._pulls_done_round:
                self._pulls_done_round = round_
                self._changed.notify_all()

    def published(self, groups: int) -> None:
        """This node published a batch of ``groups`` groups."""
        with self._lock:
            self._batches_published += 1
            self._groups_published += groups

    def wake(self) -> None:
        """Something the round's wait reads outside this object changed (a roster read): look again."""
        with self._lock:
            self._changed.notify_all()

    def wait_for(
        self, peers: set[str], keep: Callable[[str], bool], round_: int, wanted: int, deadline: float
    ) -> tuple[str, set[str]]:
        """Block until round ``round_``'s wait for ``peers`` is over, at the latest at ``deadline``
        (time.monotonic()). Before each look a peer for which ``keep`` is False (gone from the roster,
        banned) is no longer waited for. Returns why it ended (``_over``) and the peers still waited for."""
        with self._lock:
            now = time.monotonic()
            self._grace_end = now + TOP_GRACE_SHARE * max(deadline - now, 0.0)
            while True:
                peers = {peer for peer in peers if keep(peer)}
                ended_by = self._over(peers, round_, wanted, deadline)
                if ended_by:
                    return ended_by, peers
                now = time.monotonic()
                wake_at = self._grace_end if now < self._grace_end else deadline  # look again when it ends
                self._changed.wait(max(wake_at - now, 0.0))

    def _over(self, peers: set[str], round_: int, wanted: int, deadline: float) -> str:
        """Why a round's wait for ``peers`` ends now, or "" while it goes on (the share trace records it):
        no peer to wait for or every one settled, and no pull still going; the pool can fill J with groups
        of this round; the round's pull budget is spent (nothing more comes); or the share deadline passed.
        Settled peers alone do not end it while a pull is going: a fresh swarm's second round waits for the
        one or two peers it has trained on, and ended with the batches of the others half pulled (8
        loopback nodes: 3 of 48 rounds short of J). The caller holds the lock."""
        if self._expected <= self._settled:
            if not peers:
                return "nobody"
            if peers <= self._settled:
                return "settled"
        # filled: by groups that no batch still to come could outrank (a pull settles on arrival)
        unannounced = self._unannounced - self._settled if time.monotonic() < self._grace_end else set()
        floor = max((self._rank(author) for author in self._expected - self._settled), default=-math.inf)
        if unannounced:  # groups of peers ranked near them do; a bought standing does not
            floor = max(floor, UNANNOUNCED_RANK_SHARE * min(self._rank(author) for author in unannounced))
        if self._pool.can_fill(wanted, since_round=round_, rank=self._rank, floor=floor):
            return "filled"
        if self._pulls_done_round >= round_ and not unannounced:
            return "budget"
        return "deadline" if time.monotonic() >= deadline else ""

    def take(self, round_: int, wanted: int, awaited: set[str]) -> Taken:
        """End round ``round_``'s exchange: up to ``wanted`` groups chosen from the pool
        (``GroupPool.select``), which of ``awaited`` delivered, the settled peers forgotten, and batches
        arriving from now on fresh for round ``round_`` + 1. All at once: no group arrives in between."""
        with self._lock:
            delivered, missed = awaited & self._settled, awaited - self._settled
            self._settled.clear()
            self._expected.clear()
            self._unannounced.clear()
            self._open(round_ + 1)
            chosen = self._pool.select(wanted, self._ranking)
            self._trained += len(chosen)
            return Taken(chosen, len(delivered), frozenset(missed))

    def snapshot(self) -> ArrivalsSnapshot:
        with self._lock:
            counters = SwarmCounters(
                batches_published=self._batches_published,
                groups_published=self._groups_published,
                batches_received=self._received,
                groups_accepted=self._accepted,
                groups_trained=self._trained,
                duplicate_groups=self._duplicates,
                fetch_failures=dict(self._fetch_failures),
                arrival=copy.deepcopy(self._arrival),
            )
            return ArrivalsSnapshot(
                round=self._round,
                round_opened=self._round_opened,
                pulls_done_round=self._pulls_done_round,
                settled=frozenset(self._settled),
                pooled=len(self._pool),
                pulls_by_source=dict(self._pulls_by_source),
                counters=counters,
            )
