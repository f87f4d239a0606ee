"""Who is in the swarm, as this node knows it: the only owner of membership state.

A peer enters the roster with a valid roster card (``admit``: read from the DHT or carried by a notice),
and stays while it signs something this node checks: a fresh card, or an announcement (``heard_from``;
a loaded DHT's roster reads time out, announcements still arrive). A peer silent for a record lifetime
(``ttl_s``) is forgotten, so churn does not pile up. *Live* peers (``live``, recomputed at each roster
read: ``take_read``) are those that signed something within half a lifetime and are not banned: the ones
a round waits for. A crashed peer lingers until its card expires; an OFFLINE card removes it at once.

Cards are checked alike wherever they come from: signature and sender, the identity's proof of work
(``work_bits``, this swarm's setting: ``no_identity_work`` otherwise), protocol version, task fingerprint
(peers of another task mix or scorer version are ``incompatible``: skipped, never charged), freshness and
sequence number (an older card than one admitted is ignored); a graylisted peer (``PeerBook.is_graylisted``:
banned, or a score under GRAYLIST_SCORE) not yet in the view gets no seat. Refusals are counted by reason
in ``refused``.

The roster is this node's *view* of the swarm, not the swarm (docs/scaling.md): at most ``view_size`` cards
(``swarm.view_size``, default ``VIEW_SIZE``), whatever the swarm's size, so whom it notifies, polls and waits
for, and what its roster pages cost once the view is full (exchange/service.py), stay the same at 100 nodes
and at 10,000. The DHT's roster shards and the cards that notices carry are where members come from.
Allocation by standing (exchange/standing.py), by local measures only (never a peer-signed time): at most half
the view (``PROBATION_CARDS`` at the default) of peers without standing; a newer probation card replaces the
oldest one of the most crowded origin (``PeerBook.crowding``: a flood from a few networks churns through its
own cards, a newcomer from a network of its own keeps its seat); a card of a peer with standing replaces a
probation card when the view is full, else the least useful member with standing (lowest score, then heard
from least recently here) if it out-scores that one by RETURN_MARGIN; a newcomer's card replaces a member with
standing only while those hold more than the other half, and only one not heard from here within a card
lifetime (the least useful of those), so probation churn cannot eclipse active members; the standing bound (at
most ~24 J peers hold standing, exchange/standing.py) leaves newcomers seats in a view of 128. A peer without
standing whose first chance failed (``fail_probation``: a pull from it held a slot for its whole timeout, or
it served other bytes than announced) goes behind every peer still on its first chance for PROBATION_RETRY_S
(``failed_probation``; exchange/puller.py). The round waits (``to_wait_for``) for live peers with standing;
only while none is live, for peers without it, and for each of those only until its first miss (``missed``).

Every method takes the roster's own lock, and readers get copies (``live_peers``, ``cards_now``,
``members_progress``): the round thread reads the roster for status and waits, the service thread admits.
A roster read (``take_read``) wakes the start's wait for peers (``wait_first_read``, ``wait_live``) and
then, with the lock released, calls ``on_read`` (the round's wait looks again: ``Arrivals.wake``). Under
its lock the roster takes only the peer book's, so whoever holds the arrivals' lock may call it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence

from swarmnode.common import BoundedSet, log
from swarmnode.swarm.exchange import fanout
from swarmnode.swarm.exchange.compat import card_fingerprint
from swarmnode.swarm.exchange.fanout import NOTICE_FANOUT
from swarmnode.swarm.exchange.peers import PeerBook
from swarmnode.swarm.exchange.standing import PROBATION_CARDS
from swarmnode.swarm.wire import codec, dht_rules, limits, work
from swarmnode.swarm.wire.protocol import BatchAnnouncement, RosterCard

MAX_IGNORED_PEERS = 4096  # peers whose card was refused (or incompatible), remembered so each is said once
# roster cards kept at most, the node's view (swarm.view_size's default): two poll pages
# (service.MAX_POLL_KEYS) and twice the probation share, so members with standing keep half under any flood
VIEW_SIZE = 2 * PROBATION_CARDS
PROBATION_RETRY_S = 600.0  # a peer whose first chance failed comes last this long ...
MAX_FAILED_PROBATION = 16384  # ... and this many such peers are remembered (~1.5 MiB)
# a member with standing returning to a full view displaces the least useful member only if its own score
# is higher by this much (half a trained group's credit): no churn among equals
RETURN_MARGIN = 0.5


class Roster:
    def __init__(
        self,
        *,
        own_peer_id: str,
        swarm_id: str,
        fingerprint: str,
        book: PeerBook,
        ttl_s: float,
        on_read: Callable[[], None] = lambda: None,
        work_bits: int = 0,
        view_size: int = VIEW_SIZE,
        clock=time.monotonic,
    ):
        self.own_peer_id = own_peer_id
        self.swarm_id = swarm_id
        self.fingerprint = fingerprint  # our task mix's: cards naming another are incompatible
        self.book = book
        self.ttl_s = ttl_s
        self.work_bits = work_bits  # the identity work this swarm asks of every card
        self.view_size = view_size  # cards held at most ...
        self.probation_cards = view_size // 2  # ... of which of peers without standing
        self.clock = clock  # monotonic: probation failures expire by it
        self._lock = threading.RLock()
        self._read = threading.Condition(self._lock)  # notified at each roster read
        self._on_read = on_read
        self.cards: dict[str, RosterCard] = {}
        self.live: set[str] = set()  # as of the last roster read
        self.reads = 0  # roster reads so far (0: not yet) ...
        self.shard_reads = [0] * dht_rules.ROSTER_SHARDS  # ... and of each shard (a read takes a page)
        self.refused: Counter[str] = Counter()  # cards not taken, by reason
        self._heard: dict[str, BatchAnnouncement] = {}  # peer -> its newest announcement checked here
        self._heard_at: dict[str, float] = {}  # peer -> when (``clock``) it last signed something new here
        self._probation: OrderedDict[str, None] = OrderedDict()  # cards without standing, oldest first
        self._failed: OrderedDict[str, float] = OrderedDict()  # failed probation: peer -> refused until
        self._missed: set[str] = set()  # peers without standing that missed a round they were waited for
        self._ignored: BoundedSet[str] = BoundedSet(MAX_IGNORED_PEERS)
        self._incompatible: BoundedSet[str] = BoundedSet(MAX_IGNORED_PEERS)

    def __len__(self) -> int:
        with self._lock:
            return len(self.cards)

    def admit(self, peer: str, record: bytes, now: float) -> None:
        """A roster card record, read from the DHT or carried by a notice: into the roster if valid."""
        with self._lock:
            if peer == self.own_peer_id:
                return
            try:
                card, _ = codec.decode_message(
                    record, swarm_id=self.swarm_id, expected_type=limits.ROSTER_CARD, expected_peer_id=peer
                )
            except limits.ProtocolError as exc:
                self.refused[exc.reason] += 1
                self._ignore(peer, f"roster card rejected ({exc.reason})")
                return
            if not work.card_has_work(card, self.work_bits):
                self.refused["no_identity_work"] += 1
                self._ignore(peer, f"its identity lacks the swarm's proof of work ({self.work_bits} bits)")
                return
            if card.protocol_version != limits.PROTOCOL_VERSION:
                self._ignore(peer, f"speaks protocol v{card.protocol_version}")
                return
            if card_fingerprint(card) != self.fingerprint:  # skipped, never charged
                self._incompatible.add(peer)
                self.cards.pop(peer, None)
                self._ignore(peer, "another task mix or scorer version")
                return
            self._incompatible.discard(peer)
            try:
                limits.check_fresh(card.timestamp, now, max_age=self.ttl_s)
                seen_as = self.book.check_sequence(
                    peer, limits.ROSTER_CARD, card.seq, limits.payload_digest(record), card.timestamp
                )
            except limits.ProtocolError as exc:  # stale, future-dated or replayed: never live
                self.refused[exc.reason] += 1
                return
            if seen_as == "superseded":  # older than a card already admitted (a lagging replica's)
                return
            if card.offline:  # it stopped cleanly: not waited for, until a later online card says otherwise
                self._remove(peer)
            elif peer not in self.cards and self.book.is_graylisted(peer):  # no probation seat either
                self.refused["graylisted"] += 1
            elif peer in self.cards or self._make_room(peer):
                if self.cards.get(peer) != card:
                    self._heard_at[peer] = self.clock()
                self.cards[peer] = card

    def _make_room(self, peer: str) -> bool:
        """Room for a new card of ``peer`` (module docstring: allocation by standing); False: refused."""
        self._probation = OrderedDict((p, None) for p in self._probation if not self.book.has_standing(p))
        standing = self.book.has_standing(peer)
        full = len(self._probation) >= self.probation_cards
        if not standing and full or len(self.cards) >= self.view_size:
            quiet = [] if standing or full else [p for p in self._members_with_standing() if self._quiet(p)]
            if self._probation and (standing or full or not quiet):
                # the oldest probation card of the most crowded origin makes room (exchange/standing.py)
                self._remove(max(self._probation, key=self.book.crowding))
            elif not standing:  # members with standing hold more than their share: one gone quiet gives way
                if not quiet:  # never one heard from within a card lifetime: no eclipse by probation churn
                    self.refused["roster_full"] += 1
                    return False
                self._remove(self._least_useful(quiet))
            else:  # a member with standing returns: it displaces the least useful one it out-earned
                victim = self._least_useful(self._members_with_standing())
                if self.book.score(victim) > self.book.score(peer) - RETURN_MARGIN:
                    self.refused["roster_full"] += 1
                    return False
                self._remove(victim)
        if not standing:
            self._probation[peer] = None
        return True

    def _members_with_standing(self) -> list[str]:
        return [p for p in self.cards if p not in self._probation]

    def _quiet(self, peer: str) -> bool:
        """Not heard from here (a new card or announcement, by this node's clock) within a card lifetime."""
        return self.clock() - self._heard_at.get(peer, -float("inf")) > self.ttl_s

    def _least_useful(self, peers: list[str]) -> str:
        """By local measures only: the lowest score here, then the least recently heard from here."""
        return min(peers, key=lambda p: (self.book.score(p), self._heard_at.get(p, -float("inf"))))

    def fail_probation(self, peer: str) -> None:
        """``peer`` had no standing and its first chance failed (exchange/puller.py): for PROBATION_RETRY_S
        it comes after every peer still on its first chance."""
        with self._lock:
            if self.book.has_standing(peer):
                return
            self._failed.pop(peer, None)
            self._failed[peer] = self.clock() + PROBATION_RETRY_S
            while len(self._failed) > MAX_FAILED_PROBATION:
                self._failed.popitem(last=False)

    def failed_probation(self, peer: str) -> bool:
        """Whether ``peer``'s first chance failed (within PROBATION_RETRY_S)."""
        with self._lock:
            until = self._failed.get(peer)
            if until is None:
                return False
            if self.clock() < until and not self.book.has_standing(peer):
                return True
            del self._failed[peer]
            return False

    def _remove(self, peer: str) -> None:
        self.cards.pop(peer, None)
        self._probation.pop(peer, None)
        self._heard.pop(peer, None)
        self._heard_at.pop(peer, None)
        self._missed.discard(peer)
        self.live.discard(peer)

    def take_read(self, cards: list[tuple[str, bytes]], shards: list[int] | None = None) -> set[str]:
        """A roster read's (peer, card record) pairs, of ``shards`` (None: all): admit them, forget silent
        peers, recompute ``live`` (from every card held, not only this read's: a read that timed out, or a
        page of other shards, must not make peers vanish)."""
        now = time.time()
        with self._lock:
            for peer, record in cards:
                self.admit(peer, record, now)
            for peer in [p for p in self.cards if now - self._signed_last(p) > self.ttl_s]:
                self._remove(peer)
            self.live = {peer for peer in self.cards if self._is_live(peer, now)}
            self.reads += 1
            for shard in range(dht_rules.ROSTER_SHARDS) if shards is None else shards:
                self.shard_reads[shard] += 1
            self._read.notify_all()
            live = set(self.live)
        self._on_read()
        return live

    def wait_first_read(self, deadline: float) -> None:
        """Block until the roster was read once, at the latest at ``deadline`` (time.monotonic())."""
        with self._lock:
            while not self.reads and time.monotonic() < deadline:
                self._read.wait(max(deadline - time.monotonic(), 0.0))

    def wait_live(self, wanted: int, deadline: float, read_soon: Callable[[], None]) -> tuple[set[str], bool]:
        """Block until ``wanted`` peers are live, a live peer has started its rounds (``running_peer``) or
        ``deadline`` (time.monotonic()) passes, calling ``read_soon`` before each wait for a read. Returns
        the live peers and whether a running peer ended the wait."""
        with self._lock:
            running = False
            while len(self.live) < wanted and time.monotonic() < deadline:
                if running := self.running_peer():
                    break
                read_soon()
                self._read.wait(max(deadline - time.monotonic(), 0.0))
            return set(self.live), running

    def live_peers(self) -> set[str]:
        """The live peers as of the last roster read."""
        with self._lock:
            return set(self.live)

    def holds(self, peer: str) -> bool:
        """Whether ``peer`` has a card in the roster."""
        with self._lock:
            return peer in self.cards

    def cards_now(self) -> dict[str, RosterCard]:
        """The roster's cards, peer -> its newest card."""
        with self._lock:
            return dict(self.cards)

    def members_progress(self) -> dict[str, tuple[RosterCard, tuple[int, int, float]]]:
        """Each roster peer, sorted: its newest card and its ``progress``, read at one moment."""
        with self._lock:
            return {peer: (card, self.progress(peer)) for peer, card in sorted(self.cards.items())}

    def refusals(self) -> dict[str, int]:
        """Cards not taken so far, by reason."""
        with self._lock:
            return dict(self.refused)

    def to_wait_for(self) -> set[str]:
        """The live peers a round waits for (module docstring): those with standing; while none is live,
        those without it that have not missed a round yet."""
        with self._lock:
            standing = {peer for peer in self.live if self.book.has_standing(peer)}
            return standing or {peer for peer in self.live if peer not in self._missed}

    def running_peer(self) -> bool:
        """Whether a peer that is live now (not banned, signed within ``ttl_s`` / 2) has started its rounds:
        its newest signed message names round 1 or later. The swarm runs already, and a node that went on
        waiting for ``min_peers`` would only start a cohort behind it (32 loopback nodes: 11 waited out
        ``wait_for_peers_s`` while the other 21 ran all their rounds, docs/scaling.md). Only a peer with
        standing here or with a batch verified here counts: a claim alone costs one identity."""
        now = time.time()
        with self._lock:
            return any(
                self.progress(peer)[0] >= 1
                and self._is_live(peer, now)
                and (self.book.has_standing(peer) or self.book.delivered(peer))
                for peer in self.cards
            )

    def missed(self, peers: set[str]) -> None:
        """``peers`` were waited for and did not deliver: those without standing are not waited for again."""
        with self._lock:
            self._missed.update(p for p in peers if p in self.cards and not self.book.has_standing(p))

    def heard_from(self, peer: str, announcement: BatchAnnouncement) -> None:
        """A roster peer's new announcement passed its checks (signature, freshness): it is alive, at the
        round and policy version it announced."""
        with self._lock:
            heard = self._heard.get(peer)
            if peer in self.cards and (heard is None or announcement.timestamp > heard.timestamp):
                self._heard[peer] = announcement
                self._heard_at[peer] = self.clock()

    def progress(self, peer: str) -> tuple[int, int, float]:
        """(round, policy version, signed at) from ``peer``'s newest signed message checked here: its card
        or a batch announcement. A card is re-signed only every ``ttl_s`` / 4 (15 s to 112 s), carrying the
        round its node had then; an announcement comes every round."""
        with self._lock:
            card, heard = self.cards[peer], self._heard.get(peer)
            if heard is not None and heard.timestamp > card.timestamp:
                return heard.round, heard.policy_version, heard.timestamp
            return card.round, card.policy_version, card.timestamp

    def reads_of(self, peer: str) -> int:
        """Roster reads so far that took the shard holding ``peer``'s card."""
        with self._lock:
            return self.shard_reads[dht_rules.roster_shard(peer)]

    def knows(self, author: str, holder: str) -> bool:
        """Whether a notice from ``holder`` about ``author``'s batch is worth pulling: only compatible
        peers' batches are (the roster holds no others)."""
        with self._lock:
            return author in self.cards and holder not in self._incompatible

    def members(self) -> list[str]:
        """Peers in the roster, banned ones left out (whom to notify, whose announcements to poll)."""
        with self._lock:
            return [peer for peer in self.cards if not self.book.is_banned(peer)]

    def notice_targets(self, count: int = NOTICE_FANOUT, pullers: Sequence[str] = ()) -> list[str]:
        """Whom a new batch's notice goes to: ``count`` members on the ring of peers with standing
        (exchange/fanout.py), peers without standing only while the ring is short of them; then up to
        ``fanout.PULLER_NOTICES`` of ``pullers`` (the members that pulled our last batches, most recent
        first) not among those, members with standing first."""
        members = self.members()
        with_standing = {peer for peer in members if self.book.has_standing(peer)}
        standing = [peer for peer in members if peer in with_standing]
        others = [peer for peer in members if peer not in with_standing]
        targets = fanout.notice_targets(self.own_peer_id, standing, others, count)
        known = set(members) - {self.own_peer_id}
        wanting = sorted((p for p in pullers if p in known), key=lambda p: p not in with_standing)
        return fanout.with_pullers(targets, wanting)

    def _signed_last(self, peer: str) -> float:
        return self.progress(peer)[2]

    def _is_live(self, peer: str, now: float) -> bool:
        """Signed something within half a record lifetime and not banned (module docstring)."""
        return now - self._signed_last(peer) < self.ttl_s / 2 and not self.book.is_banned(peer)

    def _ignore(self, peer: str, why: str) -> None:
        """Say once per peer why its card is not taken."""
        if peer not in self._ignored:
            self._ignored.add(peer)
            log(f"ignoring peer {ascii(peer[:16])}...: {why}")
