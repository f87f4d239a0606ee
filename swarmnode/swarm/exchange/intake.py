"""The data plane's last stage: a pulled batch verified, pooled and served on.

Verification (``Verifier.check_batch``, within its scoring budget) runs before the arrivals are touched,
so the round thread never waits on scoring. An accepted batch is offered on (``offer(held=True)``: any holder
serves a batch, the author's signature travels in the bytes), and a reachable node tells up to
``reachability.HOLDER_OFFER_FANOUT`` live peers behind NAT that it holds it (they may not reach its
author, but they reach us). Its fresh groups (not seen before, by content) go into the pool with this
node's current round as their freshness tier; its author is settled either way (``Arrivals.add``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from swarmnode.swarm.exchange.arrivals import Arrivals
from swarmnode.swarm.exchange.pending import Pulled
from swarmnode.swarm.exchange.records import ShareTrace
from swarmnode.swarm.exchange.roster import Roster
from swarmnode.swarm.exchange.verify import Verifier
from swarmnode.swarm.net import reachability
from swarmnode.swarm.net.notices import notify
from swarmnode.swarm.net.transport import Transport


class Intake:
    def __init__(
        self,
        *,
        verifier: Verifier,
        arrivals: Arrivals,
        trace: ShareTrace,
        roster: Roster,
        transport: Transport,
        behind_nat: Callable[[], frozenset[str]],
    ):
        self.verifier = verifier
        self.arrivals = arrivals
        self._trace = trace
        self.roster = roster
        self.transport = transport
        self._behind_nat = behind_nat  # peers whose dial-back check failed here

    def take(self, pulled: Pulled) -> None:
        pending, holder, data, trace = pulled.pending, pulled.holder, pulled.data, pulled.trace
        ann, author = pending.announcement, pending.author
        groups = self.verifier.check_batch(ann, data, holder)  # outside the lock: scoring takes time
        verified = time.time()
        if self.verifier.already_accepted(ann.payload_sha256):
            self.transport.payloads.offer(ann.payload_sha256, data, held=True)  # we hold it now: serve it on
            if not self.transport.client_mode:  # reachable: tell peers behind NAT they can pull it here
                self._offer_held(author, holder, pending.record)
        source = "holder" if holder != author else pending.via
        pooled, trace["our_round"] = self.arrivals.add(
            author, groups, source=source, delay_s=verified - ann.timestamp
        )
        self._trace("batch", **trace, verified=verified, groups=pooled, bytes=len(data))

    def _offer_held(self, author: str, served_by: str, record: bytes) -> None:
        live = self.roster.live_peers()
        peers = reachability.holder_offer_targets(self._behind_nat(), live, {author, served_by})
        if peers:
            notify(self.transport, peers, author, record)
