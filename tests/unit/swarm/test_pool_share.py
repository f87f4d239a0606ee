"""One producer's share of what a round trains on is capped, whatever it sends: selection goes round-robin
across producers with at most ``producer_cap(J)`` groups each, the pool holds at most
``MAX_POOL_GROUPS_PER_PRODUCER`` of one producer's groups, and ties are broken by an RNG seeded from
os.urandom, not from the (public) peer id."""

from __future__ import annotations

import random
from collections import Counter

from swarmnode.rollouts import Completion, Provenance, RolloutGroup, TaskRef
from swarmnode.swarm.exchange.peers import PeerBook
from swarmnode.swarm.exchange.pool import MAX_POOL_GROUPS_PER_PRODUCER, GroupPool, producer_cap

HOSTILE = "12D3KooW-hostile"
HONEST = [f"12D3KooW-honest-{i}" for i in range(3)]


def groups(producer: str, n: int, round_: int, start: int = 0) -> list[RolloutGroup]:
    return [
        RolloutGroup(
            ref=TaskRef.make("basic_arithmetic", hash(producer) % 1000, round_ * 1000 + start + i),
            question="q",
            completions=(Completion("<answer>1</answer>"), Completion("no")),
            rewards=(1.0, 0.0),
            task_scores=(1.0, 0.0),
            format_ok=(True, False),
            provenance=Provenance("peer", producer, 0, round_),
        )
        for i in range(n)
    ]


def run_rounds(pool: GroupPool, rounds: int, j: int) -> list[Counter]:
    """Each round: the hostile producer delivers 64 groups, each honest one 4; the round takes J."""
    per_round = []
    for r in range(1, rounds + 1):
        pool.add(groups(HOSTILE, 64, r), r)
        for peer in HONEST:
            pool.add(groups(peer, 4, r), r)
        per_round.append(Counter(g.provenance.producer for g in pool.select(j)))
    return per_round


def test_one_producer_announcing_64_groups_a_round_gets_at_most_its_cap() -> None:
    """The review's attacker supplied 10-11 of the 12 peer groups each honest node trained on."""
    for j in (4, 12):
        per_round = run_rounds(GroupPool(random.Random(0)), rounds=10, j=j)
        for taken in per_round:
            assert sum(taken.values()) == j
            assert taken[HOSTILE] <= producer_cap(j)
            assert taken[HOSTILE] <= -(-j // 4)  # round-robin: four producers with groups, a fair share each
        print(f"\nJ={j}: hostile took {[t[HOSTILE] for t in per_round]} per round (cap {producer_cap(j)})")


def test_a_lone_producer_still_gets_only_its_cap() -> None:
    pool = GroupPool(random.Random(0))
    pool.add(groups(HOSTILE, 64, 1), 1)
    assert len(pool.select(4)) == producer_cap(4) == 2


def test_one_producer_cannot_flood_honest_groups_out_of_the_pool() -> None:
    pool = GroupPool(random.Random(0))
    pool.add(groups(HONEST[0], 4, 1), 1)
    for r in range(2, 12):
        pool.add(groups(HOSTILE, 64, r), r)
    held = Counter(p.group.provenance.producer for p in pool.groups)
    assert held[HOSTILE] == MAX_POOL_GROUPS_PER_PRODUCER and held[HONEST[0]] == 4


def test_fresher_producers_come_first_and_each_group_is_trained_once() -> None:
    pool = GroupPool(random.Random(0))
    pool.add(groups(HONEST[0], 4, 1), 1)
    pool.add(groups(HONEST[1], 4, 2), 2)
    first = pool.select(1)
    assert [g.provenance.producer for g in first] == [HONEST[1]]
    seen = set(map(id, first))
    while chosen := pool.select(4):
        assert not seen & set(map(id, chosen))
        seen |= set(map(id, chosen))
    assert len(seen) == 8


def test_ties_are_broken_by_os_randomness_not_by_the_peer_id() -> None:
    """Seeding from the public peer id let anyone predict which groups a node would choose."""
    picks = set()
    for _ in range(8):
        pool = GroupPool()
        for peer in HONEST:
            pool.add(groups(peer, 20, 1), 1)
        picks.add(tuple(g.ref.index for g in pool.select(3)))
    assert len(picks) > 1


def test_a_round_stops_waiting_only_when_select_would_fill_j_with_fresh_groups() -> None:
    """``can_fill`` counts what ``select`` may take: one flooding producer alone never fills J (its cap),
    groups from an earlier round do not count, uninformative groups do not count, and J = 0 never waits."""
    pool = GroupPool(random.Random(0))
    pool.add(groups(HONEST[0], 4, 1), 1)  # last round's: not fresh for round 2
    pool.add(groups(HOSTILE, 64, 2), 2)
    assert not pool.can_fill(4, since_round=2)  # 64 fresh groups, but at most producer_cap(4) = 2 count
    flat = [g.__class__(**{**g.__dict__, "rewards": (0.5, 0.5)}) for g in groups(HONEST[1], 4, 2, start=100)]
    pool.add(flat, 2)  # zero advantage: select drops them
    assert not pool.can_fill(4, since_round=2)
    pool.add(groups(HONEST[2], 1, 2), 2)
    assert not pool.can_fill(4, since_round=2)  # 2 + 1
    pool.add(groups(HONEST[2], 1, 2, start=1), 2)
    assert pool.can_fill(4, since_round=2) and pool.can_fill(0, since_round=2)
    assert len(pool.select(4)) == 4


def test_places_go_by_score_as_seats_so_a_bought_standing_never_outranks_a_second_honest_group():
    """Three honest peers this node keeps training on (score at the cap) and identities whose standing was
    bought with one canned group: the round's J = 4 places are all honest. Ranked within round-robin
    turns (every producer's first group before any second), the fourth place went to a bought identity
    whenever one had a group pooled: at most 75% honest (measured in the real-process Sybil mix)."""
    book = PeerBook()
    for peer in HONEST:
        book.credit_trained(peer, 4)
    bought = [f"12D3KooW-bought-{i}" for i in range(8)]
    for peer in bought:
        book.credit_trained(peer, 1)
    pool = GroupPool(random.Random(0))
    for peer in HONEST:
        pool.add(groups(peer, 2, 1), 1)
    for peer in bought:
        pool.add(groups(peer, 2, 1), 1)
    chosen = Counter(g.provenance.producer for g in pool.select(4, book))
    assert set(chosen) <= set(HONEST) and sum(chosen.values()) == 4, chosen
    assert max(chosen.values()) <= producer_cap(4)
