"""The view cannot be eclipsed by probation churn (exchange/roster.py): a probation card never evicts a
member with standing heard from here within a card lifetime, and a member with standing returning to a
full view displaces the least useful member by local measures (score, then when heard from here), never by
a peer-signed time. The old roster evicted the member whose signed progress was oldest: future-dated churn
cards took a view of 128 honest members to 64 with one churn and towards 0 with more."""

from __future__ import annotations

import time

from swarmnode.swarm.exchange.roster import VIEW_SIZE

FUTURE_S = 25.0


def _future_dated(world, n: int, *, standing: bool = False) -> list:
    """``n`` authors whose cards are signed FUTURE_S ahead (a negative age)."""
    return world.authors(n, standing=standing, card_age_s=-FUTURE_S)


def test_three_probation_churns_leave_honest_members_their_seats_and_admit_an_honest_newcomer(world):
    roster = world.roster
    honest = world.authors(VIEW_SIZE)
    for author in honest:  # trained on a few times here
        world.book.credit_trained(author.peer_id, 2)
        roster.admit(author.peer_id, author.card_record, time.time())
    assert len(roster.cards) == VIEW_SIZE
    for n, standing in ((64, False), (128, True), (128, False)):  # the second churn bought standing cheaply
        for author in _future_dated(world, n, standing=standing):
            roster.admit(author.peer_id, author.card_record, time.time())
    held = sum(author.peer_id in roster.cards for author in honest)
    assert held >= 0.75 * VIEW_SIZE, held  # the old roster: 64 after the first churn
    (newcomer,) = world.authors(1)
    world.book.credit_trained(newcomer.peer_id, 3)  # trained on more than the least useful member
    roster.admit(newcomer.peer_id, newcomer.card_record, time.time())
    assert newcomer.peer_id in roster.cards
