"""Standing: how a peer earns it and loses it (a measured, decaying score), and what peers without it
may make this node spend, all of them together.

Identities cost only their proof of work, so a bound per identity is no bound against a flood of them.
Standing follows a score of what THIS node observed of a peer, never what the peer says of itself
(modelled on gossipsub v1.1's peer score: time-decayed counters, capped credit for useful deliveries,
penalties for failures, an IP-colocation factor, decay to zero, graylisting). ``PeerBook`` (peers.py)
keeps one per peer, under its lock, and answers for it; ``Scores`` is the arithmetic:

    score = credit - penalty - colocation

- *credit*: TRAINED_GROUP_CREDIT for each group of the peer that this node TRAINED ON and that carried
  signal (nonzero advantage after the node's own scoring and peer defence): ``PeerBook.credit_trained``,
  called by the round after its step. Accepting a verified group (``PeerBook.reward``) earns nothing:
  canned text that passes verification and is dropped, or never trained on, must not buy resources.
  Capped at SCORE_CAP.
- *penalty*: PENALTIES[reason] for a pull from the peer that timed out, failed or served other bytes
  (``PeerBook.penalise``); STRIKE_PENALTY per strike weight.
- *colocation*: when more than COLOCATION_THRESHOLD identities whose credit outweighs their penalty were
  seen from one origin (``PeerBook.note_origin``: an IPv4 /24 or IPv6 /48, net/origins.py), every identity
  of that origin loses COLOCATION_WEIGHT x surplus**2 (gossipsub's P6): addresses cost, identities do not.
  An unknown origin (None: loopback while exempt, relayed) is exempt and never erases a known one.
- *a ban* sets credit and penalty to zero, and while banned neither changes: after it the peer starts from
  zero, with no standing until it is trained on again (a ban does not merely suspend standing).
- *decay*: credit and penalty halve every SCORE_HALF_LIFE_ROUNDS rounds of this node (``tick_round``,
  called once a round) and every SCORE_HALF_LIFE_S seconds of local monotonic time, both at once; values
  under DECAY_TO_ZERO become zero. Applied lazily (an exponent of the rounds and seconds passed).

Why rounds first: what a peer earns is being trained on, and a node trains at most J peer groups a ROUND,
whether its rounds take 2 s (tiny test models) or 60 s and more (SmolLM2 on CPU). A half-life in seconds
short enough to matter at 2 s rounds would strip an honest peer of a 60 s-round node between two of the
rounds that train on it; one long enough for 60 s rounds would let standing outlive 1000 rounds of a fast
node. Counted in rounds, "trained on within the last few rounds" means the same on both. The long
half-life in seconds is the backstop for a node whose rounds stall or take many minutes: standing still
ends within a stated time. At 60 s rounds it adds a quarter to the per-round decay.

Thresholds (``PeerBook.has_standing``: score >= STANDING_SCORE and not banned; ``PeerBook.is_graylisted``:
banned or score < GRAYLIST_SCORE: its card gets no new roster seat (exchange/roster.py); probation in
between):

- one credit is twice STANDING_SCORE: a peer trained on once has standing at once (an honest newcomer, in
  the round it is first trained on) and keeps it one half-life (8 rounds) without being trained again;
  trained on once a round, or every 6 rounds of a 60 s-round node, it never loses it;
- from SCORE_CAP (8 x STANDING_SCORE) a peer never trained again loses standing after
  SILENT_STANDING_ROUNDS (24) rounds of this node or SILENT_STANDING_S (90 min), whichever comes first;
  5 consecutive pull timeouts take it away at the cap, while one does not undo what a peer earned;
- GRAYLIST_SCORE: one timeout leaves a newcomer on probation (an honest node's slow first pull), two, or
  one strike, graylist it until the penalty decays (about 5 and 8 rounds).

What an attacker pays: a group earns credit only once this node trained on it, and a node trains on at
most J peer groups a round (at most ``pool.producer_cap(J)`` of one producer, only groups with signal), so
at most J identities a round gain standing, each by delivering groups worth training on; decay means each
must go on being trained on. Credit added is at most J a round and shrinks by the round decay, so at most
``standing_bound(J)`` (about 24 J) identities hold standing at any moment, whatever the number of
identities or their proof of work, and more than COLOCATION_THRESHOLD of them need as many networks. Order
and eviction follow the score (``PeerBook.ranked``), never a field a peer signs.

Allocation by standing
----------------------
Peers without standing share one *probation* share of each resource, however many they are; peers with
standing keep the rest:

- roster cards: at most half the view (``PROBATION_CARDS`` of the default ``roster.VIEW_SIZE``); a newer
  probation card replaces the oldest one (exchange/roster.py), so a flood churns through its own cards, an
  honest newcomer's card still gets in the moment it is read, and the members with standing keep the
  other half;
- pending pulls: at most ``PROBATION_PENDING`` batches of such authors, and ``PENDING_PER_AUTHOR`` of
  any one author; past either, the newest candidate is dropped, never an older entry
  (exchange/puller.py); ``PROBATION_PULLS`` parallel pulls of their own, one try per holder; an
  identity whose first pull was silent or lying goes behind every identity still on its first chance
  (``Roster.fail_probation``), so a flood of n silent identities delays a newcomer by at most n pulls;
- scoring CPU: a token bucket of CPU seconds per share (``ScoringBudget``): peers with standing together
  refill ``STANDING_SCORE_CPU_PER_S``, peers without ``PROBATION_SCORE_CPU_PER_S``; a batch is pulled only
  when its share holds ``MIN_SCORE_CPU_S``, and scored within what the share holds;
- waiting: a peer without standing holds a round only while no live peer has standing here, and only
  until its first miss (exchange/roster.py ``to_wait_for``);
- newcomers by origin: ``Scores.crowding`` counts the identities tracked here from each origin (those of
  no known origin together, as one). First chances to be pulled go to the least crowded origins first
  (exchange/puller.py), and the newcomer's place among a round's J groups (exchange/pool.py) only to an
  origin holding at most COLOCATION_THRESHOLD identities here that had no such place within
  NEWCOMER_ORIGIN_ROUNDS rounds: a flood from a few networks never takes it, an honest newcomer from a
  network of its own takes it in its first round with a group to train on, and an attacker needs a
  network for each place it takes in NEWCOMER_ORIGIN_ROUNDS rounds (one group of the round's J).
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

# --- the score (module docstring) ---------------------------------------------------------------
TRAINED_GROUP_CREDIT = 1.0  # per peer group this node trained on, with signal
# has_standing at or above: half a credit, so one credit holds standing for one half-life
STANDING_SCORE = 0.5
# credit held at most: 8 x STANDING_SCORE, so a silent peer keeps standing at most 3 half-lives, and a
# peer at the cap loses it within 5 pull timeouts
SCORE_CAP = 4.0
# credit and penalty halve every this many rounds of this node (tick_round): the pace of what earns
# standing; a peer trained on every 6 rounds (or less often, once it built credit) keeps standing ...
SCORE_HALF_LIFE_ROUNDS = 8
# ... and every this many seconds of local monotonic time: the backstop when rounds stall or are long
SCORE_HALF_LIFE_S = 1800.0
DECAY_TO_ZERO = 0.01  # a decayed credit or penalty under this is zero (gossipsub's DecayToZero)
# below this a peer is graylisted: two timeouts or one strike of a newcomer; one timeout is not
GRAYLIST_SCORE = -1.0
STRIKE_PENALTY = 2.0  # per strike weight: at the cap, two strikes end standing and three ban
# what ``PeerBook.penalise`` charges, per reason: a pull that held a slot for its whole timeout (5 end
# standing at the cap); one that failed (closed, unreachable: what an honest peer behind NAT gives some of
# its peers, so it costs little); bytes other than announced, where the caller does not strike them
PENALTIES = {"pull_timeout": 0.75, "pull_failed": 0.1, "served_other_bytes": STRIKE_PENALTY}
# identities with a positive score seen from one origin (/24, /48) that cost nothing: a household or a
# small lab (raise PeerBook's colocation_threshold for a cluster on one network); past it each of them
# loses COLOCATION_WEIGHT x surplus**2: 12 on one origin lose standing even at the cap, 20 are graylisted
COLOCATION_THRESHOLD = 8
COLOCATION_WEIGHT = 0.25
# how long a peer at the cap that is never trained again keeps standing, by rounds or by time alone
SILENT_STANDING_ROUNDS = round(SCORE_HALF_LIFE_ROUNDS * math.log2(SCORE_CAP / STANDING_SCORE))  # 24
SILENT_STANDING_S = SCORE_HALF_LIFE_S * math.log2(SCORE_CAP / STANDING_SCORE)  # 5400 s
# an origin that had a newcomer's place among a round's groups has none again for this many rounds
NEWCOMER_ORIGIN_ROUNDS = SCORE_HALF_LIFE_ROUNDS
_ROUND_DECAY = 2.0 ** (-1.0 / SCORE_HALF_LIFE_ROUNDS)


def standing_bound(peer_groups: int) -> int:
    """The most identities that can hold standing at once when a round trains on ``peer_groups`` (J) peer
    groups: credit added is at most J x TRAINED_GROUP_CREDIT a round and shrinks by the round decay, so all
    credit together stays under J x TRAINED_GROUP_CREDIT / (1 - decay), and standing needs STANDING_SCORE
    of it (about 24 J)."""
    return math.floor(peer_groups * TRAINED_GROUP_CREDIT / (STANDING_SCORE * (1.0 - _ROUND_DECAY)))


@dataclass
class PeerScore:
    """One peer's score parts, as of decay age ``age`` (``Scores``)."""

    credit: float = 0.0
    penalty: float = 0.0
    age: float = 0.0
    origin: str | None = None
    counted: str | None = None  # the origin it counts for in the colocation counts, if any


class Scores:
    """The score arithmetic (module docstring): decay, credit, penalties, resets, colocation counts. Not
    thread-safe: ``PeerBook`` calls it under its lock, and decides whom it charges or credits (bans)."""

    def __init__(self, started: float, colocation_threshold: int = COLOCATION_THRESHOLD):
        if colocation_threshold < 0:
            raise ValueError("colocation_threshold must be >= 0")
        self.colocation_threshold = colocation_threshold
        self._started = started
        self._rounds = 0
        # identities of a known origin whose credit outweighs their penalty, and how many per origin:
        # kept at each change of a peer's parts and, for decay, at each round (a decayed one counts until)
        self._positive: dict[str, PeerScore] = {}
        self._per_origin: Counter[str] = Counter()
        self._tracked: Counter[str | None] = Counter()  # identities tracked per origin (None: unknown)
        self._granted: dict[str | None, int] = {}  # origin -> the round of its last newcomer's place

    def new(self, now: float) -> PeerScore:
        _add(self._tracked, None, 1)
        return PeerScore(age=self._age(now))

    def tick_round(self, now: float) -> None:
        self._rounds += 1
        for origin, granted in list(self._granted.items()):
            if self._rounds - granted >= NEWCOMER_ORIGIN_ROUNDS:
                del self._granted[origin]
        for peer_id, parts in list(self._positive.items()):
            self._settle(peer_id, parts, now)

    def value(self, peer_id: str, parts: PeerScore, now: float) -> float:
        """The score now."""
        self._settle(peer_id, parts, now)
        score = parts.credit - parts.penalty
        if parts.origin is not None:
            surplus = self._per_origin[parts.origin] - self.colocation_threshold
            if surplus > 0:
                score -= COLOCATION_WEIGHT * surplus**2
        return score

    def credit(self, peer_id: str, parts: PeerScore, n_groups: int, now: float) -> None:
        self._settle(peer_id, parts, now)
        parts.credit = min(SCORE_CAP, parts.credit + TRAINED_GROUP_CREDIT * max(n_groups, 0))
        self._recount(peer_id, parts)

    def charge(self, peer_id: str, parts: PeerScore, penalty: float, now: float) -> None:
        self._settle(peer_id, parts, now)
        parts.penalty += max(penalty, 0.0)
        self._recount(peer_id, parts)

    def reset(self, peer_id: str, parts: PeerScore, now: float) -> None:
        """Zero (a ban): no credit, no penalty."""
        parts.credit = parts.penalty = 0.0
        parts.age = self._age(now)
        self._recount(peer_id, parts)

    def set_origin(self, peer_id: str, parts: PeerScore, origin: str | None, now: float) -> None:
        """``origin``, unless None (it says nothing: a known origin stays)."""
        if origin is not None and origin != parts.origin:
            _add(self._tracked, parts.origin, -1)
            _add(self._tracked, origin, 1)
            parts.origin = origin
            self._settle(peer_id, parts, now)

    def crowding(self, parts: PeerScore) -> int:
        """Identities tracked here from the origin of ``parts`` (of no known origin: all such together)."""
        return self._tracked[parts.origin]

    def may_take_newcomer_place(self, parts: PeerScore) -> bool:
        """Whether its origin may have the newcomer's place now (module docstring)."""
        return self.crowding(parts) <= self.colocation_threshold and parts.origin not in self._granted

    def grant_newcomer_place(self, parts: PeerScore) -> None:
        self._granted[parts.origin] = self._rounds

    def drop(self, peer_id: str, parts: PeerScore) -> None:
        """``peer_id`` is no longer tracked: it leaves every count."""
        self.forget(peer_id)
        _add(self._tracked, parts.origin, -1)

    def forget(self, peer_id: str) -> None:
        """``peer_id`` leaves the colocation counts."""
        parts = self._positive.pop(peer_id, None)
        if parts is not None:
            self._count(parts.counted, -1)
            parts.counted = None

    def _age(self, now: float) -> float:
        """Half-lives passed since the book started, by rounds and by local time (module docstring)."""
        return self._rounds / SCORE_HALF_LIFE_ROUNDS + max(now - self._started, 0.0) / SCORE_HALF_LIFE_S

    def _settle(self, peer_id: str, parts: PeerScore, now: float) -> None:
        """Decay the parts to now (to zero under DECAY_TO_ZERO) and bring the colocation counts up to date."""
        age = self._age(now)
        if age > parts.age:
            factor = 2.0 ** (parts.age - age)
            parts.credit = _decayed(parts.credit, factor)
            parts.penalty = _decayed(parts.penalty, factor)
            parts.age = age
        self._recount(peer_id, parts)

    def _recount(self, peer_id: str, parts: PeerScore) -> None:
        """Count ``peer_id`` for its origin while its credit outweighs its penalty (decay keeps the sign:
        both shrink by one factor)."""
        counted = parts.origin if parts.origin is not None and parts.credit > parts.penalty else None
        if counted == parts.counted:
            return
        self.forget(peer_id)
        if counted is not None:
            parts.counted = counted
            self._positive[peer_id] = parts
            self._count(counted, 1)

    def _count(self, origin: str | None, delta: int) -> None:
        if origin is not None:
            _add(self._per_origin, origin, delta)


def _add(counts: Counter, key: str | None, delta: int) -> None:
    """``counts[key] += delta``, the key gone at zero (the counts stay as small as what they count)."""
    counts[key] += delta
    if counts[key] <= 0:
        del counts[key]


def _decayed(value: float, factor: float) -> float:
    value *= factor
    return value if abs(value) >= DECAY_TO_ZERO else 0.0


# --- allocation by standing: the probation share (module docstring) ---------------------------------
PROBATION_CARDS = 64  # roster cards of peers without standing (of roster.VIEW_SIZE)
PROBATION_PENDING = 64  # pending batches whose authors have no standing (of puller.MAX_PENDING)
PENDING_PER_AUTHOR = 4  # pending batches of one author (an honest node publishes one a round)
# parallel pulls of batches whose authors have no standing (beside puller.MAX_PARALLEL_PULLS): with one
# try each, a flood of n silent identities is used up in n / PROBATION_PULLS pull timeouts
PROBATION_PULLS = 16

# Scoring CPU, per share: seconds of the verifier thread's CPU refilled per second, and the most a share
# holds. Honest batches cost milliseconds each (tests/unit/test_scorer_audit.py), so neither share is
# ever empty in an honest swarm; a worst-case batch costs the per-batch budget (verify.SCORE_BUDGET_CPU_S).
STANDING_SCORE_CPU_PER_S = 0.5  # half a core for everyone with standing together
STANDING_SCORE_CPU_S = 4.0
PROBATION_SCORE_CPU_PER_S = 0.1  # a tenth of a core for everyone without standing together
PROBATION_SCORE_CPU_S = 2.0
MIN_SCORE_CPU_S = 0.25  # a batch is pulled (and scored) only when its share holds this much
# share (has standing?) -> (refill per second, capacity)
_SHARES = {
    True: (STANDING_SCORE_CPU_PER_S, STANDING_SCORE_CPU_S),
    False: (PROBATION_SCORE_CPU_PER_S, PROBATION_SCORE_CPU_S),
}


class ScoringBudget:
    """CPU seconds the verifier may spend scoring, per share (module docstring). Thread-safe."""

    def __init__(self, has_standing: Callable[[str], bool], clock: Callable[[], float] = time.monotonic):
        self._has_standing = has_standing
        self._clock = clock
        self._lock = threading.Lock()
        now = clock()
        self._shares = {share: [cap, now] for share, (_, cap) in _SHARES.items()}  # [tokens, updated], full

    def available(self, author: str) -> float:
        """CPU seconds the share of ``author`` holds now."""
        with self._lock:
            return self._refill(self._has_standing(author))

    def can_score(self, author: str) -> bool:
        return self.available(author) >= MIN_SCORE_CPU_S

    def spend(self, author: str, cpu_s: float) -> None:
        """Charge what scoring a batch of ``author`` took to its share."""
        with self._lock:
            share = self._has_standing(author)
            self._refill(share)
            self._shares[share][0] -= max(cpu_s, 0.0)

    def _refill(self, share: bool) -> float:
        rate, cap = _SHARES[share]
        bucket, now = self._shares[share], self._clock()
        bucket[0] = min(cap, bucket[0] + max(now - bucket[1], 0.0) * rate)
        bucket[1] = now
        return bucket[0]
