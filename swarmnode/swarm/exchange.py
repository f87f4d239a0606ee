"""SAPO exchange: publish this node's groups, gather verified peer groups, pick J for the round.

Per round the node (1) puts its local groups into one signed RolloutBatch, offers the payload over its
stream handler and announces it in the DHT; (2) polls the roster and the announcements, pulls every new
batch, and lets the Verifier regenerate questions and recompute rewards; (3) stops waiting once every
live peer has delivered since the last round or the deadline passes, whichever is first, and never
later; (4) chooses J external groups: zero-advantage groups dropped after local re-scoring, freshest
first, uniform among equally fresh ones. Each peer group is trained on at most once.

Audit trail: every peer group chosen for training is appended as one JSON line to
``<run_dir>/peer_groups.jsonl``: our ``round``, the ``producer`` peer id (the verified signer), its
``producer_round``, ``policy_version`` and ``model``, the ``task`` (``TaskRef.key()``), the number of
``completions`` and ``texts_sha256`` (sha256 of the JSON list of completion texts). Append-only: after a
resume from a checkpoint, rounds that run again can appear twice.

Timing trace (for benchmarks/swarm_latency.py): with ``SWARMNODE_SHARE_TRACE=1`` in the environment the
node appends one JSON line per event to ``<run_dir>/share.jsonl``, all times wall-clock ``time.time()``:
``publish`` (own batch: publish start, announcement timestamp, DHT store done), ``batch`` (one per peer
batch pulled: the announcement's signed timestamp, when the DHT get that first showed it started and
returned, fetch start and end, verification end, groups accepted or the fetch failure reason) and
``exchange`` (start, end, live peers, peers delivered). Off by default: nothing is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from swarmnode.common import BoundedSet, atomic_write, log
from swarmnode.config import NodeConfig
from swarmnode.errors import TransportError
from swarmnode.rollouts import RolloutGroup
from swarmnode.swarm import protocol
from swarmnode.swarm.peers import PeerBook
from swarmnode.swarm.transport import Transport
from swarmnode.swarm.verify import Verifier

POLL_INTERVAL_S = 0.5
MAX_POOL_GROUPS = 512
MAX_SEEN_GROUPS = 65536  # content digests remembered for dedup (~100 B each)
MAX_PULLED = 65536  # payload digests remembered as pulled (~100 B each)
MAX_IGNORED_PEERS = 4096  # peers whose roster card was refused, remembered so each is logged once
MAX_FETCH_ATTEMPTS = 2
MIN_DHT_WAIT_S = 0.5  # a DHT call at (or past) the share deadline still gets this long
RETRYABLE_FETCH_FAILURES = frozenset({"timeout", "closed", "unreachable"})
SHARE_TRACE_ENV = "SWARMNODE_SHARE_TRACE"
SHARE_TRACE_FILE = "share.jsonl"
PEER_GROUPS_FILE = "peer_groups.jsonl"


def texts_digest(group: RolloutGroup) -> str:
    """sha256 of the JSON list of the group's completion texts."""
    texts = json.dumps([c.text for c in group.completions], ensure_ascii=False)
    return hashlib.sha256(texts.encode("utf-8", "surrogatepass")).hexdigest()


def group_digest(group: RolloutGroup) -> str:
    """Identity of a group's content: its task and its completion texts, whoever sent it."""
    return hashlib.sha256(f"{group.ref.key()}\n{texts_digest(group)}".encode()).hexdigest()


@dataclass
class PooledGroup:
    group: RolloutGroup
    arrived_round: int  # our round when it arrived: the freshness tier


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


@dataclass
class SwarmCounters:
    batches_published: int = 0
    groups_published: int = 0
    batches_received: int = 0
    groups_accepted: int = 0
    groups_trained: int = 0
    duplicate_groups: int = 0
    fetch_failures: Counter = field(default_factory=Counter)
    arrival: ArrivalHistogram = field(default_factory=lambda: ArrivalHistogram())


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
        self.book = PeerBook()
        self.verifier = Verifier(bank, self.swarm_id, self.book, max_age_s=self._round_ttl_s)
        self.counters = SwarmCounters()
        self.addrs: list[str] = []
        self.roster: dict[str, protocol.RosterCard] = {}
        self._ignored_peers: BoundedSet[str] = BoundedSet(MAX_IGNORED_PEERS)
        self._pulled: BoundedSet[bytes] = BoundedSet(
            MAX_PULLED
        )  # payload digests already fetched (accepted or not)
        self._deferred: dict[
            str, protocol.BatchAnnouncement
        ] = {}  # verified and new, to pull at the next poll
        self._fetch_attempts: Counter[bytes] = Counter()
        self._seen_groups: BoundedSet[str] = BoundedSet(MAX_SEEN_GROUPS)  # group_digest()s
        self._pool: list[PooledGroup] = []
        # peers not to wait for any more this exchange: their batch arrived (accepted or rejected) or
        # cannot arrive (the pull failed for good, e.g. the peer left right after publishing)
        self._settled: set[str] = set()
        self._last_seq = 0
        self._rng = random.Random(identity.peer_id)
        self._trace_path = run_dir / SHARE_TRACE_FILE if os.environ.get(SHARE_TRACE_ENV) == "1" else None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self, round_: int = 0, policy_version: int = 0) -> list[str]:
        """Start the transport and put this node's roster card in the DHT."""
        self.addrs = self.transport.start()
        self.transport.set_peer_filter(lambda peer: not self.book.is_banned(peer))
        self.publish_roster(round_, policy_version)
        return self.addrs

    def shutdown(self) -> None:
        self.transport.shutdown()

    def _next_seq(self) -> int:
        """Strictly increasing across restarts too (wall-clock milliseconds)."""
        self._last_seq = max(self._last_seq + 1, int(time.time() * 1000))
        return self._last_seq

    def _trace(self, event: str, **fields) -> None:
        """One line of the opt-in timing trace (see the module docstring); never raises."""
        if self._trace_path is None:
            return
        try:
            with self._trace_path.open("a") as f:
                f.write(json.dumps({"event": event, **fields}) + "\n")
        except OSError:
            pass

    @property
    def _round_ttl_s(self) -> float:
        return max(4 * self.cfg.swarm.share_deadline_s, 60.0)

    # -- publishing ------------------------------------------------------------------------------

    @staticmethod
    def _dht_wait(deadline: float | None) -> float | None:
        """How long a DHT call may take: what is left until ``deadline`` (monotonic), or None (the
        transport's own timeout) without one. A peer that died or a congested DHT can make each call wait
        its full timeout; within an exchange they share the share deadline instead of adding to it."""
        return None if deadline is None else max(deadline - time.monotonic(), MIN_DHT_WAIT_S)

    def publish_roster(self, round_: int, policy_version: int, deadline: float | None = None) -> None:
        card = protocol.RosterCard(
            peer_id=self.identity.peer_id,
            swarm_id=self.swarm_id,
            model_name=self.policy.name,
            tokenizer_fingerprint=self.policy.tokenizer_fingerprint,
            policy_version=policy_version,
            round=round_,
            addrs=tuple(self.addrs[: protocol.MAX_ADDRS]),
            timestamp=time.time(),
            seq=self._next_seq(),
        )
        record = protocol.encode_message(self.identity, self.swarm_id, card)
        self.transport.put_record(
            protocol.roster_key(self.swarm_id), self.identity.peer_id, record, self._round_ttl_s,
            timeout_s=self._dht_wait(deadline),
        )  # fmt: skip

    def publish(
        self, round_: int, policy_version: int, groups: list[RolloutGroup], deadline: float | None = None
    ) -> None:
        groups = groups[: protocol.MAX_GROUPS_PER_BATCH]
        if not groups:
            return
        t_start = time.time()
        batch = protocol.make_rollout_batch(
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
        data = protocol.encode_message(self.identity, self.swarm_id, batch)
        announcement = protocol.announcement_for(batch, data, timestamp=time.time(), seq=self._next_seq())
        self.transport.offer(announcement.payload_sha256, data)
        record = protocol.encode_message(self.identity, self.swarm_id, announcement)
        stored = self.transport.put_record(
            protocol.announce_key(self.swarm_id), self.identity.peer_id, record, self._round_ttl_s,
            timeout_s=self._dht_wait(deadline),
        )  # fmt: skip
        self._trace(
            "publish", round=round_, started=t_start, announced_ts=announcement.timestamp,
            stored=time.time(), ok=stored, groups=len(groups), bytes=len(data),
        )  # fmt: skip
        self.counters.batches_published += 1
        self.counters.groups_published += len(groups)

    # -- collecting ------------------------------------------------------------------------------

    def _live_peers(self, deadline: float | None = None) -> set[str]:
        """Compatible peers in the roster (foreign or incompatible ones are ignored with one line)."""
        live = set()
        records = self.transport.get_records(protocol.roster_key(self.swarm_id), self._dht_wait(deadline))
        for peer, record in records.items():
            if peer == self.identity.peer_id:
                continue
            try:
                card, _ = protocol.decode_message(
                    record, swarm_id=self.swarm_id, expected_type=protocol.ROSTER_CARD, expected_peer_id=peer
                )
            except protocol.ProtocolError as exc:
                if peer not in self._ignored_peers:
                    self._ignored_peers.add(peer)
                    log(f"ignoring peer {peer[:16]}...: roster card rejected ({exc.reason})")
                continue
            if card.protocol_version != protocol.PROTOCOL_VERSION:
                if peer not in self._ignored_peers:
                    self._ignored_peers.add(peer)
                    log(f"ignoring peer {peer[:16]}...: speaks protocol v{card.protocol_version}")
                continue
            self.roster[peer] = card
            # A crashed peer's card lingers until it expires; only recently refreshed ones are waited for.
            recent = time.time() - card.timestamp < self._round_ttl_s / 2
            if recent and not self.book.is_banned(peer):
                live.add(peer)
        now = time.time()  # a card past its DHT record's lifetime is forgotten: churn must not pile up
        for peer in [p for p, card in self.roster.items() if now - card.timestamp > self._round_ttl_s]:
            del self.roster[peer]
        return live

    def wait_for_peers(self) -> set[str]:
        """Block until ``swarm.min_peers`` live peers are in the roster, or ``wait_for_peers_s`` passes."""
        wanted = self.cfg.swarm.min_peers
        deadline = time.monotonic() + self.cfg.swarm.wait_for_peers_s
        live = self._live_peers()
        if len(live) < wanted:
            log(f"waiting for {wanted} peer(s) to join (up to {self.cfg.swarm.wait_for_peers_s:.0f}s)")
        while len(live) < wanted and time.monotonic() < deadline:
            time.sleep(POLL_INTERVAL_S)
            live = self._live_peers()
        if len(live) < wanted:
            log(f"starting with {len(live)} of {wanted} peers: waited {self.cfg.swarm.wait_for_peers_s:.0f}s")
        return live

    def poll(self, round_: int, deadline: float) -> None:
        """Pull and verify every new announced batch into the pool; no fetch outlives ``deadline``."""
        t_get = time.time()
        records = self.transport.get_records(protocol.announce_key(self.swarm_id), self._dht_wait(deadline))
        t_seen = time.time()
        for peer, record in records.items():
            if peer == self.identity.peer_id:
                continue
            # check_announcement records a new seq as seen and returns None for it afterwards, so one that
            # arrives when the deadline has passed waits in _deferred for the next poll instead of being lost
            announcement = self.verifier.check_announcement(record, peer) or self._deferred.get(peer)
            self._deferred.pop(peer, None)
            if announcement is None:
                continue
            if announcement.payload_sha256 in self._pulled:  # old data announced anew: never pulled twice
                self.verifier.count_repeat(announcement, peer)
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._deferred[peer] = announcement
                return
            self._pulled.add(announcement.payload_sha256)
            trace = {
                "peer": peer, "round": announcement.round, "our_round": round_,
                "announced_ts": announcement.timestamp, "get_started": t_get, "seen": t_seen,
                "fetch_started": time.time(),
            }  # fmt: skip
            try:
                data = self.transport.fetch(
                    peer,
                    announcement.payload_sha256,
                    max_bytes=min(announcement.payload_len, protocol.MAX_FRAME_BYTES),
                    timeout_s=remaining,
                )
            except TransportError as exc:
                self.counters.fetch_failures[exc.reason] += 1
                self._trace("batch", **trace, fetched=time.time(), error=exc.reason)
                self._after_failed_fetch(peer, announcement, exc.reason)
                continue
            trace["fetched"] = time.time()
            self._fetch_attempts.pop(announcement.payload_sha256, None)
            self.counters.batches_received += 1
            groups = self._unseen(self.verifier.check_batch(announcement, data, peer))
            self._trace("batch", **trace, verified=time.time(), groups=len(groups), bytes=len(data))
            self._settled.add(peer)
            if groups:
                self.counters.arrival.observe(time.time() - announcement.timestamp)
                self.counters.groups_accepted += len(groups)
                self._pool.extend(PooledGroup(g, round_) for g in groups)
        del self._pool[:-MAX_POOL_GROUPS]

    def _after_failed_fetch(self, peer: str, announcement: protocol.BatchAnnouncement, reason: str) -> None:
        """Transient failures are retried at the next poll (bounded); an oversized frame is the
        authenticated sender's fault and costs it a strike."""
        digest = announcement.payload_sha256
        if reason == "oversize":
            self.book.strike(peer, "oversize")
        elif reason in RETRYABLE_FETCH_FAILURES and self._fetch_attempts[digest] < MAX_FETCH_ATTEMPTS - 1:
            self._fetch_attempts[digest] += 1
            self._pulled.discard(digest)
            self._deferred[peer] = announcement
            return
        self._fetch_attempts.pop(digest, None)
        self._settled.add(peer)

    def _unseen(self, groups: list[RolloutGroup]) -> list[RolloutGroup]:
        """Drop groups whose task and completion texts already arrived (from anyone): the same
        completions re-signed in a new batch are never trained on twice."""
        fresh = []
        for group in groups:
            digest = group_digest(group)
            if digest in self._seen_groups:
                self.counters.duplicate_groups += 1
                continue
            self._seen_groups.add(digest)
            fresh.append(group)
        return fresh

    def exchange(self, round_: int, policy_version: int, local: list[RolloutGroup]) -> list[RolloutGroup]:
        """Publish ``local``, wait (bounded by the deadline) for peers, return up to J peer groups."""
        t_start = time.time()
        deadline = time.monotonic() + self.cfg.swarm.share_deadline_s  # bounds publishing too
        self.publish_roster(round_, policy_version, deadline)
        self.publish(round_, policy_version, local, deadline)
        # The peers to wait for are read once: one joining mid-exchange has no batch for it yet, and the
        # roster is a whole-key DHT get that would otherwise double every poll's cost.
        live = self._live_peers(deadline)
        while True:
            self.poll(round_, deadline)
            live = {peer for peer in live if not self.book.is_banned(peer)}  # banned meanwhile: stop waiting
            if not live or live <= self._settled or time.monotonic() >= deadline:
                break
            time.sleep(min(POLL_INTERVAL_S, max(deadline - time.monotonic(), 0)))
        self._trace(
            "exchange", round=round_, started=t_start, ended=time.time(), live=len(live),
            delivered=len(live & self._settled),
        )  # fmt: skip
        self._settled.clear()
        chosen = self.select(self.cfg.swarm.external_per_round)
        self.counters.groups_trained += len(chosen)
        self.record_trained(round_, chosen)
        self.write_status(round_, policy_version)
        return chosen

    def record_trained(self, round_: int, groups: list[RolloutGroup]) -> None:
        """Append one line per peer group chosen for training to ``<run_dir>/peer_groups.jsonl`` (audit)."""
        if not groups:
            return
        with (self.run_dir / PEER_GROUPS_FILE).open("a") as f:
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

    def select(self, count: int) -> list[RolloutGroup]:
        """SAPO choice: informative groups only, freshest arrival first, uniform within a tier."""
        candidates = [p for p in self._pool if p.group.informative]
        self._rng.shuffle(candidates)
        candidates.sort(key=lambda p: -p.arrived_round)  # stable: shuffled order kept within a tier
        chosen = candidates[:count]
        chosen_ids = {id(p) for p in chosen}
        self._pool = [p for p in self._pool if id(p) not in chosen_ids and p.group.informative]
        return [p.group for p in chosen]

    # -- status ----------------------------------------------------------------------------------

    def status(self, round_: int, policy_version: int) -> dict:
        now = time.time()
        return {
            "peer_id": self.identity.peer_id,
            "swarm_id": self.swarm_id,
            "addrs": self.addrs,
            "round": round_,
            "policy_version": policy_version,
            "model": self.policy.name,
            "tokenizer": self.policy.tokenizer_fingerprint,
            "connected": self.transport.connected_peer_count(),
            "updated": now,
            "peers": {
                peer: {
                    "model": card.model_name,
                    "tokenizer": card.tokenizer_fingerprint,
                    "policy_version": card.policy_version,
                    "round": card.round,
                    "seen_s_ago": round(now - card.timestamp, 1),
                    "banned": self.book.is_banned(peer),
                }
                for peer, card in sorted(self.roster.items())
            },
            "rollouts": {
                "batches_published": self.counters.batches_published,
                "groups_published": self.counters.groups_published,
                "batches_received": self.counters.batches_received,
                "groups_accepted": self.counters.groups_accepted,
                "groups_trained": self.counters.groups_trained,
                "duplicate_groups": self.counters.duplicate_groups,
                "groups_pooled": len(self._pool),
            },
            "arrival_s": {
                "buckets": dict(zip(map(str, ARRIVAL_BUCKETS_S), self.counters.arrival.counts, strict=True)),
                "sum": self.counters.arrival.total,
                "count": self.counters.arrival.n,
            },
            "rejected": dict(sorted(self.verifier.rejections.items())),
            "fetch_failures": dict(self.counters.fetch_failures),
            "bans": [
                {"peer": peer, "remaining_s": round(remaining, 1), "count": count, "reason": reason}
                for peer, remaining, count, reason in self.book.bans()
            ],
        }

    def write_status(self, round_: int, policy_version: int) -> None:
        """``<run_dir>/status.json``, replaced atomically, read by ``swarmnode status``."""
        status = self.status(round_, policy_version)
        path = self.run_dir / "status.json"
        atomic_write(path, json.dumps(status, indent=1))
        if self.on_status is not None:
            self.on_status(status)
