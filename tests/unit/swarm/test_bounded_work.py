"""A node's work per round does not grow with the swarm (issue #27): at most K pulls of authors with
standing a round (``puller.pulls_per_round``: 2 x J), the freshest first, the other authors settled for
the round; a bounded relay of each verified batch; notices to a bounded sample of the roster. Each test
sends the worst case (40 peers with standing, every one announcing) and failed on the code that pulled
and notified every one of them.

The stages are the real ones on the scripted network (tests/unit/swarm/conftest.py)."""

from __future__ import annotations

import time

import pytest

from swarmnode.experiment.waiting import wait_until
from swarmnode.swarm.exchange import intake, puller
from swarmnode.swarm.exchange.service import ExchangeService
from tests.helpers.scripted_net import received

PEERS = 40
J = 4


@pytest.fixture
def bounded(world):
    """The world's stages with this node's real budget: K = pulls_per_round(J)."""
    world.service.stop()
    world.service = ExchangeService(
        transport=world.net, swarm_id=world.swarm_id, roster=world.roster, verifier=world.verifier,
        book=world.book, state=world.state, pulls_per_round=puller.pulls_per_round(J),
    )  # fmt: skip
    yield world
    world.service.stop()


def test_at_most_k_pulls_a_round_the_freshest_first_and_the_rest_not_waited_for(bounded):
    world, k = bounded, puller.pulls_per_round(J)
    authors = bounded.authors(PEERS, standing=True)
    for author in authors:
        author.publish()
    world.service.refresh_roster()
    world.service.start()
    assert wait_until(lambda: received(world) == k, 10)
    time.sleep(1.0)  # several polls later: still k this round
    assert received(world) == k == len(world.net.calls)
    assert wait_until(lambda: world.state.settled >= {a.peer_id for a in authors}, 5)  # none waited for
    with world.state.lock:
        world.state.round += 1  # the next round: a new budget
    world.service._wake.set()
    assert wait_until(lambda: received(world) == 2 * k, 10)
    time.sleep(0.5)
    assert received(world) == 2 * k


def test_fresher_batches_are_pulled_before_older_ones(bounded):
    world, k = bounded, puller.pulls_per_round(J)
    old = bounded.authors(k, standing=True)
    for author in old:
        author.publish()
    time.sleep(0.05)
    fresh = bounded.authors(k, standing=True)
    for author in fresh:
        author.publish()
    world.service.refresh_roster()
    world.service.start()
    assert wait_until(lambda: received(world) == k, 10)
    assert {call[0] for call in world.net.calls} == {a.peer_id for a in fresh}


def test_a_verified_batch_is_relayed_to_a_bounded_sample(bounded):
    world = bounded
    author, *others = bounded.authors(PEERS, standing=True)
    author.publish()
    world.service.refresh_roster()
    world.service.start()
    assert wait_until(lambda: received(world) == 1, 10)
    assert wait_until(lambda: world.net.stats.get("notices_sent", 0) > 0, 5)
    assert world.net.stats["notices_sent"] == intake.RELAY_FANOUT  # of the 39 others who could be told


def test_a_sample_of_the_roster_is_bounded_and_standing_first(bounded):
    world = bounded
    standing = bounded.authors(3, standing=True)
    bounded.authors(PEERS)
    world.service.refresh_roster()
    assert len(world.roster.members()) == PEERS + 3
    for _ in range(20):
        sample = world.roster.sample(5)
        assert len(sample) == 5 and set(sample[:3]) == {a.peer_id for a in standing}
    assert world.roster.sample(100, leave_out={standing[0].peer_id}) and standing[0].peer_id not in (
        world.roster.sample(100, leave_out={standing[0].peer_id})
    )
