"""Who is in the swarm, as this node knows it: the only owner of membership state.

A peer enters the roster with a valid roster card (``admit``: read from the DHT or carried by a notice),
and stays while it signs something this node checks: a fresh card, or an announcement (``heard_from``;
a loaded DHT's roster reads time out, announcements still arrive). A peer silent for a record lifetime
(``ttl_s``) is forgotten, so churn does not pile up. *Live* peers (``live``, recomputed at each roster
read: ``take_read``) are those that signed something within half a lifetime and are not banned: the ones
a round waits for. A crashed peer lingers until its card expires; an OFFLINE card removes it at once.

Cards are checked alike wherever they come from: signature and sender, protocol version, task
fingerprint (peers of another task mix or scorer version are ``incompatible``: skipped, never charged),
freshness and sequence number (an older card than one admitted is ignored). At most ``MAX_ROSTER_PEERS``
cards are held; refusals are counted by reason in ``refused``. Every method takes ``lock`` (shared with
the exchange's state): the round thread reads the roster for status and waits, the service thread admits.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from swarmnode.common import BoundedSet, log
from swarmnode.swarm.exchange.peers import PeerBook
from swarmnode.swarm.exchange.verify import card_fingerprint
from swarmnode.swarm.wire import codec, dht_rules, limits
from swarmnode.swarm.wire.protocol import RosterCard

MAX_IGNORED_PEERS = 4096  # peers whose card was refused (or incompatible), remembered so each is said once
# roster cards kept at most: every shard full (the DHT's storing nodes hold no more per shard)
MAX_ROSTER_PEERS = dht_rules.ROSTER_SHARDS * dht_rules.MAX_SUBKEYS_PER_KEY


class Roster:
    def __init__(
        self,
        *,
        own_peer_id: str,
        swarm_id: str,
        fingerprint: str,
        book: PeerBook,
        ttl_s: float,
        lock: threading.RLock,
        changed: threading.Condition,
    ):
        self.own_peer_id = own_peer_id
        self.swarm_id = swarm_id
        self.fingerprint = fingerprint  # our task mix's: cards naming another are incompatible
        self.book = book
        self.ttl_s = ttl_s
        self.lock = lock
        self.changed = changed
        self.cards: dict[str, RosterCard] = {}
        self.live: set[str] = set()  # as of the last roster read
        self.reads = 0  # roster reads so far (0: not yet)
        self.refused: Counter[str] = Counter()  # cards not taken, by reason
        self._heard: dict[str, float] = {}  # peer -> when it signed its newest announcement checked here
        self._ignored: BoundedSet[str] = BoundedSet(MAX_IGNORED_PEERS)
        self._incompatible: BoundedSet[str] = BoundedSet(MAX_IGNORED_PEERS)

    def __len__(self) -> int:
        with self.lock:
            return len(self.cards)

    def admit(self, peer: str, record: bytes, now: float) -> None:
        """A roster card record, read from the DHT or carried by a notice: into the roster if valid."""
        with self.lock:
            if peer == self.own_peer_id:
                return
            if peer not in self.cards and len(self.cards) >= MAX_ROSTER_PEERS:
                self.refused["roster_full"] += 1
                return
            try:
                card, _ = codec.decode_message(
                    record, swarm_id=self.swarm_id, expected_type=limits.ROSTER_CARD, expected_peer_id=peer
                )
            except limits.ProtocolError as exc:
                self.refused[exc.reason] += 1
                self._ignore(peer, f"roster card rejected ({exc.reason})")
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
                self.cards.pop(peer, None)
            else:
                self.cards[peer] = card

    def take_read(self, cards: list[tuple[str, bytes]]) -> set[str]:
        """A roster read's (peer, card record) pairs: admit them, forget silent peers, recompute ``live``
        (from every card held, not only this read's: a read that timed out must not make peers vanish)."""
        now = time.time()
        with self.lock:
            for peer, record in cards:
                self.admit(peer, record, now)
            for peer in [p for p in self.cards if now - self._signed_last(p) > self.ttl_s]:
                del self.cards[peer]
            for peer in [p for p in self._heard if p not in self.cards]:
                del self._heard[peer]
            self.live = {
                peer
                for peer in self.cards
                if now - self._signed_last(peer) < self.ttl_s / 2 and not self.book.is_banned(peer)
            }
            self.reads += 1
            self.changed.notify_all()
            return set(self.live)

    def heard_from(self, peer: str, signed_at: float) -> None:
        """A roster peer's new announcement passed its checks (signature, freshness): it is alive."""
        with self.lock:
            if peer in self.cards:
                self._heard[peer] = max(self._heard.get(peer, 0.0), signed_at)

    def knows(self, author: str, holder: str) -> bool:
        """Whether a notice from ``holder`` about ``author``'s batch is worth pulling: only compatible
        peers' batches are (the roster holds no others)."""
        with self.lock:
            return author in self.cards and holder not in self._incompatible

    def members(self) -> list[str]:
        """Peers in the roster, banned ones left out (whom to notify, whose announcements to poll)."""
        with self.lock:
            return [peer for peer in self.cards if not self.book.is_banned(peer)]

    def _signed_last(self, peer: str) -> float:
        return max(self.cards[peer].timestamp, self._heard.get(peer, 0.0))

    def _ignore(self, peer: str, why: str) -> None:
        """Say once per peer why its card is not taken."""
        if peer not in self._ignored:
            self._ignored.add(peer)
            log(f"ignoring peer {ascii(peer[:16])}...: {why}")
