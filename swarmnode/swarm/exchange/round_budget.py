"""A round's pull budget: K first pulls of batches of authors with standing per round of this node, only
of batches announced in the round's own window (exchange/puller.py uses it), and K first chances (a first
pull) a round for authors without standing new to this node.

Why: a node trains on J peer groups a round, so what it pulls must grow with J (K = 2 J), not with the
swarm, nor with the identities joining (a silent Sybil costs a pull timeout each); past the share a
newcomer's batch stays pending (bounded: standing.PROBATION_PENDING) for a later round, and with a share of
K a swarm of 2 K meets in 2 rounds. A deferred batch may be pulled after a newer one of its author:
superseded, and verified like any other (PROTOCOL.md section 7).

A round's window opens when the last exchange ends (``Arrivals.take``). A batch announced before belongs
to the last wave: heard of only now (by the DHT poll, seconds after the notices), it would be trained on a
round late, so it is dropped, like every batch past the K. Announcement times are the author's clock, and
peers' clocks agree within seconds: a peer whose clock is behind loses the batches it announces in the
first seconds of a window, never more. The measurements behind these choices: docs/scaling.md.
"""

from __future__ import annotations

from collections.abc import Callable


class RoundBudget:
    def __init__(self, k: int, window: Callable[[], tuple[int, float]]):
        """``window``: our round and when it opened (``Arrivals.window``)."""
        self.k = k
        self._window = window
        self.round = -1  # the round whose window is open
        self._opened = 0.0  # when it opened (0: the node's first round)
        self._used = 0  # first pulls started in it
        self._explored = 0  # ... and first chances of new authors without standing

    def _roll(self) -> None:
        round_, opened = self._window()
        if round_ != self.round:
            self.round, self._opened, self._used, self._explored = round_, opened, 0, 0

    def spent(self, announced_ts: float) -> bool:
        """Whether a batch announced at ``announced_ts`` is not to be pulled: of the last wave, or past K."""
        self._roll()
        return announced_ts < self._opened or self._used >= self.k

    def charge(self) -> None:
        """A first pull started."""
        self._roll()
        self._used += 1

    def round_spent(self) -> bool:
        """This round's K have all started."""
        self._roll()
        return self._used >= self.k

    def exploration_spent(self) -> bool:
        """Whether this round's K first chances of new authors without standing are used up."""
        self._roll()
        return self._explored >= self.k

    def charge_exploration(self) -> None:
        """A new author without standing got its first pull."""
        self._roll()
        self._explored += 1
