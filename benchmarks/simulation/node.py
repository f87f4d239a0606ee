"""One node's receiving side on a small event loop: the part of ``benchmarks.simulation.engine``
simulated event by event.

``EventLoop`` runs callbacks in simulated time order (a SimPy-like core on ``heapq``); ``Server`` is a
first-come-first-served worker pool (a node's verifier thread). An ``Observer`` hears of batches (notices
or its DHT poll), keeps them pending in three queues (authors with standing; without; without and whose
first chance failed), pulls them on the workers of each share within the protocol's caps and round budget
(``Protocol.k_scope``: in the target, at most K a round with an exploration share; in the code, K first
pulls of authors with standing in the round's window, and K // ``exploration_divisor`` first chances of
the others a round (the code's divisor is 1: K), the rest of those pending for later rounds), verifies
them one at a time, and ends each round's exchange when its pool holds J usable groups (at most
``producer_share`` of J from one author), when the code's K pulls have all ended, or at the deadline. It
reaches the swarm only through its ``sim`` (``engine.Simulation``): the protocol and scenario, the clock,
``pull_outcome``, ``publish``, ``poll_members`` and the tallies.

Of the code's round budget (exchange/round_budget.py) the model leaves out the one batch per author that
counts against K and the reserve of K for the authors with the highest score (the model keeps no score).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class EventLoop:
    """Callbacks at simulated times, run in time order (ties in the order they were scheduled)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.events = 0
        self._queue: list = []
        self._order = itertools.count()

    def at(self, t: float, fn: Callable, *args) -> None:
        heapq.heappush(self._queue, (t, next(self._order), fn, args))

    def after(self, delay: float, fn: Callable, *args) -> None:
        self.at(self.now + max(delay, 0.0), fn, *args)

    def run(self, until: float) -> None:
        queue = self._queue
        while queue and queue[0][0] <= until:
            t, _, fn, args = heapq.heappop(queue)
            self.now = t
            self.events += 1
            fn(*args)
        self.now = until


class Server:
    """``capacity`` workers taking jobs first come, first served (a node's verifier thread)."""

    def __init__(self, loop: EventLoop, capacity: int = 1) -> None:
        self.loop, self.capacity, self.busy = loop, capacity, 0
        self.waiting: deque = deque()

    def submit(self, duration: float, done: Callable, *args) -> None:
        if self.busy < self.capacity:
            self.busy += 1
            self.loop.after(duration, self._finish, done, args)
        else:
            self.waiting.append((duration, done, args))

    def _finish(self, done: Callable, args: tuple) -> None:
        done(*args)
        if self.waiting:
            duration, next_done, next_args = self.waiting.popleft()
            self.loop.after(duration, self._finish, next_done, next_args)
        else:
            self.busy -= 1


@dataclass
class Batch:
    """One published batch: the notices it caused and who pulled, verified and trained on it."""

    id: int
    author: int
    published: float
    silent: bool
    informative: int
    notices: int = 0
    pulls: int = 0
    verified_by: dict[int, float] = field(default_factory=dict)  # observer -> when
    used_by: dict[int, float] = field(default_factory=dict)  # observer -> when it trained on it


class Observer:
    """One node's receiving side, event by event: candidates, pending queues, pull workers, the verifier,
    the pool and the round's wait for J groups."""

    def __init__(self, sim: Any, nid: int) -> None:
        self.sim, self.id, self.alive = sim, nid, True
        self.standing: set[int] = set()
        self.failed_first: set[int] = set()  # authors without standing whose pull timed out
        self.known: set[int] = set()
        self.queues = {"standing": deque(), "probation": deque(), "failed": deque()}
        self.pending_of: Counter[int] = Counter()
        self.active = {"standing": 0, "probation": 0}
        self.pulls_round = self.probation_round = 0  # k_scope "all": the round's pulls, and of them probation
        self.window_opened = 0.0  # k_scope "standing": the round's window opened (the last exchange ended)
        self.window_pulls = 0  # ... and first pulls of authors with standing started since
        self.window_explored = 0  # ... and of authors without (Protocol.exploration_divisor)
        self.verifier = Server(sim.loop)
        self.pool: list[tuple[float, Batch]] = []
        self.waiting_since: float | None = None
        self.round_started = self.exchange_started = 0.0
        self.roster: list[int] = []  # today: the members polled, in turn
        self.poll_at = 0

    # -- hearing of batches -------------------------------------------------------------------------
    def hear(self, batch: Batch, via: str) -> None:
        sim = self.sim
        if not self.alive or batch.author == self.id:
            return
        if via == "notice":
            sim.tally(self, "notices_received")
        if batch.id in self.known:
            return
        self.known.add(batch.id)
        sim.tally(self, "candidates")
        if via == "notice":
            sim.tally(self, "announcement_checks")
        queue = "standing" if batch.author in self.standing else "probation"
        if queue == "probation" and batch.author in self.failed_first:
            queue = "failed"
        proto = sim.protocol
        if queue == "standing" and self._spent(batch):
            sim.tally(self, "dropped")
            return
        pending = sum(len(q) for q in self.queues.values())
        no_standing = len(self.queues["probation"]) + len(self.queues["failed"])
        if (
            pending >= proto.max_pending
            or (queue != "standing" and no_standing >= proto.probation_pending)
            or self.pending_of[batch.author] >= proto.pending_per_author
        ):
            sim.tally(self, "dropped")
            return
        if proto.k_scope == "all" and proto.k_factor and self.pending_of[batch.author]:
            self._drop_pending(lambda b: b.author == batch.author)  # the target: the newer one supersedes
        self.pending_of[batch.author] += 1
        self.queues[queue].append(batch)
        self.start_pulls()

    def _drop_pending(self, drop: Callable[[Batch], bool]) -> None:
        for name, queue in self.queues.items():
            kept = deque(b for b in queue if not drop(b))
            for b in queue:
                if drop(b):
                    self.pending_of[b.author] -= 1
            self.queues[name] = kept

    def _spent(self, batch: Batch) -> bool:
        """k_scope "standing" (round_budget.py), for a batch of an author with standing: announced before
        the round's window opened (of the last wave), or K first pulls started in the window already. Such
        a batch is dropped for good, never deferred."""
        proto = self.sim.protocol
        k = proto.pulls_per_round(self.sim.scenario.j)
        return proto.k_scope == "standing" and (
            batch.published < self.window_opened or self.window_pulls >= k
        )

    def start_pulls(self) -> None:
        sim, proto = self.sim, self.sim.protocol
        k = proto.pulls_per_round(sim.scenario.j) if proto.k_scope == "all" else None  # K caps every pull
        if proto.exploration_divisor:  # batches left pending: the code gives up the expired ones first
            stale = sim.loop.now - sim.ttl_s
            if any(b.published < stale for queue in self.queues.values() for b in queue):
                self._drop_pending(lambda b: b.published < stale)
        while k is None or self.pulls_round < k:
            batch, share = self._next(k)
            if batch is None:
                return
            self.pending_of[batch.author] -= 1
            if sim.loop.now - batch.published > sim.ttl_s:
                continue  # given up with its announcement
            if share == "standing" and self._spent(batch):
                sim.tally(self, "dropped")
                continue
            self.active[share] += 1
            self.pulls_round += 1
            self.probation_round += share == "probation"
            self.window_pulls += share == "standing"
            self.window_explored += share == "probation"
            sim.tally(self, "pulls")
            batch.pulls += 1
            delay, ok = sim.pull_outcome(batch, share)
            sim.loop.after(delay, self.pulled, batch, share, ok)

    def _next(self, k: int | None) -> tuple[Batch | None, str]:
        """The next batch to pull and its share: authors with standing first; FIFO without a K, the
        freshest first with one (the code: by publish time; the target: the last heard of)."""
        proto = self.sim.protocol
        if proto.k_scope == "standing":
            take = _pop_freshest
        else:
            take = deque.pop if k is not None else deque.popleft
        if self.active["standing"] < proto.parallel_pulls and self.queues["standing"]:
            return take(self.queues["standing"]), "standing"
        if self.active["probation"] >= proto.probation_pulls:
            return None, ""
        if k is not None and len(self.standing) >= self.sim.scenario.j:
            if self.probation_round >= math.ceil(proto.exploration_share * k):
                return None, ""
        if self._exploration_spent():
            return None, ""  # pending for a later round's share
        for name in ("probation", "failed"):
            if self.queues[name]:
                return take(self.queues[name]), "probation"
        return None, ""

    def _exploration_spent(self) -> bool:
        """k_scope "standing" with an exploration share (``Protocol.exploration_divisor``): this round's
        first pulls of authors without standing are used up (K // the divisor of them, or K while this node
        knows fewer than J live view members with standing)."""
        proto, j = self.sim.protocol, self.sim.scenario.j
        share = proto.explorations_per_round(j, few_peers=False)
        if share is None or self.window_explored < share:
            return False
        return self.window_explored >= proto.explorations_per_round(j, few_peers=self._standing_count() < j)

    def _standing_count(self) -> int:
        sim = self.sim
        members = sim.views[self.id] if sim.views else self.standing
        return sum(1 for m in members if m in self.standing and sim.alive[m])

    def pulled(self, batch: Batch, share: str, ok: bool) -> None:
        if not self.alive:
            return
        self.active[share] -= 1
        if ok:
            self.sim.note_pull(self.id, batch)
            self.sim.tally(self, "bytes_in", self.sim.scenario.batch_bytes)
            self.verifier.submit(self.sim.scenario.verify_s, self.verified, batch)
        else:
            self.sim.tally(self, "pull_failures")
            if batch.author not in self.standing:
                self.failed_first.add(batch.author)
        self.start_pulls()
        self._end_soon_if_budget_done()

    def verified(self, batch: Batch) -> None:
        if not self.alive:
            return
        self.sim.tally(self, "verifications")
        batch.verified_by[self.id] = self.sim.loop.now
        if batch.author not in self.standing and self.sim.protocol.k_scope == "standing":
            self._refile(batch.author)
        self.standing.add(batch.author)
        self.pool.append((self.sim.loop.now, batch))
        if self.waiting_since is not None and self.can_fill():
            self.end_exchange()
        else:
            self._end_soon_if_budget_done()

    def _refile(self, author: int) -> None:
        """k_scope "standing": an author that just earned standing; its batches pending without it go to
        the standing queue (the code sorts by standing when it starts pulls), where the window rule and K
        apply to them."""
        for name in ("probation", "failed"):
            moved = [b for b in self.queues[name] if b.author == author]
            if moved:
                self.queues[name] = deque(b for b in self.queues[name] if b.author != author)
                self.queues["standing"].extend(moved)

    def _budget_done(self) -> bool:
        """k_scope "standing": the round's K first pulls started, ended and were verified; nothing more
        comes for this round (the code's ``Arrivals.pulls_done``)."""
        proto = self.sim.protocol
        k = proto.pulls_per_round(self.sim.scenario.j)
        return (
            proto.k_scope == "standing"
            and self.window_pulls >= k
            and not self.active["standing"]
            and not self.verifier.busy
        )

    def _end_soon_if_budget_done(self) -> None:
        """End the exchange if the budget is done, looked at once the verifier took its next job."""
        if self.sim.protocol.k_scope == "standing":
            self.sim.loop.after(0.0, self._end_if_budget_done)

    def _end_if_budget_done(self) -> None:
        if self.alive and self.waiting_since is not None and self._budget_done():
            self.end_exchange()

    # -- rounds ------------------------------------------------------------------------------------
    def start_round(self) -> None:
        if not self.alive:
            return
        if self.sim.protocol.k_scope == "all" and self.sim.protocol.k_factor:
            # the target's K goes to fresh batches: those older than the last exchange are dropped
            self._drop_pending(lambda b: b.published < self.exchange_started)
        self.round_started = self.sim.loop.now
        self.pulls_round = self.probation_round = 0
        self.sim.loop.after(self.sim.sample_s(self.id), self.begin_exchange)
        self.start_pulls()

    def begin_exchange(self) -> None:
        if not self.alive:
            return
        self.exchange_started = self.sim.loop.now
        self.sim.publish(self.id)
        if self.can_fill() or self._budget_done():
            self.end_exchange()
            return
        self.waiting_since = self.sim.loop.now
        self.sim.loop.after(self.sim.scenario.deadline_s, self.deadline, self.waiting_since)

    def deadline(self, since: float) -> None:
        if self.alive and self.waiting_since == since:
            self.end_exchange()

    def usable(self) -> list[tuple[float, Batch]]:
        fresh_after = self.sim.loop.now - self.sim.ttl_s
        self.pool = [(t, b) for t, b in self.pool if b.published >= fresh_after]
        return [(t, b) for t, b in self.pool if b.informative and self.id not in b.used_by]

    def can_fill(self) -> bool:
        """Whether the pool holds J usable groups; the code counts only those that arrived in the round's
        window (``GroupPool.can_fill``'s ``since_round``)."""
        cap = math.ceil(self.sim.scenario.j * self.sim.protocol.producer_share)
        since = self.window_opened if self.sim.protocol.k_scope == "standing" else -math.inf
        usable = (b for t, b in self.usable() if t >= since)
        return sum(min(b.informative, cap) for b in usable) >= self.sim.scenario.j

    def end_exchange(self) -> None:
        """Train on up to J groups, the freshest first; the round filled J if it got them."""
        sim = self.sim
        self.waiting_since = None
        cap, need = math.ceil(sim.scenario.j * sim.protocol.producer_share), sim.scenario.j
        for _, batch in sorted(self.usable(), key=lambda tb: -tb[1].published):  # freshest first
            if need <= 0:
                break
            need -= min(batch.informative, cap)
            batch.used_by[self.id] = sim.loop.now
        sim.end_round(self, need <= 0, sim.loop.now - self.exchange_started)
        self.window_opened, self.window_pulls, self.window_explored = sim.loop.now, 0, 0
        sim.loop.after(sim.train_s(self.id), self.start_round)
        if sim.protocol.k_scope == "standing":
            self.start_pulls()  # the new round's shares (the code starts pulls on every wake of its loop)

    # -- the DHT poll ------------------------------------------------------------------------------
    def poll(self) -> None:
        if not self.alive:
            return
        sim = self.sim
        members = sim.poll_members(self)
        take = members[self.poll_at : self.poll_at + sim.protocol.poll_keys]
        self.poll_at = (
            0 if self.poll_at + sim.protocol.poll_keys >= len(members) else self.poll_at + len(take)
        )
        visible_before = sim.loop.now - sim.dht_get_s
        for m in take:
            batch = sim.latest.get(m)
            if batch is not None and batch.published <= visible_before and batch.id not in self.known:
                sim.loop.after(sim.dht_get_s, self.hear, batch, "poll")
        sim.loop.after(sim.protocol.poll_interval_s, self.poll)


def _pop_freshest(queue: deque) -> Batch:
    """The batch published last (the code orders pending batches by their announcement's time)."""
    batch = max(queue, key=lambda b: b.published)
    queue.remove(batch)
    return batch
