"""The arrivals' two promises to the round thread, with real threads: it is woken once for each change that
can end its wait (a new informative group, a peer settled, a roster read) and never for a batch that
cannot (duplicates, zero-advantage groups, a peer settled again); and no group is lost or taken twice
while the service's stages add and the round takes: groups pooled = groups taken + groups left.
"""

from __future__ import annotations

import random
import sys
import threading
import time

import pytest

from swarmnode.rollouts import Completion, Provenance, RolloutGroup, TaskRef
from swarmnode.swarm.exchange import pool as pool_module
from swarmnode.swarm.exchange.arrivals import Arrivals
from swarmnode.swarm.exchange.pool import GroupPool, group_digest

WAIT_S = 5.0  # the longest any step below waits for the round thread
QUIET_S = 0.2  # how long a change that must not wake it is watched


def group(producer: str, index: int, informative: bool = True) -> RolloutGroup:
    """A verified peer group of its own content (``index``); zero-advantage unless ``informative``."""
    rewards = (1.0, 0.0) if informative else (0.5, 0.5)
    return RolloutGroup(
        ref=TaskRef.make("basic_arithmetic", seed=1, index=index),
        question=f"q{index}",
        completions=(Completion(f"{producer} a{index}"), Completion(f"{producer} b{index}")),
        rewards=rewards,
        task_scores=rewards,
        format_ok=(True, True),
        provenance=Provenance("peer", producer, policy_version=0, round=0),
    )


@pytest.fixture
def busy_switching():
    """Threads switch every 10 us instead of 5 ms, so that an unguarded interleaving shows."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(before)


class RoundThread:
    """A round thread waiting for ``peer`` (who never delivers) in a wait J cannot end; ``looks`` counts
    how often it looked at the arrivals: once at first, then once per wake-up."""

    def __init__(self, arrivals: Arrivals, peer: str):
        self.looks = 0
        self.ended: tuple[str, set[str]] | None = None

        def keep(_peer: str) -> bool:  # called once per look (one awaited peer)
            self.looks += 1
            return True

        def run() -> None:
            self.ended = arrivals.wait_for({peer}, keep, 0, 1000, time.monotonic() + 60)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def looked(self, times: int) -> bool:
        deadline = time.monotonic() + WAIT_S
        while self.looks < times and time.monotonic() < deadline:
            time.sleep(0.001)
        return self.looks == times


def test_the_round_is_woken_once_per_usable_change_and_never_for_a_batch_that_cannot_end_its_wait():
    arrivals = Arrivals(GroupPool(random.Random(0)))
    arrivals.open_round(0)
    round_thread = RoundThread(arrivals, "silent")
    assert round_thread.looked(1)  # it waits: every change below comes after it released the lock
    looks = 1

    def batch(author: str, *groups: RolloutGroup):
        return lambda: arrivals.add(author, list(groups), **HOW)

    steps = [  # what changes, and how often it must wake the round thread
        ("author settles (its pull failed)", lambda: arrivals.settle("author"), 1),
        ("author settles again", lambda: arrivals.settle("author"), 0),
        ("a new informative group", batch("author", group("author", 1)), 1),
        ("the same group again", batch("author", group("author", 1)), 0),
        ("a zero-advantage group", batch("author", group("author", 2, informative=False)), 0),
        ("a pull failed", lambda: arrivals.fetch_failed("timeout"), 0),
        ("a duplicate and two new ones", batch("author", *(group("author", i) for i in (1, 3, 4))), 1),
        ("a new author's zero-advantage batch", batch("other", group("other", 5, informative=False)), 1),
        ("a roster read", arrivals.wake, 1),
        ("a publish", lambda: arrivals.published(4), 0),
    ]
    for what, change, wakes in steps:
        change()
        looks += wakes
        if wakes:
            assert round_thread.looked(looks), f"{what}: {round_thread.looks} looks, {looks} expected"
        else:
            time.sleep(QUIET_S)
            assert round_thread.looks == looks, f"{what} woke the round thread"
    arrivals.settle("silent")
    round_thread.thread.join(WAIT_S)
    assert round_thread.ended == ("settled", {"silent"}) and round_thread.looks == looks + 1
    assert arrivals.snapshot().counters.duplicate_groups == 2


def test_a_pull_still_going_holds_a_round_whose_awaited_peers_have_settled():
    """A fresh swarm's second round waits for the one peer it trained on; once that one delivered, the round
    ended "settled" with the batch of a peer it has no standing for half pulled (8 loopback nodes: 3 of 48
    rounds short of J). Now it waits for that pull and takes J."""
    arrivals = Arrivals(GroupPool(random.Random(0)))
    arrivals.open_round(0)
    arrivals.expect({"newcomer"})  # its pull has started
    ended: list[tuple[str, set[str]]] = []
    wait = threading.Thread(
        target=lambda: ended.append(arrivals.wait_for({"known"}, bool, 0, 2, time.monotonic() + 60)),
        daemon=True,
    )
    wait.start()
    arrivals.add("known", [group("known", 1)], **HOW)  # every awaited peer settled: J = 2 not filled
    time.sleep(QUIET_S)
    assert not ended  # the old code: ("settled", {"known"}) with one group of J = 2
    arrivals.add("newcomer", [group("newcomer", 2)], **HOW)
    wait.join(WAIT_S)
    assert ended == [("settled", {"known"})]  # every peer settled and no pull going: now it ends
    assert len(arrivals.take(0, 2, {"known"}).groups) == 2


HOW = {"source": "notice", "delay_s": 0.1}
ADDERS = 4  # service-side threads, each adding the verified batches of one producer
BATCHES = 300  # per adder, each of GROUPS_PER_BATCH new informative groups
GROUPS_PER_BATCH = 2
J = 8


def test_no_group_is_lost_while_stages_add_and_the_round_takes(busy_switching, monkeypatch):
    """The round takes J groups a round as fast as it can while four threads add; the pool's caps are
    lifted, so that every group not taken is still there at the end."""
    monkeypatch.setattr(pool_module, "MAX_POOL_GROUPS", 10**6)
    monkeypatch.setattr(pool_module, "MAX_POOL_GROUPS_PER_PRODUCER", 10**6)
    arrivals = Arrivals(GroupPool(random.Random(1)))
    producers = [f"peer{k}" for k in range(ADDERS)]
    pooled = [0] * ADDERS
    taken: list[RolloutGroup] = []
    start = threading.Barrier(ADDERS + 1)

    def add(k: int) -> None:
        start.wait(WAIT_S)
        for b in range(BATCHES):
            batch = [group(producers[k], b * GROUPS_PER_BATCH + i) for i in range(GROUPS_PER_BATCH)]
            pooled[k] += arrivals.add(producers[k], batch, **HOW)[0]

    def rounds() -> None:
        deadline, round_ = time.monotonic() + 10 * WAIT_S, 0
        start.wait(WAIT_S)
        while any(a.is_alive() for a in adders) and time.monotonic() < deadline:
            arrivals.open_round(round_)
            _, live = arrivals.wait_for(set(producers), lambda _: True, round_, J, time.monotonic())
            taken.extend(arrivals.take(round_, J, live).groups)
            round_ += 1

    adders = [threading.Thread(target=add, args=(k,), daemon=True) for k in range(ADDERS)]
    round_thread = threading.Thread(target=rounds, daemon=True)
    for thread in [*adders, round_thread]:
        thread.start()
    for thread in [*adders, round_thread]:
        thread.join(10 * WAIT_S)
    assert not round_thread.is_alive() and not any(a.is_alive() for a in adders)
    now = arrivals.snapshot()
    sent = ADDERS * BATCHES * GROUPS_PER_BATCH
    assert sum(pooled) == now.counters.groups_accepted == sent  # every group was new
    assert len(taken) + now.pooled == sent, f"{sent} pooled, {len(taken)} taken, {now.pooled} left"
    assert now.counters.groups_trained == len(taken) > 0
    assert len({group_digest(g) for g in taken}) == len(taken)  # none taken twice
