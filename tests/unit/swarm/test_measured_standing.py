"""Standing follows what this node measured (exchange/standing.py), wired through the exchange: a pull that
times out or fails costs its holder, with standing or without; a graylisted peer gets no roster seat; the
round credits the producers whose groups it trained on; the start barrier counts only peers with standing
or a batch verified here."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from benchmarks.harness.waiting import wait_until
from swarmnode.learn.batch import TrainSequence
from swarmnode.rollouts import Completion, Provenance, RolloutGroup, TaskRef
from swarmnode.rounds import trained_peer_groups
from swarmnode.swarm.exchange.inbox import Candidate
from swarmnode.swarm.exchange.standing import PENALTIES
from swarmnode.swarm.net import notices


def test_a_pull_that_times_out_costs_its_author_even_with_standing(world):
    """The old puller only backed off a holder that timed out: an author with standing never paid for
    silence, so 8 silent identities with standing took every pull of a round, round after round."""
    (silent,) = world.authors(1, standing=True)
    world.net.behaviour[silent.peer_id] = "silent"
    before = world.book.score(silent.peer_id)
    silent.publish()
    world.start()
    assert wait_until(lambda: world.net.calls, 20)
    after = before - 0.9 * PENALTIES["pull_timeout"]
    # the old code: about ``before`` still (the per-second decay only)
    assert wait_until(lambda: world.book.score(silent.peer_id) <= after, 10), world.book.score(silent.peer_id)


def test_an_unreachable_holder_pays_the_small_pull_failed_penalty(world):
    (author,) = world.authors(1, standing=True)
    world.net.behaviour[author.peer_id] = "unreachable"
    before = world.book.score(author.peer_id)
    author.publish()
    world.start()
    after = before - 0.9 * PENALTIES["pull_failed"]
    assert wait_until(lambda: world.book.score(author.peer_id) <= after, 20), world.book.score(author.peer_id)
    assert world.book.has_standing(author.peer_id)  # NAT, not silence: a small charge


def _group(producer: str, source: str, rewards: tuple[float, ...]) -> RolloutGroup:
    ref = TaskRef(dataset="d", seed=0, index=0)
    completions = tuple(Completion(text="x", token_ids=(1,)) for _ in rewards)
    provenance = Provenance(source=source, producer=producer, policy_version=0, round=0)
    return RolloutGroup(
        ref=ref, question="q", completions=completions, rewards=rewards, task_scores=rewards,
        format_ok=(True,) * len(rewards), provenance=provenance,
    )  # fmt: skip


def test_the_round_credits_distinct_peer_groups_with_signal_per_producer():
    a1, a2, b = _group("a", "peer", (1, 0)), _group("a", "peer", (1, 0)), _group("b", "peer", (1, 0))
    own = _group("me", "local", (1, 0))
    seqs = [TrainSequence((0,), (1,), adv, None, g) for g in (a1, a2, b, own) for adv in (0.5, -0.5)]
    seqs.append(TrainSequence((0,), (1,), 0.0, None, _group("c", "peer", (1, 1))))  # no signal
    assert trained_peer_groups(seqs) == {"a": 2, "b": 1}


def test_a_graylisted_peers_card_is_refused_like_a_banned_ones(world):
    """The old roster admitted any card with work while its peer was not banned: a peer graylisted for
    silence took a probation seat again with its next card."""
    (gray,) = world.authors(1)
    world.book.penalise(gray.peer_id, "pull_timeout")
    world.book.penalise(gray.peer_id, "pull_timeout")
    world.roster.admit(gray.peer_id, gray.card_record, time.time())
    assert gray.peer_id not in world.roster.cards
    assert world.roster.refused["graylisted"] == 1


def test_a_notice_tells_the_origin_of_its_authenticated_holder_only():
    """The colocation penalty (standing.py) needs origins; the old receiver told nobody. Only the stream's
    authenticated peer is charged to its address, never the author named in the bytes."""
    seen: list[tuple[str, str | None]] = []
    tell = lambda peer, origin: seen.append((peer, origin))  # noqa: E731
    receiver = notices.NoticeReceiver(lambda *a: True, allow=lambda peer: True, on_origin=tell)
    holder = SimpleNamespace(to_base58=lambda: "holder")
    info = SimpleNamespace(peer_id=holder, addr="/ip4/203.0.113.7/tcp/4001")

    async def deliver() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(notices.encode_notice("author", b"record", b"card"))
        reader.feed_eof()
        writer = SimpleNamespace(close=lambda: None)
        await receiver.handle(info, reader, writer)

    asyncio.run(deliver())
    assert seen == [("holder", "203.0.113.0/24")]
    assert receiver.snapshot() == {"received": 1}


def test_the_start_barrier_ends_only_on_a_running_peer_with_standing_or_a_batch_verified_here(world):
    """The old barrier ended on any live card or announcement claiming round >= 1: one Sybil announcing
    "round 1" ended a node's wait for ``min_peers``."""
    (claimant,) = world.authors(1)
    world.service.refresh_roster()
    record, _ = claimant.publish(announce=False)
    now = time.time()
    world.service.puller.consider(Candidate(record, claimant.peer_id, claimant.peer_id, "notice", now, now))
    assert world.roster.progress(claimant.peer_id)[0] == 1
    assert not world.roster.running_peer()  # a claim alone
    world.book.reward(claimant.peer_id)  # a batch of it verified here
    assert world.roster.running_peer()
