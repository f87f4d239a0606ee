"""The pull budget under a mixed attack on the scripted network (real Puller, Verifier, Roster): authors
with standing publishing many batches, Sybils with standing signing timestamps 25 s in the future, silent
identities with standing; honest authors trained on for a while. The old budget went freshest-first by the
signed timestamp with any number of batches per author and never charged a timeout to an author with
standing: honest authors got 0 of K (docs/reliability.md, threat table)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from benchmarks.harness.waiting import wait_until
from swarmnode.swarm.exchange.standing import SCORE_CAP, TRAINED_GROUP_CREDIT
from tests.helpers import scripted_net

FUTURE_S = 25.0  # within the +30 s a signed timestamp may be ahead


def _pulls_done(world) -> int:
    return world.arrivals.snapshot().pulls_done_round


def _publish_future_dated(authors, monkeypatch) -> None:
    ahead = SimpleNamespace(time=lambda: time.time() + FUTURE_S, sleep=time.sleep, monotonic=time.monotonic)
    with monkeypatch.context() as m:
        m.setattr(scripted_net, "time", ahead)
        for author in authors:
            author.publish()


def test_honest_authors_keep_half_of_k_and_a_silent_identity_loses_standing(world, monkeypatch):
    k = world.service.puller.budget.k
    honest = world.authors(4)
    for author in honest:  # trained on round after round: the highest scores here
        world.book.credit_trained(author.peer_id, int(SCORE_CAP / TRAINED_GROUP_CREDIT))
    canned = world.authors(2, standing=True)  # standing bought once, many batches each
    sybils = world.authors(8, standing=True)
    silent = world.authors(8, standing=True)
    for author in silent:
        world.book.credit_trained(author.peer_id)  # twice the minimum: one timeout does not end it
        world.net.behaviour[author.peer_id] = "silent"
    _publish_future_dated(sybils, monkeypatch)
    for author in silent:
        author.publish()
    for _ in range(5):
        for author in canned:
            author.publish()
    for author in honest:
        author.publish()
    world.start()
    assert wait_until(lambda: _pulls_done(world) == 0, 30), world.arrivals.snapshot().counters
    pulled = list(dict.fromkeys(peer for peer, _, _ in world.net.calls))  # authors (a timeout is retried)
    assert len(pulled) <= k
    honest_ids = {a.peer_id for a in honest}
    # honest batches were announced: they get at least half of K's pulls (the old code: 0)
    assert sum(peer in honest_ids for peer in pulled) >= k // 2, pulled
    assert sum(peer in {a.peer_id for a in canned} for peer in pulled) <= len(canned)  # one per author

    # a silent identity with standing pulled round after round loses its standing within 5 rounds
    victim = silent[0]
    for round_ in range(1, 6):
        world.book.tick_round()
        world.arrivals.open_round(round_)
        if not world.book.has_standing(victim.peer_id):
            break
        victim.publish()
        tries = sum(peer == victim.peer_id for peer, _, _ in world.net.calls)
        wait_until(lambda n=tries: sum(peer == victim.peer_id for peer, _, _ in world.net.calls) > n, 8)
        wait_until(lambda: not world.service.puller._authors_pulling, 5)
    assert not world.book.has_standing(victim.peer_id), world.book.score(victim.peer_id)
