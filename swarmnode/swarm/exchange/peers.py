"""Per-peer state at the network edge: who to trust how much.

A ``PeerBook`` remembers, for each peer id it has had to judge:

- **strikes and bans**: a strike costs reputation and score; ``strike_limit`` strikes ban the peer (and
  reset its strikes). Forgery-class offences and floods ban at once (``IMMEDIATE_BAN_REASONS``). The n-th
  ban of a peer lasts ``ban_base_s * ban_factor**(n - 1)`` seconds, capped at ``ban_max_s`` (60, 120,
  240, ... up to an hour with the defaults), so a repeat offender stays out longer each time while an
  honest peer that tripped once is back within a minute.
- **rate limits**: two token buckets per peer, one counting batches and one counting bytes, refilled
  continuously; ``allow`` spends from both or from neither.
- **sequence numbers**: the highest ``seq`` accepted per (peer, message type) and when it was signed, so
  a reused seq is a ``replay``, while the same record read twice, or an older one read after a newer
  one (a lagging DHT replica), is harmless and ignored.
- **reputation**: a float in [-1, 1], starting at 0, that rises slowly with accepted groups (``reward``)
  and falls with every strike. It confers no standing (that comes from the score). Read by ``snapshot``
  and by the serving slots (``Swarm.start``).
- **score and standing**: a measured, decaying score of what this node observed of the peer: credit for
  its groups this node trained on (``credit_trained``), penalties for failed pulls (``penalise``) and
  strikes, a colocation penalty by origin (``note_origin``), decay per round of this node (``tick_round``)
  and per second, zero after a ban. ``has_standing``, ``is_graylisted``, ``score`` and ``ranked`` read
  it; how standing is earned and lost, the thresholds and what they cost an attacker: exchange/standing.py.

Memory is bounded: at most ``max_peers`` peers are tracked; to make room for a new one the least recently
seen peer that is not banned and has no positive score is forgotten, failing that the one with the lowest
score (so a flood of fresh identities cannot push out the peers this node trained on), never by anything a
peer claims. Lookups (``is_banned``, ``score``, ``has_standing``, ``ranked``) never create an entry, so
probing with made-up peer ids costs nothing. The clock is monotonic and injectable; every method is safe
to call from several threads.

Who gets charged is the caller's decision (``exchange.verify``): only the peer that signed a message or
sent it over its own authenticated stream, never an id merely named in the bytes.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from swarmnode.swarm.exchange.standing import (
    COLOCATION_THRESHOLD,
    GRAYLIST_SCORE,
    PENALTIES,
    STANDING_SCORE,
    STRIKE_PENALTY,
    PeerScore,
    Scores,
)
from swarmnode.swarm.wire.limits import MAX_FRAME_BYTES, ProtocolError

log = logging.getLogger(__name__)

MiB = 1024 * 1024

# Offences that no honest node commits, even by accident, so one is enough for a ban:
# - bad_signature: the bytes came over the peer's authenticated stream and matched the hash it had
#   announced, yet do not verify: it is forging or serving tampered data;
# - peer_id_mismatch: it signed a body that names another peer (impersonation attempt);
# - wrong_sender: it served (or announced) a payload signed by someone else;
# - rate_limited: it sends faster than the limits any honest node stays within (a flood).
IMMEDIATE_BAN_REASONS = frozenset({"bad_signature", "peer_id_mismatch", "wrong_sender", "rate_limited"})

REPUTATION_MIN, REPUTATION_MAX = -1.0, 1.0
REPUTATION_PER_GROUP = 0.01  # an accepted group raises reputation slowly ...
REPUTATION_PER_STRIKE = 0.25  # ... a strike lowers it fast
_RECENT_DIGESTS = 8  # per (peer, type): recently accepted record digests, re-read as duplicates


@dataclass
class _Bucket:
    """A token bucket: ``capacity`` tokens, refilled at ``rate_per_s``."""

    capacity: float
    rate_per_s: float
    tokens: float
    updated: float

    def refill(self, now: float) -> None:
        if now > self.updated:
            self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate_per_s)
        self.updated = max(self.updated, now)


@dataclass
class _Peer:
    batches: _Bucket
    bytes: _Bucket
    last_seen: float
    reputation: float = 0.0
    strikes: float = 0.0
    ban_count: int = 0
    banned_until: float = -math.inf
    last_reason: str = ""
    accepted_groups: int = 0
    score: PeerScore = field(default_factory=PeerScore)
    # type -> (highest seq, its timestamp, recent digests)
    seqs: dict[str, tuple[int, float, deque[bytes]]] = field(default_factory=dict)


class PeerBook:
    """Strikes, bans, rate limits, sequence numbers, reputation and the score per peer id (module doc)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        *,
        ban_base_s: float = 60.0,
        ban_factor: float = 2.0,
        ban_max_s: float = 3600.0,
        strike_limit: int = 3,
        batch_rate_per_min: float = 240.0,  # above the receiver's own pull pace (one per peer per 0.5 s poll)
        byte_rate_per_min: float = 16 * MiB,
        burst: int = 16,
        max_peers: int = 4096,
        colocation_threshold: int = COLOCATION_THRESHOLD,
    ) -> None:
        """``burst`` batches may arrive back to back; the byte bucket holds the same burst's worth of
        bytes at the average allowed batch size, and never less than one maximum-size batch.
        ``colocation_threshold``: identities with a positive score one origin may hold without penalty
        (raise it for a lab cluster whose nodes share one network)."""
        checks = {
            "ban_base_s": ban_base_s > 0,
            "ban_factor": ban_factor >= 1,
            "ban_max_s": ban_max_s >= ban_base_s,
            "strike_limit": strike_limit >= 1,
            "batch_rate_per_min": batch_rate_per_min > 0,
            "byte_rate_per_min": byte_rate_per_min > 0,
            "burst": burst >= 1,
            "max_peers": max_peers >= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"PeerBook: {name} is out of range")
        self.clock = clock
        self.ban_base_s, self.ban_factor, self.ban_max_s = ban_base_s, ban_factor, ban_max_s
        self.strike_limit = strike_limit
        self.max_peers = max_peers
        self.burst = burst
        self._batch_capacity = float(burst)
        self._batch_rate = batch_rate_per_min / 60.0
        self._byte_capacity = max(float(MAX_FRAME_BYTES), byte_rate_per_min * burst / batch_rate_per_min)
        self._byte_rate = byte_rate_per_min / 60.0
        self._scores = Scores(clock(), colocation_threshold)
        self._peers: OrderedDict[str, _Peer] = OrderedDict()  # least recently seen first
        self._lock = threading.RLock()

    # --- bans ------------------------------------------------------------------------------------
    def is_banned(self, peer_id: str) -> bool:
        with self._lock:
            peer = self._peers.get(peer_id)
            return peer is not None and self.clock() < peer.banned_until

    def ban(self, peer_id: str, reason: str) -> float:
        """Ban ``peer_id`` for its next ban duration (growing with each ban); returns the duration."""
        with self._lock:
            now = self.clock()
            peer = self._touch(peer_id, now)
            peer.ban_count += 1
            try:
                duration = min(self.ban_max_s, self.ban_base_s * self.ban_factor ** (peer.ban_count - 1))
            except OverflowError:
                duration = self.ban_max_s
            peer.banned_until = now + duration
            peer.strikes = 0.0
            self._scores.reset(peer_id, peer.score, now)  # from zero: no standing until trained on again
            peer.last_reason = reason
            peer.reputation = max(REPUTATION_MIN, peer.reputation - REPUTATION_PER_STRIKE)
            log.warning(
                "banned peer %s for %.0f s (ban #%d, reason: %s)", peer_id, duration, peer.ban_count, reason
            )
            return duration

    def bans(self) -> list[tuple[str, float, int, str]]:
        """Peers banned now: (peer id, seconds left, number of bans so far, last reason), longest first."""
        with self._lock:
            now = self.clock()
            out = [
                (peer_id, p.banned_until - now, p.ban_count, p.last_reason)
                for peer_id, p in self._peers.items()
                if now < p.banned_until
            ]
            return sorted(out, key=lambda b: -b[1])

    # --- reputation ----------------------------------------------------------------------------
    def strike(self, peer_id: str, reason: str, weight: float = 1.0) -> bool:
        """Charge ``peer_id`` for an offence; returns True if the peer is banned now.

        Reasons in ``IMMEDIATE_BAN_REASONS`` ban at once; others add ``weight`` strikes and ban when the
        strikes reach ``strike_limit``.
        """
        with self._lock:
            now = self.clock()
            peer = self._touch(peer_id, now)
            peer.last_reason = reason
            peer.reputation = max(REPUTATION_MIN, peer.reputation - REPUTATION_PER_STRIKE * weight)
            if now >= peer.banned_until:  # while banned its score stays zero
                self._scores.charge(peer_id, peer.score, STRIKE_PENALTY * weight, now)
            if reason in IMMEDIATE_BAN_REASONS:
                self.ban(peer_id, reason)
            else:
                peer.strikes += weight
                if peer.strikes >= self.strike_limit:
                    self.ban(peer_id, reason)
            return now < peer.banned_until

    def reward(self, peer_id: str, n_groups: int = 1) -> None:
        """Count ``n_groups`` verified, accepted groups of ``peer_id`` (reputation; no standing: only groups
        trained on earn that, ``credit_trained``)."""
        with self._lock:
            peer = self._touch(peer_id, self.clock())
            peer.accepted_groups += n_groups
            peer.reputation = min(REPUTATION_MAX, peer.reputation + REPUTATION_PER_GROUP * n_groups)

    def delivered(self, peer_id: str) -> bool:
        """Whether a verified group of ``peer_id`` was accepted here (``reward``) and it is not banned now."""
        with self._lock:
            peer = self._peers.get(peer_id)
            return peer is not None and peer.accepted_groups > 0 and self.clock() >= peer.banned_until

    # --- score and standing (exchange/standing.py) -----------------------------------------------
    def credit_trained(self, peer_id: str, n_groups: int = 1) -> None:
        """Credit ``peer_id`` for ``n_groups`` of its groups this node trained on that carried signal
        (nonzero advantage after its own scoring and peer defence), up to ``standing.SCORE_CAP``. Called by
        the round after its step, with at most J groups a round in all (``standing.standing_bound`` relies
        on it). Nothing
        while the peer is banned."""
        if n_groups <= 0:
            return
        with self._lock:
            now = self.clock()
            peer = self._touch(peer_id, now)
            if now >= peer.banned_until:
                self._scores.credit(peer_id, peer.score, n_groups, now)

    def penalise(self, peer_id: str, reason: str) -> None:
        """Charge ``peer_id`` ``PENALTIES[reason]`` of score: "pull_timeout", "pull_failed" or
        "served_other_bytes" (``strike`` charges STRIKE_PENALTY itself). Nothing while the peer is banned:
        it starts from zero after its ban."""
        if reason not in PENALTIES:
            raise ValueError(f"PeerBook.penalise: unknown reason {reason!r}; known: {sorted(PENALTIES)}")
        with self._lock:
            now = self.clock()
            peer = self._touch(peer_id, now)
            if now >= peer.banned_until:
                self._scores.charge(peer_id, peer.score, PENALTIES[reason], now)

    def note_origin(self, peer_id: str, origin: str | None) -> None:
        """``peer_id`` was seen from ``origin`` (net/origins.py ``origin_of``), for the colocation penalty.
        None (loopback while exempt, relayed, not IP) says nothing and keeps a known origin."""
        if origin is None:
            return
        with self._lock:
            now = self.clock()
            self._scores.set_origin(peer_id, self._touch(peer_id, now).score, origin, now)

    def tick_round(self) -> None:
        """One round of this node has passed (call once a round): every score decays by
        2 ** (-1 / SCORE_HALF_LIFE_ROUNDS)."""
        with self._lock:
            self._scores.tick_round(self.clock())

    def score(self, peer_id: str) -> float:
        """``peer_id``'s score now (exchange/standing.py); 0.0 for a peer not tracked."""
        with self._lock:
            return self._score(peer_id, self.clock())

    def has_standing(self, peer_id: str) -> bool:
        """Whether ``peer_id``'s score is at least STANDING_SCORE and it is not banned now."""
        with self._lock:
            now = self.clock()
            peer = self._peers.get(peer_id)
            if peer is None or now < peer.banned_until:
                return False
            return self._score(peer_id, now) >= STANDING_SCORE

    def is_graylisted(self, peer_id: str) -> bool:
        """Whether ``peer_id`` is banned or scores below GRAYLIST_SCORE: its card gets no new roster seat
        (exchange/roster.py)."""
        with self._lock:
            now = self.clock()
            peer = self._peers.get(peer_id)
            if peer is None:
                return False
            return now < peer.banned_until or self._score(peer_id, now) < GRAYLIST_SCORE

    def origin_of(self, peer_id: str) -> str | None:
        """The origin ``peer_id`` was last seen from (``note_origin``); None if unknown."""
        with self._lock:
            peer = self._peers.get(peer_id)
            return None if peer is None else peer.score.origin

    def crowding(self, peer_id: str) -> int:
        """Identities tracked here from ``peer_id``'s origin (``Scores.crowding``; 0 for one not tracked)."""
        with self._lock:
            peer = self._peers.get(peer_id)
            return 0 if peer is None else self._scores.crowding(peer.score)

    def newcomers(self, peer_ids: Iterable[str]) -> list[str]:
        """Of ``peer_ids``, those without standing, not banned, whose origin may have the newcomer's place
        among a round's groups now (exchange/standing.py), the least crowded origin first; the order given
        among equals."""
        with self._lock:
            tracked = [(p, self._peers[p].score) for p in peer_ids if p in self._peers]
            ready = [(p, parts) for p, parts in tracked if not self.has_standing(p) and not self.is_banned(p)]
            ready = [(p, parts) for p, parts in ready if self._scores.may_take_newcomer_place(parts)]
            return [p for p, parts in sorted(ready, key=lambda item: self._scores.crowding(item[1]))]

    def grant_newcomer(self, peer_id: str) -> None:
        """``peer_id`` took the newcomer's place of a round: its origin waits NEWCOMER_ORIGIN_ROUNDS."""
        with self._lock:
            if peer_id in self._peers:
                self._scores.grant_newcomer_place(self._peers[peer_id].score)

    def ranked(self, peer_ids: Iterable[str]) -> list[str]:
        """``peer_ids`` highest score first; equal scores keep the order given (the caller's own order,
        e.g. freshest first), so nothing a peer signs about itself decides."""
        with self._lock:
            now = self.clock()
            peer_ids = list(peer_ids)
            scores = {peer_id: self._score(peer_id, now) for peer_id in peer_ids}
            return sorted(peer_ids, key=lambda peer_id: -scores[peer_id])

    def reputation(self, peer_id: str) -> float:
        with self._lock:
            peer = self._peers.get(peer_id)
            return 0.0 if peer is None else peer.reputation

    # --- rate limits ---------------------------------------------------------------------------
    def allow(self, peer_id: str, n_bytes: int) -> bool:
        """Spend one batch token and ``n_bytes`` byte tokens of ``peer_id``'s buckets, or none of them.

        False means the peer is over its rate: the caller rejects the data as ``rate_limited`` (and
        strikes the peer, which bans it: see ``IMMEDIATE_BAN_REASONS``).
        """
        with self._lock:
            now = self.clock()
            peer = self._touch(peer_id, now)
            peer.batches.refill(now)
            peer.bytes.refill(now)
            n_bytes = max(0, n_bytes)
            if peer.batches.tokens < 1.0 or peer.bytes.tokens < n_bytes:
                return False
            peer.batches.tokens -= 1.0
            peer.bytes.tokens -= n_bytes
            return True

    # --- sequence numbers ----------------------------------------------------------------------
    def check_sequence(
        self, peer_id: str, msg_type: str, seq: int, digest: bytes, timestamp: float
    ) -> Literal["new", "duplicate", "superseded"]:
        """Record a verified message's ``seq``; PROTOCOL.md section 7.

        "duplicate": the same message again (``digest`` of its bytes seen recently: e.g. a DHT record read
        twice); "new": seq above the highest seen (now recorded); "superseded": a lower seq signed before
        the highest (its ``timestamp`` is older: a copy a DHT replica still holds, or a pull that finished
        after a newer one), ignored. Otherwise raises ``ProtocolError("replay")``: a seq not above the
        highest, signed at or after it, which only its signer can make (a reused seq).
        """
        with self._lock:
            peer = self._touch(peer_id, self.clock())
            last = peer.seqs.get(msg_type)
            if last is not None:
                highest, highest_timestamp, digests = last
                if digest in digests:
                    return "duplicate"
                if seq <= highest:
                    if timestamp < highest_timestamp:
                        return "superseded"
                    raise ProtocolError("replay", f"{msg_type} seq {seq} <= {highest} already seen")
            else:
                digests = deque(maxlen=_RECENT_DIGESTS)
            digests.append(bytes(digest))
            peer.seqs[msg_type] = (seq, timestamp, digests)
            return "new"

    # --- status --------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Counts and per-peer state, for ``swarmnode status`` and metrics."""
        with self._lock:
            now = self.clock()
            peers = {
                peer_id: {
                    "reputation": p.reputation,
                    "strikes": p.strikes,
                    "bans": p.ban_count,
                    "banned_for_s": max(0.0, p.banned_until - now),
                    "last_reason": p.last_reason,
                    "accepted_groups": p.accepted_groups,
                    "score": self._score(peer_id, now),
                }
                for peer_id, p in self._peers.items()
            }
            return {
                "tracked_peers": len(peers),
                "banned_peers": sum(1 for p in peers.values() if p["banned_for_s"] > 0),
                "bans_total": sum(p["bans"] for p in peers.values()),
                "peers": peers,
            }

    def __len__(self) -> int:
        return len(self._peers)

    def __contains__(self, peer_id: object) -> bool:
        return peer_id in self._peers

    # --- internals -----------------------------------------------------------------------------
    def _touch(self, peer_id: str, now: float) -> _Peer:
        """The peer's entry, created if needed (evicting one if full), marked as seen now."""
        peer = self._peers.get(peer_id)
        if peer is None:
            if len(self._peers) >= self.max_peers:
                self._evict(now)
            peer = _Peer(
                batches=_Bucket(self._batch_capacity, self._batch_rate, self._batch_capacity, now),
                bytes=_Bucket(self._byte_capacity, self._byte_rate, self._byte_capacity, now),
                last_seen=now,
                score=self._scores.new(now),
            )
            self._peers[peer_id] = peer
        else:
            self._peers.move_to_end(peer_id)
            peer.last_seen = now
        return peer

    def _evict(self, now: float) -> None:
        """Forget the least recently seen peer that is not banned and has no positive score; failing that
        the one not banned with the lowest score (the least recently seen of equals); if all are banned,
        the earliest to expire."""

        def unbanned() -> Iterator[str]:  # least recently seen first
            return (pid for pid, p in self._peers.items() if now >= p.banned_until)

        victim = next((pid for pid in unbanned() if self._score(pid, now) <= 0.0), None)
        if victim is None:  # every peer not banned has a positive score
            victim = min(unbanned(), key=lambda pid: self._score(pid, now), default=None)
        if victim is None:
            victim = min(self._peers, key=lambda pid: self._peers[pid].banned_until)
        self._scores.drop(victim, self._peers.pop(victim).score)

    def _score(self, peer_id: str, now: float) -> float:
        peer = self._peers.get(peer_id)
        return 0.0 if peer is None else self._scores.value(peer_id, peer.score, now)
