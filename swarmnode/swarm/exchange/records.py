"""What a swarm node writes down about its exchanges: counters, arrival times, round counts, two run-dir
files (``status.json`` is ``exchange.status``).

- ``peer_groups.jsonl`` (``append_peer_groups``), the audit trail: every peer group chosen for training
  is one JSON line: our ``round``, the ``producer`` peer id (the verified signer), its
  ``producer_round``, ``policy_version`` and ``model``, the ``task`` (``TaskRef.key()``), the number of
  ``completions`` and ``texts_sha256`` (sha256 of the JSON list of completion texts). Append-only: after
  a resume from a checkpoint, rounds that run again can appear twice.
- ``share.jsonl`` (``ShareTrace``, for benchmarks/swarm_latency.py): with ``SWARMNODE_SHARE_TRACE=1`` in
  the environment the node appends one JSON line per event, all times wall-clock ``time.time()``:
  ``publish`` (own batch: publish start, announcement timestamp, DHT store done, peers notified),
  ``batch`` (one per pull of a peer batch by the exchange service: its author ``peer``, the ``holder``
  that served it, ``via`` notice or poll, the announcement's signed timestamp, when the read that first
  showed it started and returned (a notice: its arrival, twice), fetch start and end, verification end,
  groups accepted or the fetch failure reason) and ``exchange`` (start, end, live peers, peers
  delivered, and what ended the wait: ``Arrivals.wait_for``). Off by default: nothing is written.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from swarmnode.common import WriteFailures
from swarmnode.rollouts import RolloutGroup
from swarmnode.swarm.exchange.pool import texts_digest
from swarmnode.swarm.net.counts import TransportCounts

SHARE_TRACE_ENV = "SWARMNODE_SHARE_TRACE"
SHARE_TRACE_FILE = "share.jsonl"
PEER_GROUPS_FILE = "peer_groups.jsonl"
ARRIVAL_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


@dataclass
class ArrivalHistogram:
    """Seconds from a peer's signed announcement to its batch verified here (cumulative buckets)."""

    counts: list[int] = field(default_factory=lambda: [0] * len(ARRIVAL_BUCKETS_S))
    total: float = 0.0
    n: int = 0

    def observe(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)  # clocks agree only within a few seconds
        for i, bound in enumerate(ARRIVAL_BUCKETS_S):
            if seconds <= bound:
                self.counts[i] += 1
        self.total += seconds
        self.n += 1


@dataclass(frozen=True)
class SwarmCounters:
    """The exchange's totals at one moment (``Arrivals.snapshot``): batches and groups published, batches
    received, groups accepted (fresh), trained on and duplicate, pulls failed by reason, arrival times."""

    batches_published: int = 0
    groups_published: int = 0
    batches_received: int = 0
    groups_accepted: int = 0
    groups_trained: int = 0
    duplicate_groups: int = 0
    fetch_failures: dict[str, int] = field(default_factory=dict)
    arrival: ArrivalHistogram = field(default_factory=ArrivalHistogram)


class ShareTrace:
    """The opt-in timing trace (see the module docstring); calling it never raises."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / SHARE_TRACE_FILE if os.environ.get(SHARE_TRACE_ENV) == "1" else None

    def __call__(self, event: str, **fields) -> None:
        if self.path is None:
            return
        try:
            with self.path.open("a") as f:
                f.write(json.dumps({"event": event, **fields}) + "\n")
        except OSError:
            pass


def append_peer_groups(
    run_dir: Path, round_: int, groups: list[RolloutGroup], failures: WriteFailures | None = None
) -> None:
    """Append one line per peer group chosen for training to ``<run_dir>/peer_groups.jsonl`` (audit).
    With ``failures``, an OSError (a full disk) is counted there and said once instead of raised."""
    if not groups:
        return
    path = run_dir / PEER_GROUPS_FILE
    with failures.guard(path) if failures is not None else contextlib.nullcontext():
        _append_peer_groups(path, round_, groups)


def _append_peer_groups(path: Path, round_: int, groups: list[RolloutGroup]) -> None:
    with path.open("a") as f:
        for group in groups:
            p = group.provenance
            line = {
                "round": round_,
                "producer": p.producer,
                "producer_round": p.round,
                "policy_version": p.policy_version,
                "model": p.model_name,
                "task": group.ref.key(),
                "completions": len(group.completions),
                "texts_sha256": texts_digest(group),
            }
            f.write(json.dumps(line) + "\n")


@dataclass(frozen=True)
class PeerRoundCounts:
    """What one round's exchange received and cost: the counters' growth since the previous round.

    ``traffic`` is this node's network work in the round (``TRAFFIC``): notices sent and received,
    pulls started, bytes pulled in and served out; what must not grow with the swarm's size
    (docs/scaling.md)."""

    batches_received: int = 0
    groups_accepted: int = 0
    groups_trained: int = 0
    rejected: dict[str, int] = field(default_factory=dict)  # by reason
    fetch_failures: dict[str, int] = field(default_factory=dict)  # by reason
    traffic: dict[str, int] = field(default_factory=dict)  # TRAFFIC -> count

    def as_dict(self) -> dict:
        """The keys of a round's metrics.jsonl record."""
        return {
            "peer_batches_received": self.batches_received,
            "peer_groups_accepted": self.groups_accepted,
            "peer_groups_trained": self.groups_trained,
            "peer_rejected": dict(self.rejected),
            "peer_fetch_failures": dict(self.fetch_failures),
            **{f"peer_{name}": self.traffic.get(name, 0) for name in TRAFFIC},
        }


# a node's network work, per round: the keys of ``PeerRoundCounts.traffic``
TRAFFIC = ("notices_sent", "notices_received", "pulls", "bytes_in", "bytes_out")


def traffic_totals(transport: TransportCounts, notices: dict[str, int]) -> dict[str, int]:
    """This node's cumulative ``TRAFFIC`` from the transport's counters and the notice receiver's."""
    return {
        "notices_sent": transport.pulls.notices_sent,
        "notices_received": notices.get("received", 0),
        "pulls": transport.pulls.started,
        "bytes_in": transport.pulls.fetch_bytes,
        "bytes_out": transport.serving.served_bytes,
    }


class RoundCounts:
    """Takes a ``PeerRoundCounts`` each round: the growth of the totals handed in since the last take."""

    def __init__(self) -> None:
        self._last = PeerRoundCounts()

    def take(
        self, counters: SwarmCounters, rejections: Mapping[str, int], traffic: dict[str, int]
    ) -> PeerRoundCounts:
        now = PeerRoundCounts(
            counters.batches_received, counters.groups_accepted, counters.groups_trained,
            dict(rejections), dict(counters.fetch_failures), dict(traffic),
        )  # fmt: skip
        last, self._last = self._last, now
        return PeerRoundCounts(
            now.batches_received - last.batches_received,
            now.groups_accepted - last.groups_accepted,
            now.groups_trained - last.groups_trained,
            dict(+(Counter(now.rejected) - Counter(last.rejected))),
            dict(+(Counter(now.fetch_failures) - Counter(last.fetch_failures))),
            {name: now.traffic.get(name, 0) - last.traffic.get(name, 0) for name in TRAFFIC},
        )
