"""#27: the roster is a bounded view of the swarm (exchange/roster.py ``VIEW_SIZE``), not the swarm.

Whatever arrives (the DHT's 512 cards, cards carried by notices, a flood of fresh identities), a node
holds at most VIEW_SIZE cards, at most PROBATION_CARDS of peers without standing, and at least
VIEW_SIZE - PROBATION_CARDS of peers with standing once it knows that many; a newcomer's card always
gets in. The old roster held every card up to the DHT's 512, so whom a node notified, polled and waited
for grew with the swarm up to there (the first test failed on it: 1,000 cards held 512)."""

from __future__ import annotations

import time

import pytest

from benchmarks.harness.waiting import wait_until
from swarmnode.swarm.exchange import service as service_module
from swarmnode.swarm.exchange.roster import VIEW_SIZE, Roster
from swarmnode.swarm.exchange.standing import PROBATION_CARDS

FLOOD = 1000  # identities sent at once: past the DHT's 512 cards, as notices can carry them


def _standing(world, roster) -> list[str]:
    return [peer for peer in roster.cards if world.book.has_standing(peer)]


@pytest.mark.parametrize("view_size", [VIEW_SIZE, 16])  # the default (PROBATION_CARDS = 64 of it), and 16
def test_the_view_holds_at_most_view_size_cards_whatever_arrives(world, bank, view_size):
    roster, now = _roster(world, view_size), time.time()
    for author in world.authors(FLOOD, standing=True) + world.authors(FLOOD):
        roster.admit(author.peer_id, author.card_record, now)
    assert len(roster.cards) == view_size
    assert len(roster.cards) - len(_standing(world, roster)) <= view_size // 2
    assert len(roster.members()) == view_size  # whom it notifies and polls
    # once it was full: peers with standing that out-score no member, and newcomers, since no member with
    # standing went quiet (probation never evicts one heard from within a card lifetime)
    assert roster.refused["roster_full"] == 2 * FLOOD - view_size


def _roster(world, view_size: int) -> Roster:
    """The world's roster, or one like it with another view size."""
    if view_size == VIEW_SIZE:
        return world.roster
    r = world.roster
    return Roster(
        own_peer_id=r.own_peer_id, swarm_id=r.swarm_id, fingerprint=r.fingerprint, book=r.book, ttl_s=r.ttl_s,
        view_size=view_size,
    )  # fmt: skip


def test_a_flood_of_newcomers_leaves_the_members_with_standing_their_share(world, bank):
    """A view full of members with standing, then FLOOD fresh identities: each newcomer gets in, the
    members with standing give way down to VIEW_SIZE - PROBATION_CARDS and no further, only those not
    heard from here within a card lifetime (by this node's clock, never a signed time)."""
    roster, now = world.roster, time.time()
    fresh = world.authors(VIEW_SIZE - PROBATION_CARDS, standing=True)
    stale = world.authors(PROBATION_CARDS, standing=True, card_age_s=30.0)
    roster.clock = lambda: time.monotonic() - roster.ttl_s - 1  # heard from a lifetime ago ...
    for author in stale:
        roster.admit(author.peer_id, author.card_record, now)
    roster.clock = time.monotonic  # ... the others now
    for author in fresh:
        roster.admit(author.peer_id, author.card_record, now)
    assert len(roster.cards) == VIEW_SIZE and not roster.refused
    newcomers = world.authors(FLOOD)
    for author in newcomers:
        roster.admit(author.peer_id, author.card_record, now)
        assert author.peer_id in roster.cards
    assert sorted(_standing(world, roster)) == sorted(a.peer_id for a in fresh)
    assert len(roster.cards) == VIEW_SIZE and not roster.refused


def _fill_dht_roster(world, n: int) -> None:
    for author in world.authors(n, standing=True):
        assert author.peer_id  # each Author stores its card in the scripted DHT


def test_a_full_view_reads_roster_pages_at_the_full_view_pace(world, monkeypatch):
    """Once the view is full, the DHT roster is where members come from, not how they stay: a page every
    FULL_VIEW_PAGE_GAP_S (here 1 s) instead of the lifetime's pace (here 0.2 s), so what the roster costs
    a node no longer grows with the swarm. Below a full view, pages keep the lifetime's pace."""
    monkeypatch.setattr(service_module, "FULL_VIEW_PAGE_GAP_S", 1.0)
    _fill_dht_roster(world, 2 * VIEW_SIZE)
    times: list[float] = []
    get_many = world.net.get_many

    def recorded(keys, timeout_s=None):
        if any("/roster/" in key for key in keys):
            times.append(time.monotonic())
        return get_many(keys, timeout_s)

    world.net.get_many = recorded
    world.service.start()
    assert wait_until(lambda: len(times) >= 8, 20), times
    assert len(world.roster.cards) == VIEW_SIZE
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert min(gaps[4:]) > 0.9  # after the first pass (4 pages back to back): the full view's pace
    assert world.service._page_gap_s() == 1.0
    for peer in list(world.roster.cards)[:1]:  # one member leaves: the view is short, the lifetime's pace
        world.roster._remove(peer)
    assert world.service._page_gap_s() < 1.0
