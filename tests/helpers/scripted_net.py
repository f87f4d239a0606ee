"""A scripted network under the data plane's stages: DHT records in a dict and ``fetch`` that serves,
stalls or fails per holder, for unit tests that count pulls in flight exactly or make a peer silent for a
precise time without a libp2p daemon (the real one is in tests/integration). ``Author`` is a peer on it
with a roster card that publishes real signed batches of real scored groups."""

from __future__ import annotations

import os
import secrets
import threading
import time
from dataclasses import dataclass

from swarmnode.config import SamplingConfig
from swarmnode.errors import PeerError
from swarmnode.identity import Identity
from swarmnode.swarm.exchange.arrivals import Arrivals
from swarmnode.swarm.exchange.compat import roster_extra
from swarmnode.swarm.exchange.peers import PeerBook
from swarmnode.swarm.exchange.records import ShareTrace
from swarmnode.swarm.exchange.roster import Roster
from swarmnode.swarm.exchange.standing import ScoringBudget
from swarmnode.swarm.exchange.verify import ReceiveLimits, Verifier
from swarmnode.swarm.wire import codec, convert, dht_rules, protocol, work
from tests.helpers.verify_world import Peer, flip, signature_offset

TTL_S = 60.0  # the records' lifetime, and the age an announcement may have


class ScriptedNet:
    """DHT records in a dict; ``fetch`` serves, stalls or fails per holder (see the module docstring)."""

    def __init__(self):
        self.store: dict[str, dict[str, bytes]] = {}  # the DHT: key -> subkey -> value
        self.served: dict[bytes, bytes] = {}  # what the authors serve, by digest
        # holder -> "serve" (default) / "silent" / "unreachable" / "tamper" (serves the bytes, one flipped)
        self.behaviour: dict[str, str] = {}
        self.serve_delay_s = 0.0
        self.read_delay_s = 0.0  # every DHT read takes this long (a loaded host's DHT)
        self.calls: list[tuple[str, float, float]] = []  # holder, start (monotonic), timeout_s
        self.fetched: list[bytes] = []  # the digest each call asked for, in call order
        self.held: list[bytes] = []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        self.notices_sent = 0
        self.last_read_ok = self.last_write_ok = 0.0
        self.handlers: dict = {}
        self.payloads = self.records = self  # offer(); put(), get_many() on the store
        self.client_mode = False

    def serve(self, name, handler):
        self.handlers[name] = handler

    def get_many(self, keys, timeout_s=None):
        time.sleep(self.read_delay_s)
        return {k: dict(self.store[k]) for k in keys if k in self.store}

    def put(self, key, subkey, value, ttl_s, timeout_s=None):
        self.store.setdefault(key, {})[subkey] = value
        return True

    def count_notices_sent(self, n):
        with self.lock:
            self.notices_sent += n

    def offer(self, digest, data, *, held=False):
        if held:
            self.held.append(digest)

    def submit(self, job):
        raise PeerError("closed", "no notices over the scripted network")

    def fetch(self, peer_id, digest, *, max_bytes, timeout_s):
        with self.lock:
            self.calls.append((peer_id, time.monotonic(), timeout_s))
            self.fetched.append(digest)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            behaviour = self.behaviour.get(peer_id, "serve")
            if behaviour == "silent":
                time.sleep(timeout_s)
                raise PeerError("timeout", "silent")
            if behaviour == "unreachable":
                raise PeerError("unreachable", "gone")
            time.sleep(self.serve_delay_s)
            if digest not in self.served:
                raise PeerError("not_found", "not here")
            data = self.served[digest]
            return data[:-1] + bytes([data[-1] ^ 1]) if behaviour == "tamper" else data
        finally:
            with self.lock:
                self.in_flight -= 1

    def connected_peer_count(self):
        return 0

    def dht_alive(self):
        return True


class Author:
    """A peer with a roster card in the scripted DHT that publishes real signed batches."""

    def __init__(
        self,
        net: ScriptedNet,
        swarm_id: str,
        bank,
        card_age_s: float = 0.0,
        work_bits: int = 0,
        own_questions: bool = False,
    ):
        self.identity = Identity.generate()
        self.peer_id = self.identity.peer_id
        self.net, self.swarm_id, self.sender, self.seq = net, swarm_id, Peer(self.identity, bank), 0
        if own_questions:  # a random first round: no two authors' groups share content (trained on once)
            self.sender.round = secrets.randbelow(1_000_000)
        self.card_record = signed_card(
            self.identity, swarm_id, bank.fingerprint, self.next_seq(), card_age_s, work_bits=work_bits
        )
        net.put(dht_rules.roster_key(swarm_id, self.peer_id), self.peer_id, self.card_record, 60)

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def publish(
        self, *, announce: bool = True, forged: bool = False, ahead_s: float = 0.0
    ) -> tuple[bytes, bytes]:
        """Offer a batch on the scripted network; with ``announce`` store its record in the DHT too. A
        ``forged`` batch's signature does not verify (announced with its own sha256: it is pulled, and its
        verification bans the author). ``ahead_s``: the batch and its announcement are signed that far in
        the future."""
        batch = convert.make_rollout_batch(
            self.sender.groups(), peer_id=self.peer_id, swarm_id=self.swarm_id, round=self.sender.round,
            policy_version=0, model_name="tiny", tokenizer_fingerprint="", timestamp=time.time() + ahead_s,
            seq=self.next_seq(),
        )  # fmt: skip
        data = codec.encode_message(self.identity, self.swarm_id, batch)
        if forged:
            data = flip(data, signature_offset(data))
        ann = protocol.announcement_for(batch, data, timestamp=time.time() + ahead_s, seq=self.next_seq())
        record = codec.encode_message(self.identity, self.swarm_id, ann)
        self.net.served[ann.payload_sha256] = data
        if announce:
            self.net.put(dht_rules.announce_key(self.swarm_id, self.peer_id), self.peer_id, record, 60)
        return record, data


class Sybil:
    """A fresh identity with a valid roster card (not in the DHT: it hands it over with its notices) that
    announces batches it never serves: the scripted network keeps it silent."""

    def __init__(self, net: ScriptedNet, swarm_id: str, fingerprint: str):
        self.identity = Identity.generate()
        self.peer_id, self.swarm_id = self.identity.peer_id, swarm_id
        self.card_record = signed_card(self.identity, swarm_id, fingerprint, 1)
        net.behaviour[self.peer_id] = "silent"

    def announcement(self, seq: int = 2) -> bytes:
        """A signed announcement of a 1 KiB batch nobody holds."""
        ann = protocol.BatchAnnouncement(
            peer_id=self.peer_id, swarm_id=self.swarm_id, round=1, policy_version=0,
            payload_sha256=os.urandom(32), payload_len=1024, n_groups=2, timestamp=time.time(), seq=seq,
        )  # fmt: skip
        return codec.encode_message(self.identity, self.swarm_id, ann)


def signed_card(
    identity: Identity, swarm_id: str, fingerprint: str, seq: int, age_s: float = 0.0, work_bits: int = 0
) -> bytes:
    """A roster card record of ``identity`` for a peer of task mix ``fingerprint``, with ``work_bits`` of
    identity work."""
    card = protocol.RosterCard(
        peer_id=identity.peer_id, swarm_id=swarm_id, model_name="tiny", tokenizer_fingerprint="",
        policy_version=0, round=0, addrs=(), timestamp=time.time() - age_s, seq=seq,
        extra=roster_extra(fingerprint),
        work_nonce=work.mint(identity.public_key, work_bits) if work_bits else b"",
    )  # fmt: skip
    return codec.encode_message(identity, swarm_id, card)


@dataclass
class DataPlaneParts:
    """What the data plane's stages are handed: a scripted network, standing, the arrivals, the share
    trace, a real verifier and roster (the node's own task bank, any peer id of its own)."""

    net: ScriptedNet
    book: PeerBook
    arrivals: Arrivals
    trace: ShareTrace
    verifier: Verifier
    roster: Roster
    swarm_id: str


def data_plane_parts(run_dir, bank, swarm_id: str = "scripted") -> DataPlaneParts:
    net, book = ScriptedNet(), PeerBook()
    arrivals = Arrivals(ranking=book)
    verifier = Verifier(
        bank, swarm_id, book, max_age_s=TTL_S,
        limits=ReceiveLimits.for_node(SamplingConfig(), tokenizer_fingerprint="", vocab_size=512),
        scoring=ScoringBudget(book.has_standing),
    )  # fmt: skip
    roster = Roster(
        own_peer_id=Identity.generate().peer_id, swarm_id=swarm_id, fingerprint=bank.fingerprint, book=book,
        ttl_s=TTL_S, on_read=arrivals.wake,
    )  # fmt: skip
    return DataPlaneParts(net, book, arrivals, ShareTrace(run_dir), verifier, roster, swarm_id)


def received(world) -> int:
    """Batches the world's data plane has pulled and verified so far (accepted or not)."""
    return world.arrivals.snapshot().counters.batches_received
