"""Allocation by standing: what peers without it may make this node spend, all of them together.

Identities cost only their proof of work, so a bound per identity is no bound against a flood of them.
Standing is earned by delivering: a peer has it once this node accepted a verified group of it
(``PeerBook.has_standing``). Peers without standing share one *probation* share of each resource, however
many they are; peers with standing keep the rest:

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
  until its first miss (exchange/roster.py ``to_wait_for``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

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
