"""#27's bounds on a node's work a round, whatever the swarm's size: at most K = 2 J batches of authors
with standing pulled (and verified) a round, the freshest first, the rest dropped rather than deferred, and
a new batch's notice pushed to NOTICE_FANOUT peers, not to the whole roster.

The worst case is a swarm far larger than K whose every peer has standing and publishes at once. The data
plane is the real one on the scripted network (tests/helpers/scripted_net.py: no libp2p daemon in a unit
test), so pulls can be counted exactly.
"""

from __future__ import annotations

import time

from swarmnode.experiment.waiting import wait_until
from swarmnode.swarm.exchange import puller
from swarmnode.swarm.exchange.roster import NOTICE_FANOUT
from swarmnode.swarm.wire import codec
from tests.helpers.scripted_net import received
from tests.unit.swarm.conftest import WORLD_PEER_GROUPS

SWARM_OVER_BUDGET = 5  # the swarm in these tests is this many times the pull budget


def pulled_authors(world) -> list[str]:
    return [peer for peer, _, _ in world.net.calls]


def test_a_round_pulls_at_most_k_batches_of_authors_with_standing_and_drops_the_rest(world):
    budget = puller.pull_budget(WORLD_PEER_GROUPS)
    assert world.service.puller.pulls_per_round == budget == 2 * WORLD_PEER_GROUPS
    authors = world.authors(SWARM_OVER_BUDGET * budget, standing=True)
    for author in authors:
        author.publish()
    world.service.start()
    assert wait_until(lambda: world.state.pulls_done_round == 0, 20), world.state.counters
    time.sleep(3 * 0.2)  # three more polls (the world's interval) find every batch again
    assert len(world.net.calls) == received(world) == budget  # the old code pulled all of them
    assert world.service.puller.dropped["round_budget"] == (SWARM_OVER_BUDGET - 1) * budget
    assert not world.service.puller.pending

    # the next round has a budget of its own, for new batches; the dropped ones are never pulled
    with world.state.lock:
        world.state.round = 1
    fresh = set()
    for author in authors:
        record, _ = author.publish()
        fresh.add(codec.decode_message(record, swarm_id=world.swarm_id)[0].payload_sha256)
    assert wait_until(lambda: world.state.pulls_done_round == 1, 20), world.state.counters
    time.sleep(3 * 0.2)
    assert len(world.net.fetched) == 2 * budget
    assert set(world.net.fetched[budget:]) <= fresh  # only this round's batches


def test_within_the_budget_the_freshest_batches_are_pulled(world):
    world.service.puller.pulls_per_round = 2
    authors = world.authors(6, standing=True)
    for author in authors:  # oldest first, a clock tick apart
        author.publish()
        time.sleep(0.02)
    world.service.start()
    assert wait_until(lambda: world.state.pulls_done_round == 0, 20)
    assert set(pulled_authors(world)) == {a.peer_id for a in authors[-2:]}


def test_the_round_is_told_only_once_the_budgets_last_pull_has_ended(world):
    world.service.puller.pulls_per_round = 2
    world.net.serve_delay_s = 0.5
    for author in world.authors(4, standing=True):
        author.publish()
    world.service.start()
    assert wait_until(lambda: len(world.net.calls) == 2, 10)
    assert world.state.pulls_done_round == -1  # both pulls still in flight: more may arrive
    assert wait_until(lambda: world.state.pulls_done_round == 0, 10)
    assert received(world) == 2


def test_authors_without_standing_are_not_charged_to_the_budget(world):
    """Newcomers keep their own probation share (exchange/standing.py), so a spent budget never locks
    them out, and they never eat the budget of the peers a node trains on."""
    world.service.puller.pulls_per_round = 1
    authors = world.authors(4)  # none has standing yet
    for author in authors:
        author.publish()
    world.service.start()
    assert wait_until(lambda: received(world) == 4, 20), world.state.counters
    assert world.service.puller.dropped["round_budget"] == 0


def test_a_notice_goes_to_a_bounded_fanout_with_standing_peers_first(world):
    authors = world.authors(4 * NOTICE_FANOUT)
    standing = {a.peer_id for a in authors[: NOTICE_FANOUT // 2]}
    for peer in standing:
        world.book.reward(peer)
    world.service.refresh_roster()
    assert len(world.roster.members()) == len(authors)
    draws = [world.roster.notice_targets() for _ in range(20)]
    assert all(len(targets) == NOTICE_FANOUT == len(set(targets)) for targets in draws)
    assert all(set(targets[: len(standing)]) == standing for targets in draws)
    assert len({frozenset(targets) for targets in draws}) > 1  # the others change from round to round
    assert set(world.roster.notice_targets(len(authors) + 5)) == {a.peer_id for a in authors}
