"""Allocation by standing (swarm/exchange/standing.py): identities are cheap, so a flood of fresh ones
shares one bounded probation share of the roster, the pending pulls and the pull workers, and never
pushes out or starves the peers that delivered. Each test sends the worst case at the scale the outside
attacker used (512 identities); each failed on the code before this share existed (the roster refused
the newcomer as ``roster_full``; 0 of 7 honest batches were pulled while the Sybils' were tried first;
the tampering holder's bytes ended the batch).

The stages are the real ones on the scripted network (tests/unit/swarm/conftest.py): it is what makes 512
silent holders cost seconds, not minutes, and lets a test count every pull.
"""

from __future__ import annotations

import time

from benchmarks.harness.waiting import wait_until
from swarmnode.swarm.exchange import puller
from swarmnode.swarm.exchange.inbox import Candidate
from swarmnode.swarm.exchange.standing import PENDING_PER_AUTHOR, PROBATION_CARDS, PROBATION_PENDING
from tests.helpers.scripted_net import Sybil, received

SYBILS = 512


def sybils(world, bank, n: int = SYBILS) -> list[Sybil]:
    return [Sybil(world.net, world.swarm_id, bank.fingerprint) for _ in range(n)]


def notify(
    world, record: bytes, author: str, holder: str, card: bytes = b"", timeout_s: float = 10.0
) -> None:
    """Hand a notice to the inbox as the notice stream would, waiting while its queue is full."""
    deadline = time.monotonic() + timeout_s
    while not world.service.inbox.add_notice(record, author, holder, card):
        assert time.monotonic() < deadline, "the inbox never took the notice"
        time.sleep(0.01)


def test_a_flood_of_sybil_cards_leaves_room_for_a_newcomer_and_never_displaces_standing(world, bank):
    honest = world.authors(3, standing=True)
    roster, now = world.roster, time.time()
    for author in honest:
        roster.admit(author.peer_id, author.card_record, now)
    for sybil in sybils(world, bank):
        roster.admit(sybil.peer_id, sybil.card_record, now)
    (newcomer,) = world.authors(1)
    roster.admit(newcomer.peer_id, newcomer.card_record, now)
    assert newcomer.peer_id in roster.cards  # the newest probation card is in ...
    assert all(author.peer_id in roster.cards for author in honest)  # ... and no peer with standing is out
    on_probation = [peer for peer in roster.cards if not world.book.has_standing(peer)]
    assert len(on_probation) == PROBATION_CARDS
    assert len(roster.cards) == len(honest) + PROBATION_CARDS
    assert "roster_full" not in roster.refused


def test_512_silent_sybil_authors_starve_no_honest_batch(world, bank):
    """The outside attacker's pull starvation: silent Sybil authors announced ahead of 7 honest batches."""
    honest = world.authors(7, standing=True)
    flood = sybils(world, bank)
    world.start()
    for sybil in flood:  # every notice carries its author's card and a batch it never serves
        notify(world, sybil.announcement(), sybil.peer_id, sybil.peer_id, sybil.card_record)
    started = time.monotonic()
    for author in honest:
        record, _ = author.publish(announce=False)
        notify(world, record, author.peer_id, author.peer_id)
    assert wait_until(lambda: received(world) == len(honest), 5), world.arrivals.snapshot().counters
    print(f"\n7 honest batches pulled {time.monotonic() - started:.2f} s after a flood of {SYBILS} Sybils")
    pulls = world.service.puller
    assert world.arrivals.snapshot().counters.groups_accepted > 0
    on_probation = [key for key in pulls.pending if not world.book.has_standing(key[0])]
    assert len(on_probation) <= PROBATION_PENDING
    assert pulls.dropped["probation_full"] > 0  # the newest were dropped, counted
    assert world.net.max_in_flight <= puller.MAX_PARALLEL_PULLS + puller.PROBATION_PULLS


def test_a_silent_sybil_has_one_first_chance_then_comes_after_every_newcomer(world, bank, monkeypatch):
    """Its pull held a probation worker for the short timeout; from then on its batches come after those
    of identities still on their first chance, and make room for them when the probation share is full."""
    monkeypatch.setattr(puller, "PROBATION_PULLS", 1)  # one worker: the order is what the test sees
    sybil, *flood = sybils(world, bank, PROBATION_PENDING + 2)
    world.start()
    notify(world, sybil.announcement(), sybil.peer_id, sybil.peer_id, sybil.card_record)
    assert wait_until(lambda: world.roster.failed_probation(sybil.peer_id), 5)
    assert world.net.calls[0][0] == sybil.peer_id  # one try, with the short timeout
    assert world.net.calls[0][2] == puller.pull_timeout_s(1024, standing=False)
    world.service.stop()  # the queue is filled while nothing is pulled
    pulls = world.service.puller
    for seq, _ in enumerate(range(PROBATION_PENDING), start=3):  # its later batches fill the share ...
        now = time.time()
        pulls.consider(Candidate(sybil.announcement(seq), sybil.peer_id, sybil.peer_id, "notice", now, now))
    assert sum(1 for key in pulls.pending if key[0] == sybil.peer_id) == PENDING_PER_AUTHOR
    for other in flood:  # ... and newcomers on their first chance still get in, up to the share
        world.roster.admit(other.peer_id, other.card_record, time.time())
        now = time.time()
        pulls.consider(Candidate(other.announcement(), other.peer_id, other.peer_id, "notice", now, now))
    assert not any(key[0] == sybil.peer_id for key in pulls.pending)  # made room for them
    assert pulls.dropped["failed_probation"] == PENDING_PER_AUTHOR
    assert len(pulls.pending) == PROBATION_PENDING and pulls.dropped["probation_full"] == 1  # then full
    order = [key[0] for key, _, _ in pulls._pull_order()]
    assert sybil.peer_id not in order and len(order) == PROBATION_PENDING


def test_pending_batches_are_capped_per_author_and_the_newest_is_dropped(world):
    (author,) = world.authors(1, standing=True)
    records = [author.publish(announce=False)[0] for _ in range(PENDING_PER_AUTHOR + 2)]
    pulls = world.service.puller  # not started: nothing is pulled meanwhile
    for record in records:
        now = time.time()
        pulls.consider(Candidate(record, author.peer_id, author.peer_id, "notice", now, now))
    kept = [pending.record for pending in pulls.pending.values()]
    assert kept == records[:PENDING_PER_AUTHOR]  # the oldest stay
    assert pulls.dropped == {"author_full": 2}


def test_a_tampering_holder_is_charged_and_the_next_holder_serves_the_batch(world):
    """The outside attacker's tampering holder: charged ``hash_mismatch``, and the honest second holder
    (its notice right after) was never asked; the batch never arrived."""
    author, tamperer, holder = world.authors(3, standing=True)
    world.net.behaviour[author.peer_id] = "unreachable"
    world.net.behaviour[tamperer.peer_id] = "tamper"
    record, _ = author.publish(announce=False)
    world.start()
    assert wait_until(lambda: author.peer_id in world.roster.live, 5)
    notify(world, record, author.peer_id, tamperer.peer_id)
    notify(world, record, author.peer_id, holder.peer_id)
    assert wait_until(lambda: received(world) == 1, 10), world.verifier.rejections
    assert world.verifier.rejections == {"hash_mismatch": 1}
    assert world.book.snapshot()["peers"][tamperer.peer_id]["strikes"] == 1
    asked = [call[0] for call in world.net.calls]
    assert asked.index(tamperer.peer_id) < asked.index(holder.peer_id) and asked[-1] == holder.peer_id
    assert world.arrivals.snapshot().pulls_by_source == {"holder": 1}


def test_a_poll_reads_a_bounded_page_of_the_roster_and_covers_it_in_turn(world):
    from swarmnode.swarm.exchange.roster import VIEW_SIZE
    from swarmnode.swarm.exchange.service import MAX_POLL_KEYS

    world.authors(SYBILS, standing=True)  # the DHT's 512 cards, of peers with standing
    world.service.refresh_roster()
    members = world.roster.members()
    assert len(members) == VIEW_SIZE  # a full view (test_view.py)
    pages = [world.service._poll_page() for _ in range(VIEW_SIZE // MAX_POLL_KEYS)]
    assert all(len(page) == MAX_POLL_KEYS for page in pages)
    assert {peer for page in pages for peer in page} == set(members)
