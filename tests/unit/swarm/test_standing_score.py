"""Standing is a measured, decaying score (PeerBook): earned only by groups this node trained on, lost to
pull failures, strikes, bans, colocation and time. Each test failed on the code before the score existed,
where one accepted batch gave standing for good and a ban only suspended it."""

from __future__ import annotations

import pytest

from swarmnode.swarm.exchange import standing
from swarmnode.swarm.exchange.peers import PeerBook
from tests.helpers.clocks import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def rounds(book: PeerBook, clock: FakeClock, n: int, seconds: float = 2.0) -> None:
    """``n`` rounds of this node, ``seconds`` each, with no training credit."""
    for _ in range(n):
        clock.advance(seconds)
        book.tick_round()


def at_cap(book: PeerBook, peer: str) -> None:
    book.credit_trained(peer, 100)
    assert book.score(peer) == standing.SCORE_CAP


def test_accepted_but_not_trained_confers_no_standing(clock: FakeClock) -> None:
    book = PeerBook(clock)
    book.reward("canned", 10)  # verified and accepted, never trained on
    assert not book.has_standing("canned") and book.score("canned") == 0.0
    assert book.snapshot()["peers"]["canned"]["accepted_groups"] == 10  # still counted
    book.credit_trained("canned", 1)
    assert book.has_standing("canned")


def test_a_peer_trained_on_once_has_standing_at_once(clock: FakeClock) -> None:
    book = PeerBook(clock)
    book.credit_trained("newcomer", 1)
    assert book.score("newcomer") == standing.TRAINED_GROUP_CREDIT >= standing.STANDING_SCORE
    assert book.has_standing("newcomer")


@pytest.mark.parametrize("round_s", [2.0, 60.0, 300.0])
def test_an_identity_trained_on_once_a_round_keeps_standing(clock: FakeClock, round_s: float) -> None:
    book = PeerBook(clock)
    for _ in range(200):
        book.credit_trained("steady", 1)
        rounds(book, clock, 1, round_s)
        assert book.has_standing("steady")  # also just before the next credit


def test_an_honest_peer_trained_every_few_rounds_of_a_60s_node_keeps_standing(clock: FakeClock) -> None:
    book = PeerBook(clock)
    for _ in range(30):
        book.credit_trained("honest", 1)
        for _ in range(6):
            rounds(book, clock, 1, 60.0)
            assert book.has_standing("honest")


def test_a_ban_resets_standing_to_zero(clock: FakeClock) -> None:
    """The review's peer: standing came back after each of 4 bans, at reputation -1."""
    book = PeerBook(clock)
    at_cap(book, "p")
    for _ in range(4):
        duration = book.ban("p", "bad_task")
        assert not book.has_standing("p")
        clock.advance(duration)
        assert not book.is_banned("p")
        assert book.score("p") == 0.0 and not book.has_standing("p")  # from zero, not suspended
        book.credit_trained("p", 1)  # trained on again: standing again, from one credit
        assert book.score("p") == standing.TRAINED_GROUP_CREDIT and book.has_standing("p")


def test_no_credit_while_banned(clock: FakeClock) -> None:
    book = PeerBook(clock)
    book.ban("p", "bad_signature")
    book.credit_trained("p", 4)
    clock.advance(3600)
    assert book.score("p") == 0.0 and not book.has_standing("p")


def test_five_pull_timeouts_take_standing_from_a_peer_at_the_cap(clock: FakeClock) -> None:
    book = PeerBook(clock)
    at_cap(book, "slow")
    book.penalise("slow", "pull_timeout")
    assert book.has_standing("slow")  # one slow pull does not undo what it earned
    for _ in range(4):
        book.penalise("slow", "pull_timeout")
    assert not book.has_standing("slow")


def test_timeouts_spread_over_rounds_take_standing_too(clock: FakeClock) -> None:
    book = PeerBook(clock)
    at_cap(book, "slow")
    for _ in range(5):
        rounds(book, clock, 1)
        book.penalise("slow", "pull_timeout")
    assert not book.has_standing("slow")


def test_strikes_cost_score(clock: FakeClock) -> None:
    book = PeerBook(clock, strike_limit=100)
    at_cap(book, "p")
    book.strike("p", "reward_mismatch")
    assert book.has_standing("p")
    book.strike("p", "reward_mismatch")
    assert not book.has_standing("p")


def test_a_trained_peer_loses_standing_when_not_renewed(clock: FakeClock) -> None:
    book = PeerBook(clock)
    book.credit_trained("once", 1)
    rounds(book, clock, standing.SCORE_HALF_LIFE_ROUNDS - 1)
    assert book.has_standing("once")
    rounds(book, clock, 2)
    assert not book.has_standing("once")


def test_standing_at_the_cap_decays_away_by_rounds_and_to_zero(clock: FakeClock) -> None:
    book = PeerBook(clock)
    at_cap(book, "silent")
    rounds(book, clock, standing.SILENT_STANDING_ROUNDS - 1)
    assert book.has_standing("silent")
    rounds(book, clock, 2)
    assert not book.has_standing("silent")
    rounds(book, clock, 100)
    assert book.score("silent") == 0.0  # decays to zero, not towards it forever


def test_standing_decays_by_time_when_rounds_stop(clock: FakeClock) -> None:
    book = PeerBook(clock)
    at_cap(book, "silent")
    clock.advance(standing.SILENT_STANDING_S - 1.0)
    assert book.has_standing("silent")
    clock.advance(2.0)
    assert not book.has_standing("silent")


def test_colocated_identities_are_penalised_below_standing(clock: FakeClock) -> None:
    book = PeerBook(clock)
    sybils = [f"sybil-{i}" for i in range(20)]
    for peer in sybils:
        book.note_origin(peer, "203.0.113.0/24")
        book.credit_trained(peer, 1)
    assert not any(book.has_standing(peer) for peer in sybils)
    assert all(book.score(peer) < 0 for peer in sybils)
    for peer, origin in (("a", "198.51.100.0/24"), ("b", "192.0.2.0/24")):
        book.note_origin(peer, origin)
        book.credit_trained(peer, 1)
        assert book.has_standing(peer)


def test_up_to_the_colocation_threshold_costs_nothing(clock: FakeClock) -> None:
    book = PeerBook(clock)
    lab = [f"lab-{i}" for i in range(standing.COLOCATION_THRESHOLD)]
    for peer in lab:
        book.note_origin(peer, "10.0.0.0/24")
        book.credit_trained(peer, 1)
    assert all(book.score(peer) == standing.TRAINED_GROUP_CREDIT for peer in lab)
    for i in range(20):  # unknown origins (loopback, relayed) are exempt
        book.note_origin(f"local-{i}", None)
        book.credit_trained(f"local-{i}", 1)
        assert book.has_standing(f"local-{i}")


def test_an_unknown_origin_does_not_erase_a_known_one(clock: FakeClock) -> None:
    book = PeerBook(clock)
    sybils = [f"sybil-{i}" for i in range(20)]
    for peer in sybils:
        book.note_origin(peer, "203.0.113.0/24")
        book.credit_trained(peer, 1)
        book.note_origin(peer, None)  # then seen through a relay
    assert not any(book.has_standing(peer) for peer in sybils)


def test_colocation_penalty_lifts_as_the_colocated_scores_decay(clock: FakeClock) -> None:
    book = PeerBook(clock)
    at_cap(book, "honest")
    book.note_origin("honest", "203.0.113.0/24")
    for i in range(20):
        book.note_origin(f"sybil-{i}", "203.0.113.0/24")
        book.credit_trained(f"sybil-{i}", 1)
    assert not book.has_standing("honest")
    for _ in range(100):  # the Sybils are never trained on again; the honest peer is
        book.credit_trained("honest", 1)
        rounds(book, clock, 1)
    assert book.has_standing("honest")


def test_eviction_prefers_peers_with_no_positive_score(clock: FakeClock) -> None:
    book = PeerBook(clock, max_peers=3)
    book.credit_trained("trained", 1)  # least recently seen, but trained on
    book.reward("accepted", 50)  # accepted, never trained on: no score
    book.allow("fresh", 1)
    book.allow("new", 1)
    assert "trained" in book and "accepted" not in book
    assert book.has_standing("trained")


def test_eviction_among_positive_scores_takes_the_lowest(clock: FakeClock) -> None:
    book = PeerBook(clock, max_peers=3)
    book.credit_trained("high", 4)
    book.credit_trained("low", 1)
    book.credit_trained("mid", 2)
    book.credit_trained("new", 1)
    assert "low" not in book and {"high", "mid", "new"} <= set(book.snapshot()["peers"])


def test_ranked_orders_by_score_only(clock: FakeClock) -> None:
    book = PeerBook(clock, strike_limit=100)
    book.credit_trained("one", 1)
    book.credit_trained("three", 3)
    book.credit_trained("two", 2)
    book.reward("reputable", 10_000)  # reputation 1.0, no score
    book.strike("struck", "bad_task")
    order = book.ranked(["struck", "zz-unknown", "one", "reputable", "two", "three", "aa-unknown"])
    assert order == ["three", "two", "one", "zz-unknown", "reputable", "aa-unknown", "struck"]
    assert "zz-unknown" not in book and "aa-unknown" not in book  # ranking creates no entry


def test_graylist_below_probation(clock: FakeClock) -> None:
    book = PeerBook(clock)
    book.penalise("newcomer", "pull_timeout")  # one slow first pull: still on probation
    assert not book.is_graylisted("newcomer") and not book.has_standing("newcomer")
    book.penalise("newcomer", "pull_timeout")
    assert book.is_graylisted("newcomer")
    rounds(book, clock, standing.SCORE_HALF_LIFE_ROUNDS)  # the penalty decays too
    assert not book.is_graylisted("newcomer")
    book.ban("banned", "bad_signature")
    assert book.is_graylisted("banned")
    assert not book.is_graylisted("made-up") and "made-up" not in book


def test_penalise_refuses_an_unknown_reason(clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="no_such_reason"):
        PeerBook(clock).penalise("p", "no_such_reason")


def test_lookups_create_no_entries(clock: FakeClock) -> None:
    book = PeerBook(clock)
    for i in range(100):
        assert book.score(f"made-up-{i}") == 0.0
        assert not book.has_standing(f"made-up-{i}")
    assert len(book) == 0


def test_snapshot_shows_the_score(clock: FakeClock) -> None:
    book = PeerBook(clock)
    book.credit_trained("good", 2)
    book.reward("good", 2)
    snap = book.snapshot()["peers"]["good"]
    assert snap["score"] == 2.0 and snap["accepted_groups"] == 2 and snap["reputation"] > 0


@pytest.mark.parametrize("every", [1, 4, 8, 12, 13])
def test_identities_with_standing_stay_within_the_bound(clock: FakeClock, every: int) -> None:
    """J groups trained a round, one per identity, spread over as many identities as the decay lets keep
    standing (each re-trained every ``every`` rounds): never more than ``standing_bound(J)`` have it."""
    j = 4
    book = PeerBook(clock)
    identities = [f"id-{i}" for i in range(j * every)]
    most = 0
    for r in range(300):
        for peer in identities[(r % every) * j : (r % every + 1) * j]:
            book.credit_trained(peer, 1)
        most = max(most, sum(book.has_standing(peer) for peer in identities))
        rounds(book, clock, 1, 0.0)
    assert most <= standing.standing_bound(j)
    assert standing.standing_bound(j) < 30 * j
