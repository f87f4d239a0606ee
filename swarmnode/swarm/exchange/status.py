"""A frozen snapshot of a node's swarm: what status.json, ``swarmnode status`` and the metrics read.

``Swarm.status`` takes one from the parts (transport, roster, a snapshot of the arrivals, standing, the
verifier's rejections), each read at a moment of its own; ``write_status`` replaces ``<run_dir>/status.json``
with its ``as_dict`` atomically each round. The keys of status.json are what users parse: they stay.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from swarmnode.common import WriteFailures, atomic_write
from swarmnode.swarm.exchange.arrivals import ArrivalsSnapshot
from swarmnode.swarm.exchange.peers import PeerBook
from swarmnode.swarm.exchange.records import ARRIVAL_BUCKETS_S, ArrivalHistogram
from swarmnode.swarm.exchange.roster import Roster
from swarmnode.swarm.net.transport import Transport
from swarmnode.swarm.wire.protocol import RosterCard

STATUS_FILE = "status.json"


@dataclass(frozen=True)
class DHTHealth:
    """What ``/health`` checks of the DHT: ``alive`` (its process runs), ``last_read_ok`` /
    ``last_write_ok`` (time.time() of the last successful get / store, 0: never), failed calls."""

    alive: bool = True
    last_read_ok: float = 0.0
    last_write_ok: float = 0.0
    read_failed: int = 0
    store_failed: int = 0

    @classmethod
    def of(cls, transport: Transport) -> DHTHealth:
        records, failed = transport.records, transport.counts().dht
        return cls(
            transport.dht_alive(), records.last_read_ok, records.last_write_ok, failed.read_failed,
            failed.store_failed,
        )  # fmt: skip


@dataclass(frozen=True)
class PeerStatus:
    """A roster peer: model and tokenizer from its newest card; round and policy version from its newest
    signed message checked here (its card or a batch announcement: ``Roster.progress``) and
    ``seen_s_ago`` that message's age; whether it has standing here (groups of it trained on: standing.py) and
    whether it is banned."""

    model: str
    tokenizer: str
    policy_version: int
    round: int
    seen_s_ago: float
    banned: bool
    standing: bool = False


@dataclass(frozen=True)
class RolloutTotals:
    batches_published: int = 0
    groups_published: int = 0
    batches_received: int = 0
    groups_accepted: int = 0
    groups_trained: int = 0
    duplicate_groups: int = 0
    groups_pooled: int = 0


@dataclass(frozen=True)
class SwarmStatus:
    """A node's swarm at one moment: identity, peers, rollout counters, arrival times, rejections, bans.
    Read by the metrics collector; ``as_dict`` is status.json (its keys are what users parse)."""

    peer_id: str = ""
    swarm_id: str = ""
    addrs: tuple[str, ...] = ()
    round: int = 0
    policy_version: int = 0
    model: str = ""
    tokenizer: str = ""
    connected: int = 0
    dht: DHTHealth = field(default_factory=DHTHealth)
    disk_write_failures: int = 0
    updated: float = 0.0
    peers: dict[str, PeerStatus] = field(default_factory=dict)
    rollouts: RolloutTotals = field(default_factory=RolloutTotals)
    arrival: ArrivalHistogram = field(default_factory=ArrivalHistogram)
    rejected: dict[str, int] = field(default_factory=dict)
    fetch_failures: dict[str, int] = field(default_factory=dict)
    roster_refused: dict[str, int] = field(default_factory=dict)
    notices: dict[str, int] = field(default_factory=dict)  # received and refused, by outcome
    pulls_by_source: dict[str, int] = field(default_factory=dict)  # batches found by notice / poll / holder
    bans: tuple[tuple[str, float, int, str], ...] = ()  # peer, seconds left, count, reason
    client_mode: bool = False  # the DHT runs as a client: behind NAT, peers pull over its connections
    reachability: str = ""  # the dial-back verdict (``Transport.reachability``)

    @classmethod
    def take(
        cls, *, roster: Roster, arrivals: ArrivalsSnapshot, book: PeerBook, rejections: Mapping[str, int],
        **fields,
    ) -> SwarmStatus:  # fmt: skip
        """From the parts; ``fields`` are the rest, among them ``connected`` and ``dht``, which ask the
        daemon."""
        now, counters = time.time(), arrivals.counters
        return cls(
            updated=now,
            peers={
                peer: _peer(book, peer, card, progress, now)
                for peer, (card, progress) in roster.members_progress().items()
            },
            rollouts=RolloutTotals(
                counters.batches_published, counters.groups_published, counters.batches_received,
                counters.groups_accepted, counters.groups_trained, counters.duplicate_groups, arrivals.pooled,
            ),
            arrival=copy.deepcopy(counters.arrival), rejected=dict(sorted(rejections.items())),
            fetch_failures=dict(counters.fetch_failures), roster_refused=roster.refusals(),
            pulls_by_source=dict(arrivals.pulls_by_source),
            bans=tuple((p, round(left, 1), n, why) for p, left, n, why in book.bans()), **fields,
        )  # fmt: skip

    @classmethod
    def from_dict(cls, d: Mapping) -> SwarmStatus:
        """A status read back from status.json (``as_dict``'s inverse)."""
        arrival = d["arrival_s"]
        return cls(
            peer_id=d["peer_id"], swarm_id=d["swarm_id"], addrs=tuple(d["addrs"]), round=d["round"],
            policy_version=d["policy_version"], model=d["model"], tokenizer=d["tokenizer"],
            connected=d["connected"], dht=DHTHealth(**d["dht"]), disk_write_failures=d["disk_write_failures"],
            updated=d["updated"], peers={peer: PeerStatus(**p) for peer, p in d["peers"].items()},
            rollouts=RolloutTotals(**d["rollouts"]),
            arrival=ArrivalHistogram(list(arrival["buckets"].values()), arrival["sum"], arrival["count"]),
            rejected=d["rejected"], fetch_failures=d["fetch_failures"], roster_refused=d["roster_refused"],
            notices=d["notices"], pulls_by_source=d["pulls_by_source"],
            bans=tuple((b["peer"], b["remaining_s"], b["count"], b["reason"]) for b in d["bans"]),
            client_mode=d.get("client_mode", False), reachability=d.get("reachability", ""),
        )  # fmt: skip

    def as_dict(self) -> dict:
        return {
            "peer_id": self.peer_id, "swarm_id": self.swarm_id, "addrs": list(self.addrs),
            "round": self.round, "policy_version": self.policy_version, "model": self.model,
            "tokenizer": self.tokenizer, "connected": self.connected, "dht": asdict(self.dht),
            "disk_write_failures": self.disk_write_failures, "updated": self.updated,
            "peers": {peer: asdict(p) for peer, p in self.peers.items()},
            "rollouts": asdict(self.rollouts),
            "arrival_s": {
                "buckets": dict(zip(map(str, ARRIVAL_BUCKETS_S), self.arrival.counts, strict=True)),
                "sum": self.arrival.total,
                "count": self.arrival.n,
            },
            "rejected": self.rejected, "fetch_failures": self.fetch_failures,
            "roster_refused": self.roster_refused, "notices": self.notices,
            "pulls_by_source": self.pulls_by_source,
            "client_mode": self.client_mode, "reachability": self.reachability,
            "bans": [
                {"peer": p, "remaining_s": left, "count": n, "reason": why} for p, left, n, why in self.bans
            ],
        }  # fmt: skip


def _peer(
    book: PeerBook, peer: str, card: RosterCard, progress: tuple[int, int, float], now: float
) -> PeerStatus:
    at_round, policy_version, signed_at = progress
    return PeerStatus(
        card.model_name, card.tokenizer_fingerprint, policy_version, at_round, round(now - signed_at, 1),
        book.is_banned(peer), book.has_standing(peer),
    )  # fmt: skip


def write_status(run_dir: Path, status: SwarmStatus, failures: WriteFailures | None = None) -> None:
    """``<run_dir>/status.json``, replaced atomically, read by ``swarmnode status``. With ``failures``, an
    OSError (a full disk) is counted there and said once instead of raised."""
    path = run_dir / STATUS_FILE
    with failures.guard(path) if failures is not None else contextlib.nullcontext():
        atomic_write(path, json.dumps(status.as_dict(), indent=1))
