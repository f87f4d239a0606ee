"""#27's bounds on a node's work a round, whatever the swarm's size: at most K = 2 J batches of authors
with standing pulled (and verified) a round, the freshest first, the rest dropped rather than deferred, and
a new batch's notice pushed to NOTICE_FANOUT peers, not to the whole roster; nothing received passed on
(the hop limit is 1); authors without standing a bounded share of first pulls a round.

The worst case is a swarm far larger than K whose every peer has standing and publishes at once. The data
plane is the real one on the scripted network (tests/helpers/scripted_net.py: no libp2p daemon in a unit
test), so pulls can be counted exactly.
"""

from __future__ import annotations

import time

from benchmarks.harness.waiting import wait_until
from swarmnode.swarm.exchange import fanout, puller
from swarmnode.swarm.exchange.arrivals import Arrivals
from swarmnode.swarm.exchange.fanout import NOTICE_FANOUT, NOTICE_ROTATION_S
from swarmnode.swarm.exchange.round_budget import EXPLORATION_PER_ORIGIN, UNKNOWN_ORIGIN_SPARE
from swarmnode.swarm.exchange.standing import PROBATION_PENDING
from swarmnode.swarm.net.reachability import HOLDER_OFFER_FANOUT
from swarmnode.swarm.wire import codec
from tests.helpers.scripted_net import received
from tests.unit.swarm.conftest import WORLD_PEER_GROUPS

SWARM_OVER_BUDGET = 5  # the swarm in these tests is this many times the pull budget


def _unknown_origin_share(budget) -> int:
    """First chances a round for newcomers whose origin this node does not know (all of them together)."""
    return budget.k - budget.k // UNKNOWN_ORIGIN_SPARE


def _pulls_done(world) -> int:
    """The last round whose pulls are done (-1: none yet)."""
    return world.arrivals.snapshot().pulls_done_round


def pulled_authors(world) -> list[str]:
    return [peer for peer, _, _ in world.net.calls]


def test_a_round_pulls_at_most_k_batches_of_authors_with_standing_and_drops_the_rest(world):
    budget = puller.pull_budget(WORLD_PEER_GROUPS)
    assert world.service.puller.budget.k == budget == 2 * WORLD_PEER_GROUPS
    authors = world.authors(SWARM_OVER_BUDGET * budget, standing=True)
    for author in authors:
        author.publish()
    world.start()
    assert wait_until(lambda: _pulls_done(world) == 0, 20), world.arrivals.snapshot().counters
    time.sleep(3 * 0.2)  # three more polls (the world's interval) find every batch again
    assert len(world.net.calls) == received(world) == budget  # the old code pulled all of them
    assert world.service.puller.dropped["round_budget"] == (SWARM_OVER_BUDGET - 1) * budget
    assert not world.service.puller.pending

    # the next round has a budget of its own, for new batches; the dropped ones are never pulled
    world.arrivals.open_round(1)
    fresh = set()
    for author in authors:
        record, _ = author.publish()
        fresh.add(codec.decode_message(record, swarm_id=world.swarm_id)[0].payload_sha256)
    assert wait_until(lambda: _pulls_done(world) == 1, 20), world.arrivals.snapshot().counters
    time.sleep(3 * 0.2)
    assert len(world.net.fetched) == 2 * budget
    assert set(world.net.fetched[budget:]) <= fresh  # only this round's batches


def test_within_the_budget_the_freshest_batches_are_pulled(world):
    world.service.puller.budget.k = 2
    authors = world.authors(6, standing=True)
    for author in authors:  # oldest first, a clock tick apart
        author.publish()
        time.sleep(0.02)
    world.start()
    assert wait_until(lambda: _pulls_done(world) == 0, 20)
    assert set(pulled_authors(world)) == {a.peer_id for a in authors[-2:]}


def test_the_round_is_told_only_once_the_budgets_last_pull_has_ended(world):
    world.service.puller.budget.k = 2
    world.net.serve_delay_s = 0.5
    for author in world.authors(4, standing=True):
        author.publish()
    world.start()
    assert wait_until(lambda: len(world.net.calls) == 2, 10)
    assert _pulls_done(world) == -1  # both pulls still in flight: more may arrive
    assert wait_until(lambda: _pulls_done(world) == 0, 10)
    assert received(world) == 2


def test_authors_without_standing_are_not_charged_to_the_budget(world):
    """Newcomers have a share of their own (round_budget.py), so they never eat the budget of the peers a
    node trains on."""
    authors = world.authors(4)  # none has standing yet
    for author in authors:
        author.publish()
    world.start()
    assert wait_until(lambda: received(world) == 4, 20), world.arrivals.snapshot().counters
    assert world.service.puller.dropped["round_budget"] == 0
    assert not world.service.puller.budget.round_spent()


def test_newcomers_get_a_bounded_share_of_first_pulls_a_round_whatever_their_number(world):
    """The worst case: far more newcomers (or Sybils with their identity work done) than K announce at
    once, to a node that knows J peers with standing. A round starts K of their first pulls; the others
    wait, pending within PROBATION_PENDING, for the next rounds' shares. The old
    code started all of them in the round it heard of them."""
    budget = world.service.puller.budget
    world.authors(WORLD_PEER_GROUPS, standing=True)  # known, with standing, publishing nothing
    newcomers = world.authors(SWARM_OVER_BUDGET * budget.k)
    for author in newcomers:
        author.publish()
    world.start()
    share = _unknown_origin_share(budget)  # no notices here: their origins are unknown
    assert wait_until(lambda: received(world) == share, 20), world.arrivals.snapshot().counters
    time.sleep(3 * 0.2)  # three more polls: nothing more this round
    assert len(world.net.calls) == received(world) == share  # the old code: all 40
    assert len(world.service.puller.pending) == min(len(newcomers) - share, PROBATION_PENDING)
    world.arrivals.open_round(1)  # the service thread starts the next share (only it may start pulls)
    assert wait_until(lambda: received(world) == 2 * share, 20), world.arrivals.snapshot().counters


def test_a_notice_goes_to_a_bounded_fanout_with_standing_peers_first(world):
    authors = world.authors(4 * NOTICE_FANOUT)
    standing = {a.peer_id for a in authors[: NOTICE_FANOUT // 2]}
    for peer in standing:
        world.book.credit_trained(peer)
    world.service.refresh_roster()
    assert len(world.roster.members()) == len(authors)
    draws = [world.roster.notice_targets() for _ in range(20)]
    assert all(len(targets) == NOTICE_FANOUT == len(set(targets)) for targets in draws)
    assert all(set(targets[: len(standing)]) == standing for targets in draws)
    assert len({frozenset(targets) for targets in draws}) > 1  # the others change from round to round
    assert set(world.roster.notice_targets(len(authors) + 5)) == {a.peer_id for a in authors}


def test_the_peers_that_pulled_our_last_batches_get_the_notice_too_bounded_standing_first(world):
    """A node trains on the peers it scores highest, and the ring seldom makes those its senders: their
    batches reached it by the poll (16 nodes: used-by p95 4.0 s). The pullers of our last batches (what the
    payload server measured) are notified past the ring, at most PULLER_NOTICES of them, members with
    standing first; a puller that is not a member, or this node, never."""
    authors = world.authors(4 * NOTICE_FANOUT)
    with_standing = {a.peer_id for a in authors[: 2 * NOTICE_FANOUT]}
    for peer in with_standing:
        world.book.credit_trained(peer)
    world.service.refresh_roster()
    ring = world.roster.notice_targets()
    assert len(ring) == NOTICE_FANOUT and set(ring) < with_standing  # this minute's ring
    standing_off_ring = sorted(with_standing - set(ring))[0]
    newcomers = [a.peer_id for a in authors[2 * NOTICE_FANOUT :]]
    pullers = ["not-a-member", world.roster.own_peer_id, *newcomers, standing_off_ring]  # newest first
    targets = world.roster.notice_targets(pullers=pullers)
    assert targets[:NOTICE_FANOUT] == ring
    assert len(targets) == NOTICE_FANOUT + fanout.PULLER_NOTICES == len(set(targets))
    assert targets[NOTICE_FANOUT:] == [standing_off_ring, *newcomers[: fanout.PULLER_NOTICES - 1]]
    assert world.roster.notice_targets(pullers=ring) == ring  # pullers on the ring: nothing more
    assert fanout.with_pullers(["a"], ["b", "a", "b", "c"], count=1) == ["a", "b"]


def test_on_the_ring_every_node_receives_exactly_the_fanout_and_the_senders_rotate():
    """Random targets gave some nodes 4 notices a round and the rest of their budget to late poll finds;
    on the ring each of N nodes receives exactly NOTICE_FANOUT, whatever N, from senders that change with
    the rotation."""
    for n in (NOTICE_FANOUT + 1, 16, 33, 100):
        swarm = [f"peer-{i:03d}" for i in range(n)]
        received = {epoch: {peer: [] for peer in swarm} for epoch in range(3)}
        for epoch in received:
            for me in swarm:
                others = [p for p in swarm if p != me]
                targets = fanout.notice_targets(me, others, [], now=epoch * NOTICE_ROTATION_S + 1)
                assert len(set(targets)) == NOTICE_FANOUT and me not in targets
                for peer in targets:
                    received[epoch][peer].append(me)
            assert {len(senders) for senders in received[epoch].values()} == {NOTICE_FANOUT}
        if n > NOTICE_FANOUT + 1:
            assert received[0][swarm[0]] != received[1][swarm[0]]  # the publishers a node hears rotate
    small = fanout.notice_targets("me", ["a", "b"], ["x", "y", "z"], now=0)
    assert set(small[:2]) == {"a", "b"} and set(small[2:]) == {"x", "y", "z"}  # the ring first, then the rest


def test_a_batch_of_the_last_wave_heard_of_late_never_takes_this_rounds_budget(world):
    """At 16 nodes a third of the pulls were last-wave batches the DHT poll found after the round's
    window opened; trained on a round late, they reached the nodes that used them 3-8 s after publishing.
    Now a batch is pulled only in the window it was announced in."""
    world.service.puller.budget.k = 3  # room for one more in round 0: the late batches still do not get it
    first, late, fresh = world.authors(2, standing=True), world.authors(2, standing=True), world.authors(2)
    for author in first:
        author.publish()
    world.start()
    assert wait_until(lambda: received(world) == 2, 20)  # round 0's two pulls
    late_records = [author.publish(announce=False)[0] for author in late]  # announced in round 0 ...
    time.sleep(0.05)
    world.arrivals.open_round(1)  # ... and the round ends before anyone hears of them
    time.sleep(0.05)
    for author in fresh:
        world.book.credit_trained(author.peer_id)
        author.publish()
    for author, record in zip(late, late_records, strict=True):  # heard of now, by a late notice
        assert world.service.inbox.add_notice(record, author.peer_id, author.peer_id)
    assert wait_until(lambda: received(world) == 4, 20), world.arrivals.snapshot().counters
    time.sleep(3 * 0.2)  # three more polls: nothing else is pulled
    assert pulled_authors(world)[2:] and set(pulled_authors(world)[2:]) == {a.peer_id for a in fresh}
    assert world.service.puller.dropped["round_budget"] == 2  # the last wave's, though its window had room


def test_the_rounds_wait_says_what_ended_it():
    """The share trace's ``ended_by`` (benchmarks.swarm_latency counts it for rounds short of J)."""
    arrivals, always = Arrivals(), lambda peer: True
    later, soon = time.monotonic() + 60, time.monotonic() + 0.1
    assert arrivals.wait_for(set(), always, 0, 4, later) == ("nobody", set())
    assert arrivals.wait_for({"a", "b"}, lambda peer: peer == "a", 0, 4, soon) == ("deadline", {"a"})
    arrivals.pulls_done(0)
    assert arrivals.wait_for({"a", "b"}, always, 0, 4, later)[0] == "budget"
    arrivals.settle("a")
    arrivals.settle("b")
    assert arrivals.wait_for({"a", "b"}, always, 0, 4, later)[0] == "settled"


def test_a_received_notice_is_never_passed_on_and_holder_offers_stay_within_k_times_their_fanout(world):
    """The hop limit is 1: a node never forwards a notice it received. What it sends beyond its own publish
    is "I hold this" offers for batches it verified, to at most HOLDER_OFFER_FANOUT live peers behind NAT
    each (net/reachability.py); with K verifications a round, a sender pushing any number of notices makes
    the node send at most K x HOLDER_OFFER_FANOUT. The old code verified (and offered) all 40."""
    budget = world.service.puller.budget.k
    behind_nat = world.authors(3 * HOLDER_OFFER_FANOUT)  # in the roster, publishing nothing
    authors = world.authors(SWARM_OVER_BUDGET * budget, standing=True)
    for author in authors:
        record, _ = author.publish(announce=False)
        assert world.service.inbox.add_notice(record, author.peer_id, author.peer_id)
    world.service.dialback.behind_nat = frozenset(peer.peer_id for peer in behind_nat)
    world.start()
    assert wait_until(lambda: _pulls_done(world) == 0, 20), world.arrivals.snapshot().counters
    time.sleep(3 * 0.2)
    assert received(world) == budget
    assert world.net.notices_sent == budget * HOLDER_OFFER_FANOUT


def test_newcomers_of_one_network_get_one_first_chance_a_round_and_leave_the_rest_to_others(world):
    """First chances are first come, but bounded per origin (/24, /48): a flood of 40 fresh identities
    from two networks, announced before a newcomer from a third, takes EXPLORATION_PER_ORIGIN each, and
    the newcomer is pulled in the same round (the old share went to the first K, all of the flood)."""
    budget = world.service.puller.budget
    world.authors(WORLD_PEER_GROUPS, standing=True)
    flood = world.authors(40)
    for i, author in enumerate(flood):
        world.book.note_origin(author.peer_id, f"203.0.{i % 2}.0/24")  # as their notices tell
        author.publish()
    (newcomer,) = world.authors(1)
    world.book.note_origin(newcomer.peer_id, "198.51.100.0/24")
    world.start()
    assert wait_until(lambda: received(world) == 2 * EXPLORATION_PER_ORIGIN, 20), world.net.calls
    newcomer.publish()
    assert wait_until(lambda: newcomer.peer_id in pulled_authors(world), 20), world.net.calls
    time.sleep(3 * 0.2)  # three more polls: no more of the flood this round
    assert len(set(pulled_authors(world))) == 2 * EXPLORATION_PER_ORIGIN + 1 < budget.k


def test_an_author_once_tried_is_not_charged_to_the_share_again(world):
    """The share counts identities new here: a newcomer whose first chance was given (here it served
    tampered bytes, so it has no standing) gets its next batch pulled though the round's share is spent;
    its later batches are bounded per identity instead (strikes, the failed-probation order)."""
    budget = world.service.puller.budget
    world.authors(WORLD_PEER_GROUPS, standing=True)
    share = _unknown_origin_share(budget)
    tried, *others = world.authors(share)
    world.net.behaviour[tried.peer_id] = "tamper"
    tried.publish()
    world.start()
    assert wait_until(lambda: tried.peer_id in pulled_authors(world), 20), world.arrivals.snapshot().counters
    for author in others:
        author.publish()
    assert wait_until(lambda: received(world) == share - 1, 20), world.arrivals.snapshot().counters
    assert budget.exploration_spent() and not world.book.has_standing(tried.peer_id)
    tried.publish()
    assert wait_until(lambda: pulled_authors(world).count(tried.peer_id) == 2, 20), world.net.calls
