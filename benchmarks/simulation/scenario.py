"""What the data-plane simulation is asked about: the protocol's knobs (``Protocol``) and the swarm and
network it runs on (``Scenario``), for ``benchmarks.simulation.engine``.

``Protocol.today()`` takes every cap, timer and worker count from the code that owns it (exchange/puller,
service, standing, pool, roster; net/notices; wire/dht_rules), so the model follows the code's values;
``Protocol.bounded()`` is the code's bounded exchange (notices to D peers on a ring, K pulls of authors
with standing in the round's window, K first chances a round for the others (``exploration_divisor`` 1),
the roster read in pages);
``Protocol.target()`` is the target design (docs/scaling.md): a bounded view of V peers, gossip to D of
them with a hop limit H, at most K = k_factor x J pulls a round with an exploration share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from swarmnode.config import SwarmConfig
from swarmnode.swarm.exchange import fanout, pool, puller, roster, service, standing
from swarmnode.swarm.net import notices
from swarmnode.swarm.wire import dht_rules

_SWARM = SwarmConfig()


@dataclass(frozen=True)
class Protocol:
    """The data plane's knobs; defaults are the code's constants (today's protocol)."""

    name: str = "today"
    gossip: bool = False  # False: notify every roster peer; True: D view peers, forwarded up to H hops
    # today's roster: every card the DHT holds (8 shards x 64), the cap before the bounded view
    roster_cap: int = dht_rules.ROSTER_SHARDS * dht_rules.MAX_SUBKEYS_PER_KEY
    view: int = 0  # V, the active view (gossip)
    fanout: int = 0  # D
    ring: bool = False  # the publisher's D on the ring of its peers with standing (fanout.py); else at random
    # ... and up to this many observers off those D that pulled one of its last batches (fanout.with_pullers)
    puller_notices: int = 0
    hops: int = 0  # H: a notice seen first at hop h < H is forwarded (the publisher's send is hop 0)
    k_factor: float = 0.0  # K = k_factor x J pulls a round; 0: every batch heard of
    # what K counts: "all" pulls, an exploration share of it for authors without standing, pending batches
    # older than the last exchange dropped when a round starts (the target); "standing": first pulls of
    # authors with standing announced in the round's window, the others in their probation share outside K
    # (the code: exchange/round_budget.py)
    k_scope: str = "all"
    exploration_share: float = 0.25  # of K, for authors without standing (k_scope "all")
    # k_scope "standing": first pulls of authors without standing a round (from one exchange's end to the
    # next), K // this (at least 1), all K while the node knows fewer than J peers with standing; the rest
    # stay pending for a later round's share (round_budget.py; the code gives K: 1). 0: no share
    exploration_divisor: int = 0
    max_pending: int = puller.MAX_PENDING
    probation_pending: int = standing.PROBATION_PENDING
    pending_per_author: int = standing.PENDING_PER_AUTHOR
    parallel_pulls: int = puller.MAX_PARALLEL_PULLS
    probation_pulls: int = standing.PROBATION_PULLS
    pull_timeout_base_s: float = puller.PULL_TIMEOUT_BASE_S
    probation_pull_timeout_base_s: float = puller.PROBATION_PULL_TIMEOUT_BASE_S
    pull_bytes_per_s: float = puller.PULL_BYTES_PER_S
    pull_timeout_max_s: float = puller.PULL_TIMEOUT_MAX_S
    parallel_notice_sends: int = notices.MAX_PARALLEL_NOTICE_SENDS
    poll_interval_s: float = service.POLL_INTERVAL_S
    poll_keys: int = service.MAX_POLL_KEYS  # target: the view's keys (V)
    # a roster read every this often (None: as the code paces its pages, ``service.roster_page_gap_s`` of
    # the scenario's record lifetime) ...
    roster_read_s: float | None = service.ROSTER_REFRESH_S
    # ... or this often while the node's view is full (None: as often as otherwise)
    roster_read_full_s: float | None = None
    roster_keys_read: int = dht_rules.ROSTER_SHARDS  # ... of this many shard keys
    roster_keys_first: int = dht_rules.ROSTER_SHARDS  # a newcomer's first read (the code: every shard)
    shuffle_s: float = 0.0  # target: a view shuffle (Cyclon) started this often ...
    shuffle_len: int = 0  # ... trading this many cards each way
    producer_share: float = pool.PRODUCER_SHARE

    @classmethod
    def today(cls) -> Protocol:
        """The protocol the model was first validated on (up to 2026-11-26): every roster peer notified,
        every batch heard of pulled. Kept as the baseline of docs/scaling.md's tables."""
        return cls()

    @classmethod
    def bounded(cls) -> Protocol:
        """The code's bounded exchange: the roster is the view; a publish notifies ``NOTICE_FANOUT`` of it
        on the ring of its peers with standing and ``PULLER_NOTICES`` of its last batches' pullers, and
        nobody forwards; at most ``PULLS_PER_PEER_GROUP`` x J
        first pulls of authors with standing a round, of batches announced in its window, and K first chances
        of authors without (``round_budget.RoundBudget.exploration_spent``; the model counts batches, the
        code new authors); a page of ``ROSTER_PAGE_SHARDS`` shards read every ``roster_page_gap_s``, every
        ``FULL_VIEW_PAGE_GAP_S`` once the view (``roster.VIEW_SIZE`` cards) is full."""
        return cls(
            name="bounded", gossip=True, view=roster.VIEW_SIZE, fanout=fanout.NOTICE_FANOUT, ring=True,
            puller_notices=fanout.PULLER_NOTICES, hops=1, k_factor=puller.PULLS_PER_PEER_GROUP,
            k_scope="standing",
            exploration_divisor=1, roster_keys_read=service.ROSTER_PAGE_SHARDS, roster_read_s=None,
            roster_read_full_s=service.FULL_VIEW_PAGE_GAP_S,
        )  # fmt: skip

    @classmethod
    def target(
        cls, view: int = 32, fanout: int = 6, hops: int = 2, k_factor: float = 3.0, **changes
    ) -> Protocol:
        """The target design: the view's keys polled, one roster shard read a minute (the roster is a
        bootstrap source), a shuffle of 8 cards every 10 s."""
        knobs = dict(
            name="target",
            gossip=True,
            view=view,
            fanout=fanout,
            hops=hops,
            k_factor=k_factor,
            poll_keys=view,
            roster_read_s=60.0,
            roster_keys_read=1,
            roster_keys_first=1,
            shuffle_s=10.0,
            shuffle_len=8,
        )
        return cls(**(knobs | changes))

    def pulls_per_round(self, j: int) -> int | None:
        return math.ceil(self.k_factor * j) if self.k_factor else None

    def explorations_per_round(self, j: int, few_peers: bool) -> int | None:
        """k_scope "standing": first pulls of authors without standing a round
        (``RoundBudget.exploration_spent``), all of K while ``few_peers`` (fewer than J peers with
        standing); None: no cap."""
        k = self.pulls_per_round(j)
        if self.k_scope != "standing" or not self.exploration_divisor or k is None:
            return None
        return k if few_peers else max(k // self.exploration_divisor, 1)


@dataclass(frozen=True)
class Scenario:
    """The swarm and the network it runs on."""

    nodes: int
    churn_per_min: float = 0.0  # share of the nodes that leave (and as many that join) per minute
    silent_share: float = 0.0  # Sybils that announce, notify, never serve a pull and never forward
    j: int = _SWARM.peer_groups_per_round
    groups_per_batch: int = 4  # sampling.questions_per_round
    informative_share: float = 1.0  # of a batch's groups, those with an advantage (the rest are dropped)
    round_s: float = 60.0  # sampling + training, the median node
    sample_share: float = 0.7  # of round_s, sampling (the batch is published at its end)
    speed_spread: float = 0.3  # a node's round lasts round_s x uniform(1 - spread, 1 + spread)
    deadline_s: float = 30.0  # swarm.share_deadline_s
    rounds: int = 12  # simulated time = rounds x round_s
    warmup_rounds: int = 2  # left out of the figures (so is the last round)
    rtt_s: float = 0.08
    bandwidth_bytes_per_s: float = 2.5e6  # per node, each way (20 Mbit/s)
    batch_bytes: int = 50_000
    notice_local_s: float = 0.0014  # a notice's wall time on loopback (both ends' processes)
    fetch_local_s: float = 0.0016  # a pull's wall time on loopback
    check_s: float = 0.00014  # an announcement's check before it is forwarded
    verify_s: float = 0.0034  # one batch verified (the verifier thread)
    dht_get_local_s: float = 0.015
    join_s: float = 5.0  # a newcomer's start: DHT bootstrap, first roster read, first round begins
    observers: int = 48
    gossip_budget: float = 2e7  # node visits of exact gossip walks, all publishes together
    seed: int = 0

    @property
    def duration_s(self) -> float:
        return self.rounds * self.round_s

    def dht_hops(self, nodes: int | None = None) -> int:
        """Lookup steps to a key among ``nodes`` DHT nodes (Kademlia-style, assumed log8)."""
        return max(1, math.ceil(math.log(max(nodes or self.nodes, 2), 8)))
