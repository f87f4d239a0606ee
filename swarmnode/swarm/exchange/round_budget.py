"""A round's pull budget: K first pulls of batches of authors with standing per round of this node, only
of batches announced in the round's own window (exchange/puller.py uses it), and K first chances (a first
pull) a round for authors without standing new to this node, first come, at most EXPLORATION_PER_ORIGIN
of them for one known origin and 3/4 K for all of unknown origin.

Why: a node trains on J peer groups a round, so what it pulls must grow with J (K = 2 J), not with the swarm,
nor with the identities joining (a silent Sybil costs a pull timeout each); past the share a newcomer's batch
stays pending (bounded: standing.PROBATION_PENDING) for a later round, and with a share of K a swarm of 2 K
meets in 2 rounds (on loopback, where origins are unknown, in 3). A deferred batch may be pulled after a newer
one of its author: superseded, and verified like any other (PROTOCOL.md section 7).

A round's window opens when the last exchange ends (``Arrivals.take``). A batch announced before belongs
to the last wave: heard of only now (by the DHT poll, seconds after the notices), it would be trained on a
round late, so it is dropped, like every batch past the K. What "announced" means is measured here
(``local_time``): the author's signed timestamp clamped to when this node first heard of the batch, so a
timestamp signed in the future counts as "now" and buys nothing (an old one is only against its signer).

Fair shares of K, whatever authors sign:
- at most one batch per author a round takes the reserve (``spent``/``charge`` with the author); its
  further batches come from the rest of K, after every other author's first in the puller's round-robin
  order, so a few identities publishing many batches cannot take the reserve;
- ``reserved`` = K // RESERVED_SHARE of K is kept for the authors with the highest score
  (``PeerBook.ranked``: what this node trained on, measured here); the rest goes to any author with
  standing in the puller's order. The reserve is not waited for: ``round_spent`` is true once the rest is
  spent and no top author's batch is pending.
The measurements behind these choices: docs/scaling.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

RESERVED_SHARE = 2  # K // this of a round's K is kept for the authors with the highest score
# first chances a round for new authors of one known origin (/24, /48): a flood from a few networks
# leaves the rest of the K to newcomers from others, whichever came first
EXPLORATION_PER_ORIGIN = 1
# ... and K // this of them is kept from newcomers of unknown origin (DHT poll only, loopback, relayed):
# honest newcomers notify, so their origin is known
UNKNOWN_ORIGIN_SPARE = 4


def local_time(announced_ts: float, seen: float) -> float:
    """When a batch counts as announced here: its signed timestamp, clamped to ``seen`` (time.time() this
    node first heard of it). Windows, expiry and "freshest first" read this, never the claim alone."""
    return min(announced_ts, seen)


class RoundBudget:
    def __init__(self, k: int, window: Callable[[], tuple[int, float]]):
        """``window``: our round and when it opened (``Arrivals.window``)."""
        self.k = k
        self._window = window
        self.round = -1  # the round whose window is open
        self._opened = 0.0  # when it opened (0: the node's first round)
        self._used = 0  # first pulls started in it, outside the reserve ...
        self._top_used = 0  # ... and of the reserve
        self._authors: set[str] = set()  # authors charged in it (one batch each)
        self._explored: Counter[str | None] = Counter()  # ... and first chances of newcomers, per origin

    @property
    def charged(self) -> frozenset[str]:
        """The authors whose first pull started in the round whose window is open."""
        self._roll()
        return frozenset(self._authors)

    @property
    def reserved(self) -> int:
        """The pulls of K kept for the authors with the highest score."""
        return self.k // RESERVED_SHARE

    def _roll(self) -> None:
        round_, opened = self._window()
        if round_ != self.round:
            self.round, self._opened, self._used, self._explored = round_, opened, 0, Counter()
            self._top_used, self._authors = 0, set()

    def spent(self, announced_ts: float, author: str = "", top: bool = False) -> bool:
        """Whether a batch announced at ``announced_ts`` (``local_time``) by ``author`` (``top``: among the
        highest scores) is not to be pulled: of the last wave, or past its share of K (an author already
        charged this round only has the rest, never the reserve)."""
        self._roll()
        if announced_ts < self._opened:
            return True
        rest_left = self._used < self.k - self.reserved
        if author in self._authors:  # an author's further batches: only from the rest, never the reserve
            return not rest_left
        return not (rest_left or top and self._top_used < self.reserved)

    def charge(self, author: str = "", top: bool = False) -> None:
        """A first pull of ``author``'s batch started (``top``: the reserve pays while it lasts)."""
        self._roll()
        first = author not in self._authors
        if author:
            self._authors.add(author)
        if top and first and self._top_used < self.reserved:
            self._top_used += 1
        else:
            self._used += 1

    def round_spent(self, tops_pending: bool = False) -> bool:
        """This round's K have all started; or the part outside the reserve has, and no batch of a top
        author is pending (``tops_pending``): the reserve is not waited for."""
        self._roll()
        rest_spent = self._used >= self.k - self.reserved
        return rest_spent and (self._top_used >= self.reserved or not tops_pending)

    def exploration_spent(self, origin: str | None = None) -> bool:
        """Whether this round's first chances for new authors without standing are used up: K in all,
        EXPLORATION_PER_ORIGIN for one known ``origin`` (``PeerBook.origin_of``), all but
        K // UNKNOWN_ORIGIN_SPARE for all of unknown origin together (an attacker hiding where it comes from
        shares one bucket)."""
        self._roll()
        per_origin = self.k - self.k // UNKNOWN_ORIGIN_SPARE if origin is None else EXPLORATION_PER_ORIGIN
        return sum(self._explored.values()) >= self.k or self._explored[origin] >= per_origin

    def charge_exploration(self, origin: str | None = None) -> None:
        """A new author without standing, seen from ``origin``, got its first pull."""
        self._roll()
        self._explored[origin] += 1
