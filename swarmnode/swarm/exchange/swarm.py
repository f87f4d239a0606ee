"""SAPO exchange, the round loop's view of the swarm: publish this node's groups, take J peer groups.

``Swarm`` is a thin façade: it builds the parts (transport, standing, verifier, roster, announcer, the
data plane's service and the arrivals it fills) and hands each what it uses. Per round (``exchange``)
the node (1) puts its local groups into one signed RolloutBatch, offers the payload, pushes the signed
announcement to its notice targets (``exchange.fanout``: a ring, and its last batches' pullers) and
stores it in the DHT; (2) takes from the pool that the service (``exchange.service``, beside the round
loop) keeps filled with verified peer groups, waiting (``Arrivals.wait_for``, never past the share
deadline) only while the pool lacks J informative groups that arrived this round and some live peer has
not delivered since our last round (peers without standing only while no live peer has it, and until
their first miss: ``Roster.to_wait_for``) or a pull is still going; (3) chooses J peer groups
(``GroupPool.select``: zero-advantage groups dropped after local re-scoring, by freshness and score, at
most ``producer_cap(J)`` from one producer). Each peer group is trained on at most once.

What it writes down: status.json (``exchange.status``), the peer_groups.jsonl audit trail and the opt-in
share trace (``exchange.records``).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from swarmnode.common import WriteFailures, log
from swarmnode.config import NodeConfig
from swarmnode.rollouts import RolloutGroup
from swarmnode.swarm.exchange import records
from swarmnode.swarm.exchange.announcer import Announcer
from swarmnode.swarm.exchange.arrivals import Arrivals, ArrivalsSnapshot
from swarmnode.swarm.exchange.compat import roster_extra
from swarmnode.swarm.exchange.peers import PeerBook
from swarmnode.swarm.exchange.puller import pull_budget
from swarmnode.swarm.exchange.roster import Roster
from swarmnode.swarm.exchange.service import ExchangeService
from swarmnode.swarm.exchange.standing import ScoringBudget
from swarmnode.swarm.exchange.status import DHTHealth, SwarmStatus, write_status
from swarmnode.swarm.exchange.verify import ReceiveLimits, Verifier
from swarmnode.swarm.net import dht, notices
from swarmnode.swarm.net.origins import OriginCaps
from swarmnode.swarm.net.transport import Transport
from swarmnode.swarm.wire import codec, convert, dht_rules, limits, protocol, work

MIN_DHT_WAIT_S = 0.5  # a DHT call at (or past) the share deadline still gets this long


class Swarm:
    """One node's membership in a swarm; ``exchange`` is the round loop's hook."""

    def __init__(
        self,
        cfg: NodeConfig,
        *,
        identity,
        bank,
        policy,
        identity_path: Path,
        run_dir: Path,
        on_status: Callable[[SwarmStatus], None] | None = None,
        work_nonce: bytes = b"",
    ):
        """``work_nonce``: the identity's proof of work (``identity_work.load_or_mint_work``), at least
        ``swarm.identity_work_bits``: peers refuse a card without it, so a node without it stops here."""
        if not work.has_work(identity.public_key, work_nonce, cfg.swarm.identity_work_bits):
            raise ValueError(
                f"work_nonce does not prove swarm.identity_work_bits = {cfg.swarm.identity_work_bits}"
            )
        self.cfg = cfg
        self.swarm_id = limits.validate_swarm_id(cfg.swarm.swarm_id)
        self.identity = identity
        self.policy = policy
        self.run_dir = run_dir
        self.on_status = on_status  # e.g. the metrics collector: gets every status written
        self.ttl_s = round_ttl_s(cfg.swarm.share_deadline_s)
        self.transport = Transport(identity_path, cfg.swarm)
        self.book = PeerBook(ban_base_s=cfg.swarm.ban_s)
        receive_limits = ReceiveLimits.for_node(
            cfg.sampling, tokenizer_fingerprint=policy.tokenizer_fingerprint, vocab_size=len(policy.tokenizer)
        )  # raises ConfigError at start if our own config could not go on the wire
        # the verifier runs on the service thread: its own TaskBank (the dataset cache is not safe to share
        # with the sampling thread)
        self.verifier = Verifier(
            copy.deepcopy(bank), self.swarm_id, self.book, max_age_s=self.ttl_s, limits=receive_limits,
            scoring=ScoringBudget(self.book.has_standing),
        )  # fmt: skip
        self.arrivals = Arrivals(ranking=self.book)  # the choice of groups by what this node measured
        self.trace = records.ShareTrace(run_dir)
        self.roster = Roster(
            own_peer_id=identity.peer_id, swarm_id=self.swarm_id, fingerprint=bank.fingerprint,
            book=self.book, ttl_s=self.ttl_s, on_read=self.arrivals.wake,
            work_bits=cfg.swarm.identity_work_bits, view_size=cfg.swarm.view_size,
        )  # fmt: skip
        self.announcer = Announcer(
            self.transport, identity, self.swarm_id, model_name=policy.name,
            tokenizer_fingerprint=policy.tokenizer_fingerprint, extra=roster_extra(bank.fingerprint),
            ttl_s=self.ttl_s, roster_size=lambda: len(self.roster), work_nonce=work_nonce,
        )  # fmt: skip
        self.service = ExchangeService(
            transport=self.transport, swarm_id=self.swarm_id, roster=self.roster, verifier=self.verifier,
            book=self.book, arrivals=self.arrivals, trace=self.trace,
            origins=OriginCaps.from_config(cfg.swarm),
            pulls_per_round=pull_budget(cfg.swarm.peer_groups_per_round),
        )  # fmt: skip
        self._stores = ThreadPoolExecutor(1, thread_name_prefix="announce-store")
        self._round_counts = records.RoundCounts()
        self.addrs: list[str] = []
        self._stamps = limits.Stamper()  # (seq, timestamp) of the batches and announcements it signs
        self._status_at = (0, 0)  # the round and policy version status.json last named
        self.write_failures = WriteFailures()  # status / peer_groups writes that failed (full disk)

    def start(self, round_: int = 0, policy_version: int = 0) -> list[str]:
        """Start the transport, the announcer (this node's roster card, re-put on its own timer) and the
        data plane."""
        self.addrs = self.transport.start()
        self.transport.payloads.set_peer_filter(lambda peer: not self.book.is_banned(peer))
        # the serving slots kept for peers with standing: groups of theirs this node trained on, not decayed
        self.transport.payloads.set_peer_standing(self.book.has_standing)
        self.announcer.start(self.addrs, round_, policy_version)
        self.arrivals.open_round(round_)
        self.service.start()
        return self.addrs

    def shutdown(self) -> None:
        """Put the offline card (a short bounded wait), then stop the data plane and the transport."""
        self.announcer.stop()  # first: peers stop waiting for us as early as possible
        self.service.stop()
        self._stores.shutdown(cancel_futures=True)  # a store in flight ends within the transport's timeout
        self.transport.shutdown()

    def publish(
        self, round_: int, policy_version: int, groups: list[RolloutGroup], deadline: float | None = None
    ) -> None:
        """Offer ``groups`` as one signed batch, notify NOTICE_FANOUT roster peers and the peers that pulled
        our last batches (exchange/fanout.py; the rest poll), store the announcement off the path."""
        groups = groups[: limits.MAX_GROUPS_PER_BATCH]
        if not groups:
            return
        t_start = time.time()
        seq, timestamp = self._stamps.stamp()
        batch = convert.make_rollout_batch(
            groups, peer_id=self.identity.peer_id, swarm_id=self.swarm_id, round=round_,
            policy_version=policy_version, model_name=self.policy.name,
            tokenizer_fingerprint=self.policy.tokenizer_fingerprint, timestamp=timestamp, seq=seq,
            include_logprobs=self.cfg.swarm.share_logprobs,
        )  # fmt: skip
        data = codec.encode_message(self.identity, self.swarm_id, batch)
        seq, timestamp = self._stamps.stamp()
        announcement = protocol.announcement_for(batch, data, timestamp=timestamp, seq=seq)
        pullers = self.transport.payloads.recent_pullers()  # of our last batches, before this one is offered
        self.transport.payloads.offer(announcement.payload_sha256, data)
        record = codec.encode_message(self.identity, self.swarm_id, announcement)
        peers = self.roster.notice_targets(pullers=pullers)
        notices.notify(self.transport, peers, self.identity.peer_id, record, self.announcer.card_record)

        def store_fallback() -> None:
            """The DHT record: for peers the notices missed. Off the round's path, one store at a time."""
            stored = dht.put_announcement(
                self.transport.records, self.swarm_id, self.identity.peer_id, record, _dht_wait(deadline)
            )
            self.trace(
                "publish", round=round_, started=t_start, announced_ts=announcement.timestamp,
                stored=time.time(), ok=stored, groups=len(groups), bytes=len(data), notified=len(peers),
            )  # fmt: skip

        self._stores.submit(store_fallback)
        self.arrivals.published(len(groups))

    def wait_for_peers(self) -> set[str]:
        """Block until ``swarm.min_peers`` live peers are in the roster, a peer has started its rounds (the
        swarm runs already: ``Roster.running_peer``), or ``wait_for_peers_s`` passes."""
        wanted = self.cfg.swarm.min_peers
        deadline = time.monotonic() + self.cfg.swarm.wait_for_peers_s
        self.roster.wait_first_read(deadline)  # the service reads the roster
        if len(self.roster.live_peers()) < wanted:
            log(f"waiting for {wanted} peer(s) to join (up to {self.cfg.swarm.wait_for_peers_s:.0f}s)")
        # a roster page every ROSTER_MIN_GAP_S while peers are missing
        live, running = self.roster.wait_live(wanted, deadline, self.service.read_roster_soon)
        if len(live) < wanted:
            why = "its rounds have begun" if running else f"waited {self.cfg.swarm.wait_for_peers_s:.0f}s"
            log(f"starting with {len(live)} of {wanted} peers: {why}")
        return live

    def exchange(self, round_: int, policy_version: int, local: list[RolloutGroup]) -> list[RolloutGroup]:
        """Publish ``local``, return up to J peer groups from the pool (module docstring)."""
        wanted = self.cfg.swarm.peer_groups_per_round
        t_start = time.time()
        deadline = time.monotonic() + self.cfg.swarm.share_deadline_s  # bounds publishing too
        self.announcer.set_progress(round_, policy_version)
        self.book.tick_round()  # the score's per-round decay (exchange/standing.py)
        self.arrivals.open_round(round_)
        self.publish(round_, policy_version, local, deadline)
        # The peers to wait for are read once (the service's last roster read): one joining mid-exchange
        # has no batch for it yet; peers without standing only as ``to_wait_for`` says. One banned
        # meanwhile, or gone from the roster (an offline card), is waited for no more.
        ended_by, live = self.arrivals.wait_for(
            self.roster.to_wait_for(), self._still_awaited, round_, wanted, deadline
        )
        taken = self.arrivals.take(round_, wanted, live)  # from now on batches are fresh for round + 1
        self.roster.missed(set(taken.missed))
        self.trace(
            "exchange", round=round_, started=t_start, ended=time.time(), live=len(live),
            delivered=taken.delivered, ended_by=ended_by,
        )  # fmt: skip
        records.append_peer_groups(self.run_dir, round_, taken.groups, self.write_failures)
        self.write_status(round_, policy_version)
        return taken.groups

    def credit_trained(self, groups_by_producer: dict[str, int]) -> None:
        """The round's hook after its step: credit each producer for its groups this node trained on (the
        only way a peer earns standing here, exchange/standing.py)."""
        for producer, n_groups in groups_by_producer.items():
            if n_groups > 0 and producer != self.identity.peer_id:
                self.book.credit_trained(producer, n_groups)

    def _still_awaited(self, peer: str) -> bool:
        """Whether the round still waits for ``peer``: in the roster and not banned."""
        return self.roster.holds(peer) and not self.book.is_banned(peer)

    def status(self, round_: int, policy_version: int) -> SwarmStatus:
        """A frozen snapshot of this node's swarm: what status.json and the metrics read."""
        connected, dht = self.transport.connected_peer_count(), DHTHealth.of(self.transport)
        arrivals, rejections = self.arrivals.snapshot(), self.verifier.rejected()
        return self._snapshot(round_, policy_version, connected, dht, arrivals, rejections)

    def _snapshot(
        self, round_: int, policy_version: int, connected: int, dht: DHTHealth, arrivals: ArrivalsSnapshot,
        rejections: dict[str, int],
    ) -> SwarmStatus:  # fmt: skip
        """``status`` with the daemon's answers, the arrivals and the rejections given."""
        return SwarmStatus.take(
            peer_id=self.identity.peer_id, swarm_id=self.swarm_id, addrs=self.addrs, round=round_,
            policy_version=policy_version, model=self.policy.name,
            tokenizer=self.policy.tokenizer_fingerprint, connected=connected, dht=dht, roster=self.roster,
            arrivals=arrivals, book=self.book, rejections=rejections,
            notices=self.service.notices.snapshot(), disk_write_failures=self.write_failures.count,
            client_mode=self.transport.client_mode, reachability=self.transport.reachability,
        )  # fmt: skip

    def round_counts(self) -> records.PeerRoundCounts:
        """Peer traffic since the last call, for the round's metrics record. status.json is rewritten
        from the same snapshots (the arrivals', the rejections'), so its totals are always the sum of the
        records' (the exchange's write comes before the round's training, while batches still arrive)."""
        connected, dht = self.transport.connected_peer_count(), DHTHealth.of(self.transport)
        arrivals, rejections = self.arrivals.snapshot(), self.verifier.rejected()
        traffic = records.traffic_totals(self.transport.counts(), self.service.notices.snapshot())
        counts = self._round_counts.take(arrivals.counters, rejections, traffic)
        self._publish(self._snapshot(*self._status_at, connected, dht, arrivals, rejections))
        return counts

    def write_status(self, round_: int, policy_version: int) -> None:
        """``<run_dir>/status.json`` (``exchange.status.write_status``), also handed to ``on_status``."""
        self._status_at = (round_, policy_version)
        self._publish(self.status(round_, policy_version))

    def _publish(self, status: SwarmStatus) -> None:
        write_status(self.run_dir, status, self.write_failures)
        if self.on_status is not None:
            self.on_status(status)


def round_ttl_s(share_deadline_s: float) -> float:
    """Lifetime of this node's DHT records (and the age a peer's may have): four share deadlines, at least
    a minute, at most half of what storing nodes allow (slack for a slow store after signing)."""
    return min(max(4 * share_deadline_s, 60.0), dht_rules.MAX_RECORD_TTL_S / 2)


def _dht_wait(deadline: float | None) -> float | None:
    """How long a DHT call may take: what is left until ``deadline`` (monotonic), or None (the transport's
    own timeout) without one. A peer that died or a congested DHT can make each call wait its full
    timeout; within an exchange they share the share deadline instead of adding to it."""
    return None if deadline is None else max(deadline - time.monotonic(), MIN_DHT_WAIT_S)
