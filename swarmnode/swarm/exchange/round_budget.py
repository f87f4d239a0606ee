"""A round's pull budget (#27): K first pulls of batches of authors with standing per round of this node,
and only of batches announced in the round's own window (exchange/puller.py uses it); and as many first
chances (a first pull) a round for authors without standing new to this node. Without that share a node
gave every new identity its first pull in the round it heard of it, so its work grew with the number of
identities joining (silent Sybils: one pull timeout each) rather than with J; past the share a newcomer's
batch stays pending (bounded: standing.PROBATION_PENDING) for a later round. A share of K / 4 was tried
first: at a 16-node start a node then met its peers over 4 rounds, and the loopback run's used-by p95 went
to 5.4 s and 94% of rounds filled J (docs/scaling.md); with K, a swarm of 2 K meets in 2 rounds. A
deferred batch may be pulled after a newer one of its author: superseded, and verified like any other
(PROTOCOL.md section 7).

A round's window opens when the last exchange ends (``ExchangeState.open_round``). A batch announced
before that belongs to the last wave; heard of only now (by the DHT poll, seconds after the notices), it
would be trained on a round late. It is dropped, like every batch past the K: at 16 nodes such batches
took a third of the pulls when they could still use what the last window left, and reached the nodes that
trained on them 3-8 s after publishing (docs/scaling.md). Announcement times are the author's clock, and
peers' clocks agree within seconds: a peer whose clock is behind loses the batches it announces in the
first seconds of a window, never more.
"""

from __future__ import annotations

from swarmnode.swarm.exchange.state import ExchangeState


class RoundBudget:
    def __init__(self, k: int, state: ExchangeState):
        self.k = k
        self._state = state
        self.round = -1  # the round whose window is open
        self._opened = 0.0  # when it opened (``state.round_opened``; 0: the node's first round)
        self._used = 0  # first pulls started in it
        self._explored = 0  # ... and first chances of new authors without standing

    def _roll(self) -> None:
        with self._state.lock:
            round_, opened = self._state.round, self._state.round_opened
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
