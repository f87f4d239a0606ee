"""A discrete-event model of a swarm's data plane, for swarm sizes no machine here can run (docs/scaling.md).

What happens in the model, per node and round: the node samples, publishes one batch (a signed
announcement, then notices), trains on J peer groups it verified, and meanwhile pulls and verifies the
batches it hears of. How it hears of them and what it pulls, per ``Protocol``:

- **today** (``Protocol.today()``, constants read from the code): the publisher notifies every roster
  peer (at most the 512 cards the DHT holds, ``MAX_PARALLEL_NOTICE_SENDS`` streams at once), every node
  polls the announcement keys of ``MAX_POLL_KEYS`` roster members every ``POLL_INTERVAL_S``, and pulls
  every new batch it hears of (``MAX_PENDING``), authors with standing first on ``MAX_PARALLEL_PULLS``
  workers, the others on ``PROBATION_PULLS`` with ``PROBATION_PULL_TIMEOUT_BASE_S`` and one chance each;
- **target** (``Protocol.target()``): a bounded active view of V peers; the publisher sends its notice to
  D of them, every honest node forwards a notice it sees for the first time to D of its view (not to its
  sender or the author) while the hop count is below H; the poll reads only the view's keys; at most
  K = k_factor x J pulls a round, freshest first, authors with standing first and an
  ``exploration_share`` of K for the others (all of K while the node knows fewer than J peers with
  standing); pending batches older than the node's last exchange are dropped each round;
- **bounded** (``Protocol.bounded()``, the code): the view is the roster; the publisher's D targets are
  on the ring of its peers with standing (``ring_targets``) and nobody forwards; K counts only authors with
  standing, within the round's window; authors without standing get K first pulls a round of their own,
  the rest stay pending (``node.Observer``).

Measured over a window (after ``warmup_rounds``, before the last round): notices per node and round are
swarm-wide (sent: by honest nodes per honest publish; received: per publish of anyone), the rest are the
observers' totals per observer round. Silent nodes announce and notify, never serve, never forward.

Exact and approximated: every node publishes on its own schedule and every notice of every batch is
counted (today: by formula per publish; target: a breadth-first walk of the real overlay, or, where that
would pass ``Scenario.gossip_budget`` operations, a walk of a random sample of publishes scaled up, the
other publishes reaching each observer with the sampled reach and delay). The receiving side (inbox,
pending queues, pull workers, the verifier thread, the pool, the round's wait for J groups) is simulated
event by event for ``Scenario.observers`` nodes only (all nodes up to that size); pull-side counts are
their means, and a node serves on average what a node pulls (authors serve, holders are not modeled).
Not modeled: CPU contention between processes on one machine, link queueing (a pull takes 2 RTT +
bytes / bandwidth), connection set-up, the DHT's own routing (a lookup is ``dht_hops`` RTTs).
The knobs are ``scenario``'s; ``benchmarks.simulation.load`` turns the counts into bytes, CPU
seconds and bootstrap nodes.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter, deque
from dataclasses import dataclass, field

from benchmarks.simulation.node import Batch, EventLoop, Observer
from benchmarks.simulation.scenario import Protocol, Scenario
from swarmnode.swarm.exchange.fanout import notice_targets, with_pullers
from swarmnode.swarm.exchange.swarm import round_ttl_s
from swarmnode.swarm.net.payloads import PULLED_BATCHES


@dataclass(frozen=True)
class Result:
    """A scenario's figures: per node and round (``per_node``), the rounds' fill and the latencies."""

    scenario: Scenario
    protocol: Protocol
    per_node: dict[str, float]  # notices_sent, notices_received, candidates, pulls, verifications, ...
    fill_share: float  # of the observers' rounds, those whose pool held J usable groups in time
    use_latency_p50_s: float  # publish -> verified, over (batch, node that trained on it) pairs
    use_latency_p95_s: float
    arrival_p95_s: float  # publish -> verified, over every (batch, observer that verified it) pair
    reach_mean: float  # nodes a notice reached per publish (today: notified peers)
    honest_rounds: int
    observer_rounds: int
    exact_gossip_share: float  # of the publishes, those walked exactly (1.0: no sampling)
    events: int
    batches: list[Batch] = field(repr=False, compare=False)


class Simulation:
    """Every node's membership and publishes, the notices of every batch, and the observers' receiving
    side (``node.Observer``) on one event loop."""

    def __init__(self, scenario: Scenario, protocol: Protocol) -> None:
        self.scenario, self.protocol = scenario, protocol
        sc = scenario
        self.rng = random.Random(sc.seed)
        self.loop = EventLoop()
        self.ttl_s = round_ttl_s(sc.deadline_s)
        self.window = (sc.warmup_rounds * sc.round_s, sc.duration_s - sc.round_s)  # the last: to settle
        self.dht_get_s = sc.dht_hops() * sc.rtt_s + sc.dht_get_local_s
        self.one_way_s = sc.rtt_s / 2 + sc.notice_local_s
        self.send_wave_s = sc.rtt_s + sc.notice_local_s  # a wave of parallel notice streams
        self.alive: list[bool] = []
        self.silent: list[bool] = []
        self.speed: list[float] = []
        self.peer_ids: list[str] = []  # what the ring sorts by: a hash of the node's number
        self._by_peer_id: dict[str, int] = {}
        self.live: list[int] = []
        self._live_at: dict[int, int] = {}
        self.views: list[list[int]] = []
        self.observers: dict[int, Observer] = {}
        self.latest: dict[int, Batch] = {}
        # author -> observer -> the newest of the author's batches it pulled (fanout.with_pullers), and the
        # author's last batches, the one being published last
        self.pulled_by: dict[int, dict[int, int]] = {}
        self.recent_ids: dict[int, deque[int]] = {}
        self.batches: list[Batch] = []
        self.departed: deque[float] = deque()
        self.tallies: Counter[str] = Counter()
        self.rounds_filled: list[bool] = []
        self.totals: Counter[str] = Counter()  # notices, swarm-wide, in the window
        self.walks = {"n": 0, "visits": 0, "reach": 0, "delays": deque(maxlen=4096)}
        self.exact_p = 1.0
        self._pilot = 64  # walks before the sampling probability is set
        self._salt = self.rng.getrandbits(32)

    # -- membership --------------------------------------------------------------------------------
    def start(self) -> None:
        sc = self.scenario
        for _ in range(sc.nodes):
            self._new_node()
        honest = [n for n in range(sc.nodes) if not self.silent[n]]
        for nid in self.rng.sample(honest, min(sc.observers, len(honest))):
            self.observers[nid] = Observer(self, nid)
        if self.protocol.gossip:
            for nid in range(sc.nodes):
                self.views.append(self._sample_live(self.protocol.view, nid))
        for nid in range(sc.nodes):
            self._begin(nid, self.rng.uniform(0, sc.round_s))
        if sc.churn_per_min > 0:
            self.loop.after(self._churn_gap(), self._churn)

    def _new_node(self, observer: bool = False) -> int:
        nid = len(self.alive)
        self.alive.append(True)
        self.silent.append(not observer and self.rng.random() < self.scenario.silent_share)
        spread = self.scenario.speed_spread
        self.speed.append(self.rng.uniform(1 - spread, 1 + spread))
        self.peer_ids.append(hashlib.sha256(f"{self.scenario.seed}:{nid}".encode()).hexdigest()[:16])
        self._by_peer_id[self.peer_ids[-1]] = nid
        self._live_at[nid] = len(self.live)
        self.live.append(nid)
        return nid

    def _begin(self, nid: int, delay: float) -> None:
        observer = self.observers.get(nid)
        if observer is not None:
            self.loop.after(delay, observer.start_round)
            self.loop.after(delay + self.rng.uniform(0, self.protocol.poll_interval_s), observer.poll)
        else:
            self.loop.after(delay + self.sample_s(nid), self._publish_loop, nid)

    def _sample_live(self, k: int, exclude: int) -> list[int]:
        chosen = set()
        while len(chosen) < min(k, len(self.live) - 1):
            nid = self.live[self.rng.randrange(len(self.live))]
            if nid != exclude:
                chosen.add(nid)
        return list(chosen)

    def _churn_gap(self) -> float:
        return self.rng.expovariate(self.scenario.churn_per_min * len(self.live) / 60.0)

    def _churn(self) -> None:
        """One node leaves and one joins (an observer's place goes to the newcomer)."""
        gone = self.live[self.rng.randrange(len(self.live))]
        self.alive[gone] = False
        last = self.live.pop()
        if last != gone:
            self.live[self._live_at[gone]] = last
            self._live_at[last] = self._live_at[gone]
        del self._live_at[gone]
        self.departed.append(self.loop.now)
        was_observer = self.observers.pop(gone, None)
        if was_observer is not None:
            was_observer.alive = False
        nid = self._new_node(observer=was_observer is not None)
        if was_observer is not None:
            self.observers[nid] = Observer(self, nid)
        if self.protocol.gossip:
            view = self.protocol.view
            self.views.append(self._sample_live(view, nid))
            for peer in self._sample_live(view, nid):  # HyParView's forwarded join: into V others' views
                self.views[peer][self.rng.randrange(len(self.views[peer]))] = nid
        self._begin(nid, self.scenario.join_s)
        self.loop.after(self._churn_gap(), self._churn)

    # -- publishing and notices ----------------------------------------------------------------------
    def sample_s(self, nid: int) -> float:
        return self.scenario.round_s * self.scenario.sample_share * self.speed[nid]

    def train_s(self, nid: int) -> float:
        return self.scenario.round_s * (1 - self.scenario.sample_share) * self.speed[nid]

    def in_window(self) -> bool:
        return self.window[0] <= self.loop.now < self.window[1]

    def _publish_loop(self, nid: int) -> None:
        if self.alive[nid]:
            self.publish(nid)
            self.loop.after(self.scenario.round_s * self.speed[nid], self._publish_loop, nid)

    def publish(self, nid: int) -> None:
        sc, rng = self.scenario, self.rng
        informative = sum(rng.random() < sc.informative_share for _ in range(sc.groups_per_batch))
        batch = Batch(len(self.batches), nid, self.loop.now, self.silent[nid], informative)
        self.batches.append(batch)
        self.latest[nid] = batch
        self.recent_ids.setdefault(nid, deque(maxlen=PULLED_BATCHES + 1)).append(batch.id)
        if self.in_window():
            self.totals["silent_rounds" if batch.silent else "honest_rounds"] += 1
        if self.protocol.gossip:
            self._gossip(batch)
        else:
            self._notify_roster(batch)

    def _count_notices(self, batch: Batch, sent: float, delivered: float) -> None:
        batch.notices = round(sent)
        if self.in_window():
            self.totals["sent_by_honest" if not batch.silent else "sent_by_silent"] += sent
            self.totals["delivered"] += delivered

    def _notify_roster(self, batch: Batch) -> None:
        """Today: one notice to every roster peer, MAX_PARALLEL_NOTICE_SENDS at once; peers gone within
        the last ttl / 2 still hold a live card and are sent one that fails."""
        while self.departed and self.loop.now - self.departed[0] > self.ttl_s / 2:
            self.departed.popleft()
        others, cap = len(self.live) - 1, self.protocol.roster_cap
        share = 1.0 if others <= cap else cap / others  # chance that a node is in the author's roster
        delivered = min(others, cap)
        self._count_notices(batch, delivered + len(self.departed) * share, delivered)
        for observer in list(self.observers.values()):
            if observer.id == batch.author or (share < 1 and not self.in_roster(batch.author, observer.id)):
                continue
            wave = self.rng.randrange(max(delivered, 1)) // self.protocol.parallel_notice_sends
            self.loop.after(wave * self.send_wave_s + self.one_way_s, observer.hear, batch, "notice")

    def in_roster(self, author: int, peer: int) -> bool:
        """Whether ``peer`` is among the author's roster cards when the swarm outgrows the cap: a fixed
        pseudo-random draw per pair, with the cap's share of the swarm."""
        h = (author * 0x9E3779B1 ^ peer * 0x85EBCA77 ^ self._salt) * 0xC2B2AE3D & 0xFFFFFFFF
        return h < self.protocol.roster_cap / max(len(self.live) - 1, 1) * 2**32

    def _gossip(self, batch: Batch) -> None:
        walks = self.walks
        if walks["n"] == self._pilot:
            expected = len(self.live) * self.scenario.duration_s / self.scenario.round_s
            per_walk = walks["visits"] / walks["n"]
            self.exact_p = min(1.0, self.scenario.gossip_budget / max(per_walk * expected, 1.0))
        if walks["n"] < self._pilot or self.rng.random() < self.exact_p:
            self._walk(batch, 1.0 if walks["n"] < self._pilot else 1 / self.exact_p)
            return
        reach = walks["reach"] / walks["n"] / max(len(self.live) - 1, 1)
        for observer in list(self.observers.values()):
            if observer.id != batch.author and self.rng.random() < reach:
                self.loop.after(self.rng.choice(walks["delays"]), observer.hear, batch, "notice")

    def _walk(self, batch: Batch, weight: float) -> None:
        """The notice's spread over the overlay, breadth first: the publisher sends it to D peers of its
        view (``ring_targets`` where the protocol says so), each node that sees it first at a hop below H
        (and is honest) to D of its view other than its sender and the author; a dead peer costs a failed
        send and is replaced in the view by a live node."""
        proto, rng, t0 = self.protocol, self.rng, self.loop.now
        seen = {batch.author}
        frontier = deque([(batch.author, 0, 0.0, -1)])
        sent = delivered = 0
        while frontier:
            node, hop, at, sender = frontier.popleft()
            if hop >= proto.hops or (hop > 0 and self.silent[node]):
                continue
            view = self.views[node]
            if proto.ring and hop == 0:
                targets = self._with_pullers(node, self.ring_targets(node))
            else:
                drawn = rng.sample(view, min(proto.fanout + 2, len(view)))
                targets = [p for p in drawn if p != sender and p != batch.author]  # neither is sent it back
            for i, peer in enumerate(targets[: proto.fanout + proto.puller_notices * (hop == 0)]):
                sent += 1
                if not self.alive[peer]:
                    view[view.index(peer)] = self.live[rng.randrange(len(self.live))]
                    continue
                delivered += 1
                arrive = at + i // proto.parallel_notice_sends * self.send_wave_s + self.one_way_s
                if peer in seen:
                    continue
                seen.add(peer)
                self.walks["delays"].append(arrive)
                observer = self.observers.get(peer)
                if observer is not None:
                    self.loop.at(t0 + arrive, observer.hear, batch, "notice")
                frontier.append((peer, hop + 1, arrive + self.scenario.check_s, node))
        self.walks["n"] += 1
        self.walks["visits"] += sent
        self.walks["reach"] += len(seen) - 1
        self._count_notices(batch, sent * weight, delivered * weight)

    def ring_targets(self, author: int) -> list[int]:
        """The publisher's D targets as the code picks them (``fanout.notice_targets``, at the rotation of
        the simulated clock): on the ring of its view members with standing and itself, by peer id;
        members without standing fill in at random while the ring is short. A member has standing when it
        is honest and has published: one verified batch gives standing. An approximation under the
        exploration share (``Protocol.exploration_divisor``): a node gives standing to at most K new
        authors a round (the observers' own standing is simulated), so its ring may be of fewer members."""
        view, count = self.views[author], self.protocol.fanout
        standing = [m for m in view if m in self.latest and not self.silent[m]]
        on_ring = set(standing)
        ring = notice_targets(
            self.peer_ids[author], [self.peer_ids[m] for m in standing], [], count, self.loop.now
        )
        targets = [self._by_peer_id[p] for p in ring]
        if len(targets) < count:
            others = [m for m in view if m not in on_ring]
            targets += self.rng.sample(others, min(count - len(targets), len(others)))
        return targets

    def note_pull(self, observer: int, batch: Batch) -> None:
        """An observer pulled ``batch`` (what its author's payload server remembers)."""
        self.pulled_by.setdefault(batch.author, {})[observer] = batch.id

    def _with_pullers(self, author: int, targets: list[int]) -> list[int]:
        """``targets`` and up to ``puller_notices`` observers off them that pulled one of the author's
        PULLED_BATCHES batches before the one being published (pullers among the observers only: all nodes
        up to ``Scenario.observers``), the most recent first; standing is not modelled here."""
        if not self.protocol.puller_notices:
            return targets
        mine = list(self.recent_ids.get(author, ()))[:-1]
        pulled = self.pulled_by.get(author, {})
        recent = sorted((p for p, b in pulled.items() if b in mine), key=lambda p: -pulled[p])
        return with_pullers(targets, recent, self.protocol.puller_notices)

    # -- what an observer asks of the swarm ----------------------------------------------------------
    def pull_outcome(self, batch: Batch, share: str) -> tuple[float, bool]:
        """(seconds, whether bytes came): a silent author holds the pull for its whole timeout; one that
        left fails after a dial; otherwise two round trips plus the bytes at the link's rate."""
        sc, proto = self.scenario, self.protocol
        base = proto.probation_pull_timeout_base_s if share == "probation" else proto.pull_timeout_base_s
        timeout = min(base + sc.batch_bytes / proto.pull_bytes_per_s, proto.pull_timeout_max_s)
        if batch.silent:
            return timeout, False
        if not self.alive[batch.author]:
            return min(3 * sc.rtt_s + sc.fetch_local_s, timeout), False
        took = 2 * sc.rtt_s + sc.batch_bytes / sc.bandwidth_bytes_per_s + sc.fetch_local_s
        return min(took, timeout), took <= timeout

    def poll_members(self, observer: Observer) -> list[int]:
        """Whose announcement keys an observer's poll reads: today its roster (every live node up to the
        cap, else a fixed random sample of the cap's size, dead members replaced), target its view."""
        if self.protocol.gossip:
            return self.views[observer.id]
        cap = self.protocol.roster_cap
        if len(self.live) - 1 <= cap:
            return [n for n in self.live if n != observer.id]
        if not observer.roster:
            observer.roster = self._sample_live(cap, observer.id)
        observer.roster = [
            n if self.alive[n] else self.live[self.rng.randrange(len(self.live))] for n in observer.roster
        ]
        return observer.roster

    def tally(self, observer: Observer, key: str, n: float = 1) -> None:
        if self.in_window():
            self.tallies[key] += n

    def end_round(self, observer: Observer, filled: bool, waited_s: float) -> None:
        if self.in_window():
            self.rounds_filled.append(filled)
            self.tallies["exchange_wait_s"] += waited_s

    # -- the figures ---------------------------------------------------------------------------------
    def result(self) -> Result:
        t = self.totals
        honest, everyone, rounds = (
            t["honest_rounds"],
            t["honest_rounds"] + t["silent_rounds"],
            len(self.rounds_filled),
        )
        per_node = {
            "notices_sent": t["sent_by_honest"] / max(honest, 1),
            "notices_received": t["delivered"] / max(everyone, 1),
        }
        per_node |= {k: v / max(rounds, 1) for k, v in self.tallies.items() if k != "notices_received"}
        start, end = self.window
        use, arrival = [], []
        for batch in self.batches:
            if start <= batch.published < end:
                use += [batch.verified_by[o] - batch.published for o in batch.used_by]
                arrival += [v - batch.published for v in batch.verified_by.values()]
        reach = self.walks["reach"] / self.walks["n"] if self.walks["n"] else per_node["notices_sent"]
        return Result(
            self.scenario,
            self.protocol,
            per_node,
            sum(self.rounds_filled) / max(rounds, 1),
            percentile(use, 50),
            percentile(use, 95),
            percentile(arrival, 95),
            reach,
            honest,
            rounds,
            self.exact_p,
            self.loop.events,
            self.batches,
        )


def percentile(values: list[float], q: float) -> float:
    """Nearest rank; nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(math.ceil(q / 100 * len(ordered)), 1) - 1]


def simulate(scenario: Scenario, protocol: Protocol) -> Result:
    sim = Simulation(scenario, protocol)
    sim.start()
    sim.loop.run(scenario.duration_s)
    return sim.result()
