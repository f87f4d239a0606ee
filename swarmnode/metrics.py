"""What a node's metrics say: the Prometheus families, the ``/health`` verdict and the status page's data.

``NodeCollector`` derives them at scrape time from what the node hands over (``observe_*``: its latest
round record, its swarm status, its checkpoint time), so the round loop only hands over what it already
computes; ``metrics_server.MetricsServer`` serves them. Names carry the ``swarmnode_`` prefix and unit
suffixes.

``/health`` answers ``{"status": "ok"}`` (HTTP 200) or ``{"status": "degraded", "reasons": [...]}`` (HTTP
503) when a check fails: no round for much longer than the last one took, the DHT process gone, no
successful DHT read or write for ``HEALTH_DHT_STALE_S``, or (swarm nodes) no peer in the roster. The same
verdict is exported as ``swarmnode_health_ok`` (with ``swarmnode_dht_alive``) for the alert rules.

``/`` is the status page for people (``status_page``: curves, peers, rejections, health), ``/page.json``
what it refreshes from; both read the node's run folder through a ``run_view.RunFolderReader``, within its
byte bounds and again only when a file changed, so asking for them as often as one likes costs the node
little more than a scrape.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)

from swarmnode import __version__, status_page
from swarmnode.errors import StatusError
from swarmnode.run_view import RunFolderReader
from swarmnode.swarm.exchange.records import ARRIVAL_BUCKETS_S

if TYPE_CHECKING:
    from swarmnode.common import WriteFailures
    from swarmnode.round_record import RoundRecord
    from swarmnode.swarm.exchange.status import SwarmStatus

HEALTH_ROUND_STALL_FACTOR = 5.0  # degraded when no round for this many times the last round's duration
HEALTH_MIN_ROUND_AGE_S = 300.0  # ... but never sooner than this after the last round
HEALTH_DHT_STALE_S = 300.0  # degraded when the last successful DHT read (or write) is older than this

# ``RoundRecord`` attribute (dotted into ``train``) -> (metric name, help); all gauges of the last round
ROUND_GAUGES = {
    "policy_version": ("swarmnode_policy_version", "Policy version (optimizer steps so far)."),
    "format_rate": ("swarmnode_answer_format_ratio", "Share of local completions using the answer tags."),
    "sample_tokens_per_s": ("swarmnode_sampling_tokens_per_second", "Sampling throughput, last round."),
    "train.loss": ("swarmnode_loss", "Policy loss of the last update."),
    "train.kl": ("swarmnode_kl", "KL to the reference policy per token (0 when off)."),
    "train.grad_norm": ("swarmnode_grad_norm", "Gradient norm before clipping."),
    "train.ess": (
        "swarmnode_importance_ess_ratio",
        "Effective sample size of the importance weights (0..1).",
    ),
    "train.is_weight_mean": ("swarmnode_importance_weight_mean", "Mean importance weight."),
    "train.is_weight_max": ("swarmnode_importance_weight_max", "Largest importance weight."),
    "train.masked_frac": ("swarmnode_masked_token_ratio", "Share of tokens masked out of the loss."),
    "train.peer_gated_frac": (
        "swarmnode_peer_gated_token_ratio",
        "Share of peer completion tokens the span defence kept out of the loss (offpolicy.peer_defence).",
    ),
    "train.behaviour_kl": ("swarmnode_behaviour_kl", "KL(behaviour || learner), k1 estimate."),
    "groups_kept": ("swarmnode_groups_trained", "Question groups in the last update (nonzero advantage)."),
}
PHASES = ("sample", "score", "share", "train", "sync", "total")


class NodeCollector:
    """Turns the node's latest state into metric families at scrape time, and into the status page's data
    (``page``: its run folder ``run_dir``, read by ``run_view.RunFolderReader``, with its health).

    What it turns comes in through the ``observe_*`` methods alone (the round loop, the swarm's status
    hook, the checkpointer); scrapes read it from the server's threads. ``write_failures``: the run log's
    ``common.WriteFailures`` (appends a full disk refused), counted in ``swarmnode_disk_write_failures``."""

    def __init__(
        self, info: dict[str, str], run_dir: Path | None = None, write_failures: WriteFailures | None = None
    ):
        self._info = info
        self._reader = RunFolderReader(run_dir) if run_dir is not None else None
        self._write_failures = write_failures
        self._started = time.time()
        self._rounds = 0
        self._record: RoundRecord | None = None
        self._round_time: float | None = None  # time.time() when the last round was observed
        self._swarm: SwarmStatus | None = None
        self._checkpoint_time: float | None = None

    def observe_info(self, info: dict[str, str]) -> None:
        """The node's labels (``node_info``), once its model and sampler are known."""
        self._info = info

    def observe_round(self, record: RoundRecord, at: float | None = None) -> None:
        """A round completed at ``at`` (time.time(), default now) with ``record``."""
        self._record, self._round_time = record, time.time() if at is None else at
        self._rounds += 1

    def observe_swarm(self, status: SwarmStatus) -> None:
        """The swarm's latest status (the swarm hands over each one it writes)."""
        self._swarm = status

    def observe_checkpoint(self, at: float | None = None) -> None:
        """A checkpoint was written at ``at`` (time.time(), default now)."""
        self._checkpoint_time = time.time() if at is None else at

    def problems(self, now: float) -> list[str]:
        """Why the node is degraded (empty: healthy). The swarm checks read the status the swarm hands
        over each round (a ``SwarmStatus``: its ``dht`` and the roster)."""
        reasons = []
        if self._record is not None and self._round_time is not None:
            age = now - self._round_time
            expected = self._record.seconds_total * HEALTH_ROUND_STALL_FACTOR
            if age > max(expected, HEALTH_MIN_ROUND_AGE_S):
                reasons.append(
                    f"no round for {age:.0f} s (the last took {expected / HEALTH_ROUND_STALL_FACTOR:.0f} s)"
                )
        s = self._swarm
        if s is not None:
            if not s.dht.alive:
                reasons.append("the DHT process is not running")
            for what, last in (("read", s.dht.last_read_ok), ("write", s.dht.last_write_ok)):
                if now - (last or self._started) > HEALTH_DHT_STALE_S:
                    reasons.append(f"no successful DHT {what} for {now - (last or self._started):.0f} s")
            if not s.peers:
                reasons.append(f"no peer in the roster ({s.connected} connected)")
        return reasons

    def health(self) -> dict:
        """The ``/health`` answer."""
        round_ = self._record.round if self._record is not None else None
        uptime = round(time.time() - self._started, 1)
        reasons = self.problems(time.time())
        status = "degraded" if reasons else "ok"
        return {
            "status": status,
            "reasons": reasons,
            "rounds": self._rounds,
            "uptime_s": uptime,
            "round": round_,
        }

    def page(self) -> dict:
        """The status page's data: the run folder's view (None before the node wrote any) and health."""
        view = None
        if self._reader is not None:
            with contextlib.suppress(StatusError):  # no round and no status written yet
                view = self._reader.read()
        return status_page.node_page(view, live=True, info=self._info, health=self.health())

    def collect(self) -> Iterator:
        yield _info("swarmnode_node", "The node: model, sampler backend, version, peer id.", self._info)
        rounds = CounterMetricFamily("swarmnode_rounds", "Rounds completed by this process.")
        rounds.add_metric([], self._rounds)
        yield rounds
        yield _gauge(
            "swarmnode_health_ok", "1 when /health says ok, 0 when degraded.", not self.problems(time.time())
        )
        swarm_failures = self._swarm.disk_write_failures if self._swarm else 0
        own_failures = self._write_failures.count if self._write_failures is not None else 0
        disk = CounterMetricFamily(
            "swarmnode_disk_write_failures", "Writes outside checkpoints that failed (a full disk): skipped."
        )
        disk.add_metric([], own_failures + swarm_failures)
        yield disk
        if self._checkpoint_time is not None:
            yield _gauge("swarmnode_checkpoint_timestamp_seconds", "When the last checkpoint was written.",
                         self._checkpoint_time)  # fmt: skip
        torch = sys.modules.get("torch")  # the node has it loaded; never import it just for a scrape
        if torch is not None and torch.cuda.is_available():
            yield _gauge("swarmnode_gpu_memory_allocated_bytes", "GPU memory held by tensors (device 0).",
                         torch.cuda.memory_allocated())  # fmt: skip
        if self._record is not None:
            yield from self._round_families()
        if self._swarm is not None:
            yield from self._swarm_families()

    def _round_families(self) -> Iterator:
        r = self._record
        yield _gauge("swarmnode_round", "Number of the last completed round.", r.round)
        for attribute, (name, doc) in ROUND_GAUGES.items():
            yield _gauge(name, doc, attrgetter(attribute)(r))
        reward = GaugeMetricFamily("swarmnode_reward", "Mean reward of the last round.", labels=["source"])
        reward.add_metric(["local"], r.reward_mean)
        reward.add_metric(["peer"], r.reward_peer_mean)
        yield reward
        by_task = GaugeMetricFamily("swarmnode_task_reward", "Mean local reward per task.", labels=["task"])
        for task, value in r.reward_by_task.items():
            by_task.add_metric([task], value)
        yield by_task
        groups = GaugeMetricFamily("swarmnode_round_groups", "Groups in the last round.", labels=["source"])
        for source in ("local", "peer", "replayed"):
            groups.add_metric([source], getattr(r, f"groups_{source}"))
        yield groups
        phase = GaugeMetricFamily(
            "swarmnode_round_phase_seconds", "Last round's time by phase.", labels=["phase"]
        )
        for name in PHASES:
            phase.add_metric([name], getattr(r, f"seconds_{name}"))
        yield phase
        clip = GaugeMetricFamily("swarmnode_clip_ratio", "Share of tokens clipped.", labels=["side"])
        clip.add_metric(["low"], r.train.clip_low_frac)
        clip.add_metric(["high"], r.train.clip_high_frac)
        yield clip

    def _swarm_families(self) -> Iterator:
        s = self._swarm
        arrival = HistogramMetricFamily(
            "swarmnode_publish_to_arrival_seconds",
            "From a peer's signed announcement to its batch verified here.",
        )
        a = s.arrival
        buckets = [(str(bound), count) for bound, count in zip(ARRIVAL_BUCKETS_S, a.counts, strict=True)]
        arrival.add_metric([], [*buckets, ("+Inf", a.n)], a.total)
        yield arrival
        yield _gauge("swarmnode_peers_known", "Peers in the swarm roster.", len(s.peers))
        yield from dht_families(asdict(s.dht))
        yield _gauge("swarmnode_peers_connected", "Peers with a libp2p connection.", s.connected)
        yield _gauge(
            "swarmnode_peers_banned", "Peers banned right now.", sum(p.banned for p in s.peers.values())
        )
        rollouts = CounterMetricFamily(
            "swarmnode_rollout_groups", "Question groups by what happened to them.", labels=["event"]
        )
        for event in ("published", "accepted", "trained"):
            rollouts.add_metric([event], getattr(s.rollouts, f"groups_{event}"))
        yield rollouts
        batches = CounterMetricFamily("swarmnode_rollout_batches", "Rollout batches.", labels=["event"])
        batches.add_metric(["published"], s.rollouts.batches_published)
        batches.add_metric(["received"], s.rollouts.batches_received)
        yield batches
        rejected = CounterMetricFamily(
            "swarmnode_rejected", "Peer messages rejected, by reason.", labels=["reason"]
        )
        # Every known reason is exported from 0 (not only those seen so far), so that rate() and the
        # reject-rate alert have a series on a healthy node and the first rejection counts as an increase.
        from swarmnode.swarm.exchange.verify import ALL_REASONS
        from swarmnode.swarm.net.transport import (
            FETCH_FAILURE_REASONS,  # swarm nodes have these loaded already
        )

        for reason, count in {**dict.fromkeys(ALL_REASONS, 0), **s.rejected}.items():
            rejected.add_metric([reason], count)
        yield rejected
        failed = CounterMetricFamily(
            "swarmnode_fetch_failures", "Payload pulls that failed.", labels=["reason"]
        )
        for reason, count in {**dict.fromkeys(FETCH_FAILURE_REASONS, 0), **s.fetch_failures}.items():
            failed.add_metric([reason], count)
        yield failed
        from swarmnode.swarm.net.notices import NOTICE_OUTCOMES

        notices = CounterMetricFamily(
            "swarmnode_notices",
            "Batch notices from peers, by outcome (received or why refused).",
            labels=["outcome"],
        )
        for outcome, count in {**dict.fromkeys(NOTICE_OUTCOMES, 0), **s.notices}.items():
            notices.add_metric([outcome], count)
        yield notices
        refused = CounterMetricFamily(
            "swarmnode_roster_refused",
            "Roster cards not admitted (from the DHT or a notice), by reason.",
            labels=["reason"],
        )
        # roster_full from 0 (a full roster is what an operator watches for); other reasons once seen
        for reason, count in {"roster_full": 0, **s.roster_refused}.items():
            refused.add_metric([reason], count)
        yield refused


def dht_families(dht: dict) -> Iterator:
    """The DHT liveness metrics of a node (its status's ``DHTHealth``, as a dict) or a bootstrap (``alive``
    alone)."""
    if "alive" in dht:
        yield _gauge("swarmnode_dht_alive", "1 while the DHT process runs.", dht["alive"])
    for what in ("read", "write"):
        if dht.get(f"last_{what}_ok"):
            yield _gauge(f"swarmnode_dht_last_{what}_timestamp_seconds", f"Last successful DHT {what}.",
                         dht[f"last_{what}_ok"])  # fmt: skip
    failures = CounterMetricFamily("swarmnode_dht_failures", "DHT calls that failed.", labels=["op"])
    for op in ("read", "store"):
        failures.add_metric([op], dht.get(f"{op}_failed", 0))
    yield failures


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc)
    family.add_metric([], float(value))
    return family


def _info(name: str, doc: str, labels: dict[str, str]) -> InfoMetricFamily:
    family = InfoMetricFamily(name, doc)
    family.add_metric([], labels)
    return family


def node_info(peer_id: str, model: str, backend: str) -> dict[str, str]:
    return {"peer_id": peer_id, "model": model, "backend": backend, "version": __version__}
