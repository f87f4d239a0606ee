"""A peer's batch through the data plane's stages by hand: notice -> inbox -> puller -> intake -> pool.

Each stage is built with what it uses and driven one call at a time, with no ``Swarm`` façade, no service
thread and no libp2p daemon (``ScriptedNet`` stands in for the transport: tests/helpers/scripted_net.py).
The verifier, roster, standing and pool are the real ones; the batch is a real signed one.
"""

from __future__ import annotations

import time

from swarmnode.swarm.exchange.inbox import Candidate, Inbox
from swarmnode.swarm.exchange.intake import Intake
from swarmnode.swarm.exchange.pending import Pulled
from swarmnode.swarm.exchange.puller import Puller
from swarmnode.swarm.net import dht
from swarmnode.swarm.wire import codec
from tests.helpers.scripted_net import Author, data_plane_parts

SWARM = "stages"


def test_a_notice_becomes_pooled_groups_stage_by_stage(tmp_path, bank):
    parts = data_plane_parts(tmp_path, bank, SWARM)
    net, book, arrivals, roster = parts.net, parts.book, parts.arrivals, parts.roster
    verifier = parts.verifier
    candidates: list[Candidate] = []
    pulled: list[Pulled] = []
    notice_outcomes: list[str] = []  # the notice receiver's counts: unknown_author when dropped
    inbox = Inbox(
        roster, candidates.append, notice_outcomes.append, read_roster_soon=lambda: None, wake=lambda: None
    )
    puller = Puller(
        verifier=verifier, book=book, roster=roster, arrivals=arrivals, trace=parts.trace, fetch=net.fetch,
        on_pulled=pulled.append, wake=lambda: None, pulls_per_round=8, client_mode=lambda: False,
    )  # fmt: skip
    intake = Intake(
        verifier=verifier, arrivals=arrivals, trace=parts.trace, roster=roster, transport=net,
        behind_nat=frozenset,
    )  # fmt: skip
    author = Author(net, SWARM, bank)
    record, _ = author.publish(announce=False)  # known only from its notice

    # 1. inbox: the author has no card here yet, so the notice waits for a roster read
    assert inbox.add_notice(record, author.peer_id, author.peer_id)
    inbox.drain()
    assert candidates == []
    roster.take_read(dht.read_roster(net.records, SWARM, timeout_s=1.0))  # the author's card is read
    inbox.drain()
    assert [(c.author, c.holder, c.via) for c in candidates] == [(author.peer_id, author.peer_id, "notice")]
    assert notice_outcomes == []

    # 2. puller: the announcement is checked, the batch becomes pending and is pulled from its author
    puller.consider(candidates[0])
    digest = codec.decode_message(record, swarm_id=SWARM)[0].payload_sha256
    assert list(puller.pending) == [(author.peer_id, digest)]
    puller.start_pulls()
    deadline = time.monotonic() + 10
    while not puller.take_result() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [p.holder for p in pulled] == [author.peer_id] and not puller.pending
    assert [call[0] for call in net.calls] == [author.peer_id]

    # 3. intake: verified against the author's signature, re-scored, pooled, served on, author settled
    intake.take(pulled[0])
    now = arrivals.snapshot()
    assert now.counters.batches_received == 1 and now.counters.groups_accepted == now.pooled > 0
    assert now.settled == {author.peer_id} and net.held == [digest]

    # 4. pool: the round's J groups, all the author's
    chosen = arrivals.take(0, 2, {author.peer_id}).groups
    assert chosen and {g.provenance.producer for g in chosen} == {author.peer_id}

    # the same announcement again is never pulled twice
    puller.consider(candidates[0])
    assert not puller.pending
    puller.stop()
