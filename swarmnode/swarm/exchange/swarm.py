"""SAPO exchange: publish this node's groups, gather verified peer groups, pick J for the round.

Per round the node (1) puts its local groups into one signed RolloutBatch, offers the payload over its
stream handler, pushes the signed announcement to every roster peer (``swarm.net.notices``) and stores it in
the DHT; (2) takes from the pool that the exchange service (``swarm.exchange.service``, a thread beside the
round loop) keeps filled with verified peer groups, waiting (on ``changed``, never past the deadline)
only until every live peer has delivered a batch since our last round; (3) chooses J peer groups
(``GroupPool.select``): zero-advantage groups dropped after local re-scoring, freshest first, uniform
among equally fresh ones. Each peer group is trained on at most once. ``lock`` guards what the round
thread shares with the service (``swarm.exchange.service`` says what).

What it writes down (counters, status.json, the peer_groups.jsonl audit trail, the opt-in share
trace) is ``swarm.exchange.records``; the pool, dedup and the choice of J are ``swarm.exchange.pool``.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from swarmnode.common import BoundedSet, WriteFailures, log
from swarmnode.config import NodeConfig
from swarmnode.rollouts import RolloutGroup
from swarmnode.swarm.exchange import records
from swarmnode.swarm.exchange.announcer import Announcer
from swarmnode.swarm.exchange.peers import PeerBook
from swarmnode.swarm.exchange.pool import GroupPool
from swarmnode.swarm.exchange.records import ShareTrace, SwarmCounters
from swarmnode.swarm.exchange.service import ExchangeService
from swarmnode.swarm.exchange.verify import ReceiveLimits, Verifier, card_fingerprint, roster_extra
from swarmnode.swarm.net import notices
from swarmnode.swarm.net.transport import Transport
from swarmnode.swarm.wire import codec, convert, protocol

MAX_IGNORED_PEERS = 4096  # peers whose roster card was refused, remembered so each is logged once
MIN_DHT_WAIT_S = 0.5  # a DHT call at (or past) the share deadline still gets this long
# roster cards kept at most: every shard full (the DHT's storing nodes hold no more per shard)
MAX_ROSTER_PEERS = protocol.ROSTER_SHARDS * protocol.MAX_SUBKEYS_PER_KEY


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
        on_status: Callable[[dict], None] | None = None,
    ):
        self.cfg = cfg
        self.swarm_id = protocol.validate_swarm_id(cfg.swarm.swarm_id)
        self.identity = identity
        self.policy = policy
        self.run_dir = run_dir
        self.on_status = on_status  # e.g. the metrics collector: gets every status written
        self.transport = Transport(identity_path, cfg.swarm)
        self.book = PeerBook(ban_base_s=cfg.swarm.ban_s)
        limits = ReceiveLimits.for_node(
            cfg.sampling, tokenizer_fingerprint=policy.tokenizer_fingerprint, vocab_size=len(policy.tokenizer)
        )  # raises ConfigError at start if our own config could not go on the wire
        # the verifier runs on the exchange service's thread: its own TaskBank (the dataset cache is not
        # safe to share with the sampling thread)
        self.verifier = Verifier(
            copy.deepcopy(bank), self.swarm_id, self.book, max_age_s=self._round_ttl_s, limits=limits
        )
        self.announcer = Announcer(
            self.transport, identity, self.swarm_id, model_name=policy.name,
            tokenizer_fingerprint=policy.tokenizer_fingerprint, extra=roster_extra(bank.fingerprint),
            ttl_s=self._round_ttl_s, roster_size=lambda: len(self.roster),
        )  # fmt: skip
        self.counters = SwarmCounters()
        self._round_counts = records.RoundCounts()
        self.addrs: list[str] = []
        self.roster: dict[str, protocol.RosterCard] = {}
        # roster peer -> when it signed its newest announcement checked here: a sign of life that does
        # not depend on reading the roster (a loaded DHT's reads time out)
        self._heard: dict[str, float] = {}
        self._ignored_peers: BoundedSet[str] = BoundedSet(MAX_IGNORED_PEERS)
        # peers whose roster card names another task fingerprint: their batches are not pulled
        self._incompatible: BoundedSet[str] = BoundedSet(MAX_IGNORED_PEERS)
        self.lock = threading.RLock()  # shared with the exchange service (swarm.background)
        self.changed = threading.Condition(self.lock)  # a batch settled or the roster was read
        self.service = ExchangeService(self)
        self._stores = ThreadPoolExecutor(1, thread_name_prefix="announce-store")
        self.transport.stream_handlers[notices.NOTICE_STREAM] = self.service.notices.handle
        self._round = 0  # our round, for the pool's freshness tiers of batches arriving now
        self.pool = GroupPool()  # ties broken by os.urandom: not predictable from our public peer id
        # peers not to wait for any more this exchange: their batch arrived (accepted or rejected) or
        # cannot arrive (the pull failed for good, e.g. the peer left right after publishing)
        self._settled: set[str] = set()
        self._last_seq = 0
        self._trace = ShareTrace(run_dir)
        self.write_failures = WriteFailures()  # status / peer_groups writes that failed (full disk)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self, round_: int = 0, policy_version: int = 0) -> list[str]:
        """Start the transport and the announcer (this node's roster card, re-put on its own timer)."""
        self.addrs = self.transport.start()
        self.transport.set_peer_filter(lambda peer: not self.book.is_banned(peer))
        # the serving slots kept for peers in good standing: groups accepted outweigh their strikes
        self.transport.set_peer_standing(lambda peer: self.book.reputation(peer) > 0)
        self.announcer.start(self.addrs, round_, policy_version)
        self._round = round_
        self.service.start()
        return self.addrs

    def shutdown(self) -> None:
        """Put the offline card (a short bounded wait), then stop the transport."""
        self.announcer.stop()  # first: peers stop waiting for us as early as possible
        self.service.stop()
        self._stores.shutdown(cancel_futures=True)  # a store in flight ends within the transport's timeout
        self.transport.shutdown()

    def _next_seq(self) -> int:
        """Strictly increasing across restarts too (wall-clock milliseconds)."""
        self._last_seq = protocol.next_seq(self._last_seq)
        return self._last_seq

    @property
    def _round_ttl_s(self) -> float:
        """Lifetime of this node's DHT records (and the age a peer's may have): four share deadlines, at
        least a minute, at most half of what storing nodes allow (slack for a slow store after signing)."""
        return min(max(4 * self.cfg.swarm.share_deadline_s, 60.0), protocol.MAX_RECORD_TTL_S / 2)

    # -- publishing ------------------------------------------------------------------------------

    @staticmethod
    def _dht_wait(deadline: float | None) -> float | None:
        """How long a DHT call may take: what is left until ``deadline`` (monotonic), or None (the
        transport's own timeout) without one. A peer that died or a congested DHT can make each call wait
        its full timeout; within an exchange they share the share deadline instead of adding to it."""
        return None if deadline is None else max(deadline - time.monotonic(), MIN_DHT_WAIT_S)

    def publish(
        self, round_: int, policy_version: int, groups: list[RolloutGroup], deadline: float | None = None
    ) -> None:
        groups = groups[: protocol.MAX_GROUPS_PER_BATCH]
        if not groups:
            return
        t_start = time.time()
        batch = convert.make_rollout_batch(
            groups,
            peer_id=self.identity.peer_id,
            swarm_id=self.swarm_id,
            round=round_,
            policy_version=policy_version,
            model_name=self.policy.name,
            tokenizer_fingerprint=self.policy.tokenizer_fingerprint,
            timestamp=time.time(),
            seq=self._next_seq(),
            include_logprobs=self.cfg.swarm.share_logprobs,
        )
        data = codec.encode_message(self.identity, self.swarm_id, batch)
        announcement = protocol.announcement_for(batch, data, timestamp=time.time(), seq=self._next_seq())
        self.transport.offer(announcement.payload_sha256, data)
        record = codec.encode_message(self.identity, self.swarm_id, announcement)
        with self.lock:
            peers = [peer for peer in self.roster if not self.book.is_banned(peer)]
        notices.notify(self.transport, peers, self.identity.peer_id, record, self.announcer.card_record)

        def store_fallback() -> None:
            """The DHT record: for peers the notices missed. Off the round's path, one store at a time."""
            stored = self.transport.put_record(
                protocol.announce_key(self.swarm_id, self.identity.peer_id), self.identity.peer_id, record,
                self._round_ttl_s,
                timeout_s=self._dht_wait(deadline),
            )  # fmt: skip
            self._trace(
                "publish", round=round_, started=t_start, announced_ts=announcement.timestamp,
                stored=time.time(), ok=stored, groups=len(groups), bytes=len(data), notified=len(peers),
            )  # fmt: skip

        self._stores.submit(store_fallback)
        with self.lock:
            self.counters.batches_published += 1
            self.counters.groups_published += len(groups)

    # -- collecting ------------------------------------------------------------------------------

    def _live_peers(self, deadline: float | None = None) -> set[str]:
        """Compatible peers in the roster (foreign or incompatible ones are ignored with one line), after
        reading every roster card in the DHT (``admit_card``)."""
        keys = protocol.roster_keys(self.swarm_id)
        shards = self.transport.get_many_records(keys, self._dht_wait(deadline))
        now = time.time()
        with self.lock:  # the roster is shared with the round thread (status, notices)
            for peer, record in (item for shard in shards.values() for item in shard.items()):
                self.admit_card(peer, record, now)
            # a peer silent for a record lifetime (no fresh card, no announcement) is forgotten: churn must
            # not pile up
            for peer in [p for p in self.roster if now - self._signed_last(p) > self._round_ttl_s]:
                del self.roster[peer]
            for peer in [p for p in self._heard if p not in self.roster]:
                del self._heard[peer]
            # Live = from every card held, not only this read's, and from announcements: a read that timed
            # out (a loaded DHT) or returned a refused card must not make known peers vanish. A crashed
            # peer lingers until its card expires; only recently heard-of ones are waited for.
            return {
                peer
                for peer in self.roster
                if now - self._signed_last(peer) < self._round_ttl_s / 2 and not self.book.is_banned(peer)
            }

    def admit_card(self, peer: str, record: bytes, now: float) -> None:
        """A roster card record, read from the DHT or carried by a notice: into the roster if valid.

        A card counts only when it is fresh (signed within the records' lifetime, not ahead of our clock
        by more than the protocol's skew) and its seq is not older than one already seen from that peer;
        the roster holds at most MAX_ROSTER_PEERS cards. Refused cards are counted by reason."""
        with self.lock:
            if peer == self.identity.peer_id:
                return
            if peer not in self.roster and len(self.roster) >= MAX_ROSTER_PEERS:
                self.counters.roster_refused["roster_full"] += 1
                return
            try:
                card, _ = codec.decode_message(
                    record, swarm_id=self.swarm_id, expected_type=protocol.ROSTER_CARD, expected_peer_id=peer
                )
            except protocol.ProtocolError as exc:
                self.counters.roster_refused[exc.reason] += 1
                self._ignore(peer, f"roster card rejected ({exc.reason})")
                return
            if card.protocol_version != protocol.PROTOCOL_VERSION:
                self._ignore(peer, f"speaks protocol v{card.protocol_version}")
                return
            if card_fingerprint(card) != self.verifier.bank.fingerprint:  # skipped, never charged
                self._incompatible.add(peer)
                self.roster.pop(peer, None)
                self._ignore(peer, "another task mix or scorer version")
                return
            self._incompatible.discard(peer)
            try:
                protocol.check_fresh(card.timestamp, now, max_age=self._round_ttl_s)
                seen_as = self.book.check_sequence(
                    peer, protocol.ROSTER_CARD, card.seq, protocol.payload_digest(record), card.timestamp
                )
            except protocol.ProtocolError as exc:  # stale, future-dated or replayed: never live
                self.counters.roster_refused[exc.reason] += 1
                return
            if seen_as == "superseded":  # older than a card already admitted (a lagging replica's)
                return
            if card.offline:  # it stopped cleanly: not waited for, until a later online card says otherwise
                self.roster.pop(peer, None)
            else:
                self.roster[peer] = card

    def _ignore(self, peer: str, why: str) -> None:
        """Say once per peer why its card is not taken."""
        if peer not in self._ignored_peers:
            self._ignored_peers.add(peer)
            log(f"ignoring peer {ascii(peer[:16])}...: {why}")

    def _signed_last(self, peer: str) -> float:
        """When a roster peer last signed something we checked: its card or an announcement."""
        return max(self.roster[peer].timestamp, self._heard.get(peer, 0.0))

    def heard_from(self, peer: str, signed_at: float) -> None:
        """A roster peer's new announcement passed its checks (signature, freshness): it is alive."""
        with self.lock:
            if peer in self.roster:
                self._heard[peer] = max(self._heard.get(peer, 0.0), signed_at)

    def wait_for_peers(self) -> set[str]:
        """Block until ``swarm.min_peers`` live peers are in the roster, or ``wait_for_peers_s`` passes."""
        wanted = self.cfg.swarm.min_peers
        deadline = time.monotonic() + self.cfg.swarm.wait_for_peers_s
        with self.lock:  # the exchange service reads the roster and notifies ``changed``
            while not self.service.roster_reads and time.monotonic() < deadline:
                self.changed.wait(max(deadline - time.monotonic(), 0.0))
            if len(self.service.live) < wanted:
                log(f"waiting for {wanted} peer(s) to join (up to {self.cfg.swarm.wait_for_peers_s:.0f}s)")
            while len(self.service.live) < wanted and time.monotonic() < deadline:
                self.changed.wait(max(deadline - time.monotonic(), 0.0))
            live = set(self.service.live)
        if len(live) < wanted:
            log(f"starting with {len(live)} of {wanted} peers: waited {self.cfg.swarm.wait_for_peers_s:.0f}s")
        return live

    def exchange(self, round_: int, policy_version: int, local: list[RolloutGroup]) -> list[RolloutGroup]:
        """Publish ``local``, return up to J peer groups from the pool. It waits (bounded by the deadline)
        only while the pool lacks J informative groups that arrived this round and some live peer has not
        delivered yet: peers' batches are pulled in the background while this node samples and trains."""
        wanted = self.cfg.swarm.peer_groups_per_round
        t_start = time.time()
        deadline = time.monotonic() + self.cfg.swarm.share_deadline_s  # bounds publishing too
        self.announcer.set_progress(round_, policy_version)
        with self.lock:
            self._round = round_
        self.publish(round_, policy_version, local, deadline)
        with self.lock:
            # The peers to wait for are read once (the service's last roster read): one joining
            # mid-exchange has no batch for it yet. Bounded: each wait ends by the deadline.
            live = set(self.service.live)
            while True:
                # banned meanwhile, or gone from the roster (an offline card): stop waiting
                live = {peer for peer in live if peer in self.roster and not self.book.is_banned(peer)}
                if not live or live <= self._settled or time.monotonic() >= deadline:
                    break
                if self.pool.can_fill(wanted, since_round=round_):
                    break
                self.changed.wait(max(deadline - time.monotonic(), 0.0))
            delivered = len(live & self._settled)
            self._settled.clear()
            self._round = round_ + 1  # batches arriving from now on are fresh for our next round
            chosen = self.pool.select(wanted)
            self.counters.groups_trained += len(chosen)
        self._trace(
            "exchange", round=round_, started=t_start, ended=time.time(), live=len(live), delivered=delivered,
        )  # fmt: skip
        records.append_peer_groups(self.run_dir, round_, chosen, self.write_failures)
        self.write_status(round_, policy_version)
        return chosen

    # -- status ----------------------------------------------------------------------------------

    def status(self, round_: int, policy_version: int) -> dict:
        with self.lock:
            return records.status(self, round_, policy_version)

    def round_counts(self) -> records.PeerRoundCounts:
        """Peer traffic since the last call, for the round's metrics record."""
        with self.lock:
            return self._round_counts.take(self.counters, self.verifier.rejections)

    def write_status(self, round_: int, policy_version: int) -> None:
        """``<run_dir>/status.json`` (``records.write_status``), also handed to ``on_status``."""
        status = self.status(round_, policy_version)
        records.write_status(self.run_dir, status, self.write_failures)
        if self.on_status is not None:
            self.on_status(status)
