"""This node's presence in the swarm: its roster card, re-declared on a timer of its own, and an OFFLINE
card on a clean stop (petals' announce lifecycle).

The card used to be re-put only inside each exchange, so a node in a long round went stale for its peers
(a card counts as live for half of the record lifetime). The announcer re-puts it every
``ttl_s / ANNOUNCES_PER_TTL`` seconds from a thread, whatever the round loop is doing; the round loop
only tells it the current round and policy version (``set_progress``: a locked assignment). ``stop`` puts
a card marked offline, waiting at most ``OFFLINE_PUT_WAIT_S``, so that peers stop waiting for this node at
once instead of at their deadlines.

The same thread notices the usual sign of a wrong swarm id: connections to peers, but no roster card of
this node's swarm for ``LONELY_AFTER_S``. It then asks a few connected peers which swarm they are in
(``swarm.net.hello``, whose handler it serves) and says so once: the peers' swarm id to pass, or what to
check.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from swarmnode.common import log
from swarmnode.identity import Identity
from swarmnode.swarm.net import dht, hello
from swarmnode.swarm.net.transport import Transport
from swarmnode.swarm.wire import codec, dht_rules, limits, protocol

logger = logging.getLogger(__name__)

ANNOUNCES_PER_TTL = 4  # re-declarations per record lifetime: a card stays live (< ttl/2 old) through 1 miss
# Every card is stored for the longest lifetime storing nodes allow (signed timestamp + this): for one
# subkey the DHT keeps the value that expires last, so no older card (an offline one, replayed) can then
# outlive a newer one. Readers judge liveness by the card's timestamp (``ttl_s``), not by its expiry.
RECORD_LIFETIME_S = dht_rules.MAX_RECORD_TTL_S
OFFLINE_PUT_WAIT_S = 3.0  # the most a clean shutdown waits for its offline card to be stored
WATCH_PERIOD_S = 5.0  # the thread wakes at least this often (to stop, and for the wrong-swarm check)
LONELY_AFTER_S = 30.0  # connected, but no card of our swarm this long: the swarm id is probably wrong
STOP_JOIN_S = 15.0  # a put in flight when stop() is called ends within the transport's record timeout


class Announcer:
    """Puts this node's roster card into the DHT at ``start``, every ``period_s`` (``ttl_s`` /
    ANNOUNCES_PER_TTL) after, and an offline card at ``stop``. ``roster_size`` (the peers of our swarm
    currently known) feeds the wrong-swarm check. Every card carries ``work_nonce``, the identity's proof
    of work (``swarm.wire.work``; b"" for none)."""

    def __init__(
        self,
        transport: Transport,
        identity: Identity,
        swarm_id: str,
        *,
        model_name: str,
        tokenizer_fingerprint: str,
        extra: Mapping[str, Any],
        ttl_s: float,
        roster_size: Callable[[], int],
        work_nonce: bytes = b"",
    ):
        self.transport = transport
        self.identity = identity
        self.swarm_id = swarm_id
        self.model_name = model_name
        self.tokenizer_fingerprint = tokenizer_fingerprint
        self.extra = dict(extra)
        self.work_nonce = work_nonce  # the identity's proof of work (swarm.wire.work), in every card
        self.ttl_s = ttl_s
        self.period_s = ttl_s / ANNOUNCES_PER_TTL
        self.roster_size = roster_size
        self.addrs: tuple[str, ...] = ()
        self.announced = 0  # online cards stored (a count to check the timer by)
        self.card_record = b""  # the latest online card signed: notices carry it (swarm.notices)
        self._progress = (0, 0)  # (round, policy version) the next card carries
        self._lock = threading.Lock()
        self._stamps = limits.Stamper()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lonely_since: float | None = None
        self._lonely_said = False
        self.hello = hello.HelloServer(swarm_id)  # answers peers asking which swarm this node is in
        transport.serve(hello.HELLO_STREAM, self.hello.handle)

    def set_progress(self, round_: int, policy_version: int) -> None:
        """The round and policy version the next card carries (cheap: called by the round loop)."""
        with self._lock:
            self._progress = (round_, policy_version)

    def card(self, *, offline: bool = False) -> protocol.RosterCard:
        with self._lock:
            round_, policy_version = self._progress
        seq, timestamp = self._stamps.stamp()
        return protocol.RosterCard(
            peer_id=self.identity.peer_id,
            swarm_id=self.swarm_id,
            model_name=self.model_name,
            tokenizer_fingerprint=self.tokenizer_fingerprint,
            policy_version=policy_version,
            round=round_,
            addrs=self.addrs[: limits.MAX_ADDRS],
            timestamp=timestamp,
            seq=seq,
            offline=offline,
            work_nonce=self.work_nonce,
            extra=self.extra,
        )

    def announce(self, *, offline: bool = False, timeout_s: float | None = None) -> bool:
        """Sign and store a card now (for RECORD_LIFETIME_S, online or offline); False if the DHT did not
        take it (the next period tries again)."""
        record = codec.encode_message(self.identity, self.swarm_id, self.card(offline=offline))
        if not offline:
            self.card_record = record
        stored = dht.put_card(
            self.transport.records, self.swarm_id, self.identity.peer_id, record, RECORD_LIFETIME_S, timeout_s
        )
        if stored and not offline:
            self.announced += 1
        return stored

    def start(self, addrs: list[str], round_: int, policy_version: int) -> None:
        """Announce once now (peers see this node at once), then keep announcing from a thread."""
        self.addrs = tuple(addrs)
        self.set_progress(round_, policy_version)
        self.announce()
        self._thread = threading.Thread(target=self._run, name="announcer", daemon=True)
        self._thread.start()

    def stop(self, *, offline: bool = True) -> None:
        """Stop the timer, then (a clean stop) put the offline card, waiting at most OFFLINE_PUT_WAIT_S."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(STOP_JOIN_S)
        self._thread = None
        if offline and self.announce(offline=True, timeout_s=OFFLINE_PUT_WAIT_S):
            logger.info("offline card stored: peers stop waiting for this node")

    def _run(self) -> None:
        next_at = time.monotonic() + self.period_s
        while not self._stop.wait(min(WATCH_PERIOD_S, max(next_at - time.monotonic(), 0.0))):
            now = time.monotonic()
            try:
                self._watch_swarm(now)
                if now >= next_at:
                    next_at = now + self.period_s
                    self.announce()
            except Exception:  # the network edge keeps going; the next period tries again
                logger.exception("announcer: this period failed")

    def _watch_swarm(self, now: float) -> None:
        """Say once when this node has had connections but no peer of its swarm for LONELY_AFTER_S."""
        if self._lonely_said:
            return
        connected = 0 if self.roster_size() > 0 else self.transport.connected_peer_count()  # cheap first
        if not connected:
            self._lonely_since = None
            return
        if self._lonely_since is None:
            self._lonely_since = now
        elif now - self._lonely_since >= LONELY_AFTER_S:
            self._lonely_said = True
            log(lonely_line(self.swarm_id, connected, self._peer_swarms()))

    def _peer_swarms(self) -> list[str]:
        """The other swarm ids that up to hello.PEERS_ASKED connected peers say they are in."""
        asked = sorted(self.transport.connected_peers())[: hello.PEERS_ASKED]
        futures = [self.transport.submit(lambda p2p, peer=peer: hello.ask(p2p, peer)) for peer in asked]
        answers = set()
        for future in futures:
            try:
                answers.add(future.result(hello.ASK_TIMEOUT_S + 1.0))
            except Exception:  # the transport stopped meanwhile: this peer cannot tell
                continue
        return sorted(swarm for swarm in answers if swarm and swarm != self.swarm_id)


def lonely_line(swarm_id: str, connected: int, peer_swarms: list[str]) -> str:
    """What a node in the wrong swarm is told: its peers' swarm id when they said it, else what to check."""
    if peer_swarms:
        theirs = ", ".join(repr(swarm) for swarm in peer_swarms)
        return (
            f"this node is in swarm {swarm_id!r}, but its connected peers are in {theirs}: to train with "
            f"them, restart it with --set swarm.swarm_id={peer_swarms[0]} (and their --config)"
        )
    return (
        f"connected to {connected} peer(s) for {LONELY_AFTER_S:.0f}s, but none of them announces itself in "
        f"swarm {swarm_id!r}: if you meant to join an existing swarm, pass the swarm id its nodes use "
        "(--set swarm.swarm_id=..., as in the join command the first node printed) and the same --config"
    )
