"""Verifier against real reasoning-gym tasks, real Ed25519 identities and real encoded messages.

An honest peer's batch is accepted and rescored here; a hostile peer that forges, replays, floods or
poisons gets its data rejected (counted by reason) and gets banned, and none of its data reaches the
groups the learner sees.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarmnode.rollouts import Provenance
from swarmnode.swarm.exchange.verify import ALL_REASONS, VERIFY_REASONS
from swarmnode.swarm.wire import codec, limits, protocol
from swarmnode.tasks import TaskBank
from tests.helpers import oracles
from tests.helpers.verify_world import (
    FUZZ,
    HONEST,
    HOSTILE,
    NOW,
    SWARM,
    Node,
    Peer,
    assert_labels,
    deliver,
    flip,
    signature_offset,
    with_groups,
)


@pytest.fixture
def node(bank: TaskBank) -> Node:
    return Node(bank)


@pytest.fixture
def honest(peer_bank: TaskBank) -> Peer:
    return Peer(HONEST, peer_bank)


@pytest.fixture
def hostile(peer_bank: TaskBank) -> Peer:
    return Peer(HOSTILE, peer_bank)


# --- honest data ---------------------------------------------------------------------------------------


def test_honest_batch_is_accepted_and_rescored_locally(node: Node, honest: Peer, bank: TaskBank) -> None:
    batch = honest.batch()
    record, data = honest.publish(batch)
    groups = deliver(node, honest, record, data)
    assert len(groups) == len(batch.groups) == 2
    assert node.verifier.rejections == {} and node.verifier.accepted_groups == 2
    for group, wire in zip(groups, batch.groups, strict=True):
        question = bank.question(group.ref)
        assert group.question == question.text
        expected = [bank.score(question, c.text) for c in group.completions]
        assert group.rewards == tuple(e[0] for e in expected)  # this node's format bonus (0.1) ...
        assert group.task_scores == tuple(e[1] for e in expected) == wire.claimed_rewards  # ... same scores
        right = oracles.oracle(question, bank) is not None  # a few logic items have no right answer
        assert group.rewards[0] == pytest.approx(1.1 if right else 0.15) and group.task_scores[1] == 0.0
        assert group.informative
        assert group.provenance == Provenance(
            source="peer",
            producer=HONEST.peer_id,
            policy_version=7,
            round=batch.round,
            model_name="tiny-llama",
            tokenizer_fingerprint="ab" * 32,
        )
        for c in group.completions:  # the peer's token ids and log-probs, unchanged
            assert c.token_ids == (3, 1, 4) and c.logprobs == (-0.5, -1.25, -0.125)
    assert node.book.reputation(HONEST.peer_id) > 0
    assert node.verifier.already_accepted(limits.payload_digest(data))


def test_duplicate_record_is_ignored_and_payload_not_accepted_twice(node: Node, honest: Peer) -> None:
    record, data = honest.publish()
    announcement = node.verifier.check_announcement(record, HONEST.peer_id)
    assert announcement is not None
    assert node.verifier.check_announcement(record, HONEST.peer_id) is None  # the same DHT record re-read
    assert node.verifier.rejections == {}
    assert node.verifier.check_batch(announcement, data, HONEST.peer_id)
    assert node.verifier.check_batch(announcement, data, HONEST.peer_id) == []
    assert node.verifier.rejections == {"duplicate_payload": 1}
    assert (
        not node.book.is_banned(HONEST.peer_id)
        and node.book.snapshot()["peers"][HONEST.peer_id]["strikes"] == 0
    )


# --- forgery ---------------------------------------------------------------------------------------------


def test_forged_announcement_signature_is_rejected_and_charges_nobody(node: Node, honest: Peer) -> None:
    record, _ = honest.publish()
    forged = flip(record, signature_offset(record) + 5)
    assert node.verifier.check_announcement(forged, HONEST.peer_id) is None
    assert node.verifier.rejections == {"bad_signature": 1}
    # anyone can write any DHT subkey: the named peer is not charged, and its real record still counts
    assert not node.book.is_banned(HONEST.peer_id)
    assert node.verifier.check_announcement(record, HONEST.peer_id) is not None


def test_forged_batch_signature_bans_the_stream_peer(node: Node, hostile: Peer, honest: Peer) -> None:
    batch = hostile.batch()
    data = codec.encode_message(HOSTILE, SWARM, batch)
    forged = flip(data, signature_offset(data))
    record = hostile.announce(forged, batch)  # it announces exactly the bytes it then serves
    assert deliver(node, hostile, record, forged) == []
    assert node.verifier.rejections == {"bad_signature": 1}
    assert node.book.is_banned(HOSTILE.peer_id)
    assert node.book.bans()[0][0] == HOSTILE.peer_id and node.book.bans()[0][3] == "bad_signature"
    # its later, valid data is refused unread, at both steps
    record, data = hostile.publish()
    assert deliver(node, hostile, record, data) == []
    assert node.verifier.rejections["banned"] == 1
    announcement = codec.decode_message(record, swarm_id=SWARM)[0]
    assert node.verifier.check_batch(announcement, data, HOSTILE.peer_id) == []
    assert node.verifier.rejections["banned"] == 2
    assert deliver(node, honest, *honest.publish())  # others are unaffected


def test_announcement_under_another_peers_subkey_is_wrong_sender(
    node: Node, honest: Peer, hostile: Peer
) -> None:
    record, _ = hostile.publish()
    assert node.verifier.check_announcement(record, HONEST.peer_id) is None
    assert node.verifier.rejections == {"wrong_sender": 1}
    assert not node.book.is_banned(HONEST.peer_id) and not node.book.is_banned(HOSTILE.peer_id)
    assert deliver(node, honest, *honest.publish())


def test_payload_served_by_another_holder_is_accepted_and_credits_its_author(
    node: Node, honest: Peer
) -> None:
    """Any holder serves a batch (PROTOCOL.md 9.2): the author's signature inside the bytes is checked."""
    record, data = honest.publish()
    assert node.receive(record, data, subkey=HONEST.peer_id, stream_peer=HOSTILE.peer_id)
    assert node.verifier.rejections == {}
    assert node.book.reputation(HONEST.peer_id) > 0 and node.book.reputation(HOSTILE.peer_id) == 0


def test_a_holder_serving_other_bytes_is_charged_not_the_author(
    node: Node, honest: Peer, hostile: Peer
) -> None:
    record, _ = honest.publish()
    _, other = hostile.publish()
    assert node.receive(record, other, subkey=HONEST.peer_id, stream_peer=HOSTILE.peer_id) == []
    assert node.verifier.rejections == {"hash_mismatch": 1}
    peers = node.book.snapshot()["peers"]
    assert peers[HOSTILE.peer_id]["strikes"] == 1 and peers[HONEST.peer_id]["strikes"] == 0


def test_payload_that_differs_from_its_announcement_is_hash_mismatch(node: Node, hostile: Peer) -> None:
    record, data = hostile.publish()
    other = codec.encode_message(HOSTILE, SWARM, hostile.batch())
    assert deliver(node, hostile, record, other) == []
    assert node.verifier.rejections == {"hash_mismatch": 1}
    assert node.book.snapshot()["peers"][HOSTILE.peer_id]["strikes"] == 1


# --- replay, staleness, malformed --------------------------------------------------------------------


def test_an_announcement_reusing_an_old_seq_is_replay(node: Node, honest: Peer) -> None:
    first, _ = honest.publish()
    first_seq = honest.seq
    assert node.verifier.check_announcement(first, HONEST.peer_id) is not None
    # new bytes under the seq already seen, signed later: only the author's key can make this
    batch = honest.batch()
    reused = honest.announce(codec.encode_message(HONEST, SWARM, batch), batch, seq=first_seq)
    assert node.verifier.check_announcement(reused, HONEST.peer_id) is None
    assert node.verifier.rejections == {"replay": 1}
    assert not node.book.is_banned(HONEST.peer_id)  # anyone can write a signed record into the DHT


def test_an_older_announcement_read_after_a_newer_one_is_superseded_not_counted(
    node: Node, honest: Peer
) -> None:
    old_record, _ = honest.publish()
    new_record, _ = honest.publish()
    assert node.verifier.check_announcement(new_record, HONEST.peer_id) is not None
    # a lagging DHT replica (or a holder) passes on the author's previous announcement: not pulled,
    # not counted (a healthy swarm shows no rejections), the author not charged
    assert node.verifier.check_announcement(old_record, HONEST.peer_id) is None
    assert node.verifier.rejections == {}
    assert node.book.snapshot()["peers"][HONEST.peer_id]["strikes"] == 0


def test_a_batch_pulled_after_a_newer_one_of_its_author_is_still_accepted(node: Node, honest: Peer) -> None:
    (older_record, older_data), (newer_record, newer_data) = honest.publish(), honest.publish()
    older = node.verifier.check_announcement(older_record, HONEST.peer_id)
    newer = node.verifier.check_announcement(newer_record, HONEST.peer_id)
    assert older is not None and newer is not None
    # parallel pulls finish in any order: the older batch is verified and accepted like any other
    assert len(node.verifier.check_batch(newer, newer_data, HONEST.peer_id)) == 2
    assert len(node.verifier.check_batch(older, older_data, HONEST.peer_id)) == 2
    assert node.verifier.rejections == {}


def test_stale_announcement_and_batch(node: Node, honest: Peer) -> None:
    batch = honest.batch()
    data = codec.encode_message(HONEST, SWARM, batch)
    old = NOW - node.verifier.max_age_s - limits.MAX_CLOCK_SKEW_S - 1
    assert (
        node.verifier.check_announcement(honest.announce(data, batch, timestamp=old), HONEST.peer_id) is None
    )
    future = NOW + limits.MAX_CLOCK_SKEW_S + 1
    assert (
        node.verifier.check_announcement(honest.announce(data, batch, timestamp=future), HONEST.peer_id)
        is None
    )
    assert node.verifier.rejections == {"stale": 2}
    stale_batch = honest.batch(timestamp=old)
    assert deliver(node, honest, *honest.publish(stale_batch)) == []
    assert node.verifier.rejections == {"stale": 3}
    assert node.book.snapshot()["peers"][HONEST.peer_id]["strikes"] == 0  # clocks: not charged


def test_oversize_and_malformed_records(node: Node, honest: Peer) -> None:
    record, _ = honest.publish()
    v = node.verifier
    assert v.check_announcement(b"\x80" * (limits.MAX_RECORD_BYTES + 1), HONEST.peer_id) is None
    assert v.check_announcement(b"\xc1", HONEST.peer_id) is None  # never valid msgpack
    assert v.check_announcement(record[:-3], HONEST.peer_id) is None  # truncated
    assert v.check_announcement(record + b"\x00", HONEST.peer_id) is None  # trailing bytes
    assert v.check_announcement(None, HONEST.peer_id) is None  # type: ignore[arg-type]
    assert v.rejections == {"oversize": 1, "malformed": 4}
    assert len(node.book) == 0  # nobody charged or even tracked


def test_malformed_payload_charges_the_announcer(node: Node, hostile: Peer) -> None:
    batch = hostile.batch()
    garbage = b"\x92\x01"  # msgpack [1, ...] cut short
    assert deliver(node, hostile, hostile.announce(garbage, batch), garbage) == []
    assert node.verifier.rejections == {"malformed": 1}
    assert node.book.snapshot()["peers"][HOSTILE.peer_id]["strikes"] == 1


# --- poisoned content --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "task",
    [
        protocol.WireTask(
            "basic_arithmetic", {"min_terms": 5, "max_terms": 5}, seed=3, index=1
        ),  # not our config
        protocol.WireTask("basic_arithmetic", {}, seed=3, index=1),  # default config: not ours either
        protocol.WireTask("no_such_dataset", {}, seed=3, index=1),  # unknown dataset
        protocol.WireTask("bf", {}, seed=3, index=1),  # a real dataset outside our mix
        protocol.WireTask("propositional_logic", {}, seed=3, index=2**31),  # index out of range
        protocol.WireTask("propositional_logic", {}, seed=10_000_019, index=0),  # our held-out eval questions
    ],
    ids=["config", "default-config", "unknown", "not-in-mix", "index", "eval-seed"],
)
def test_tampered_task_ref_is_bad_task(node: Node, hostile: Peer, task: protocol.WireTask) -> None:
    batch = hostile.batch()
    batch = replace(batch, groups=(batch.groups[0], replace(batch.groups[1], task=task)))
    assert deliver(node, hostile, *hostile.publish(batch)) == []
    assert node.verifier.rejections == {"bad_task": 1}
    assert node.book.snapshot()["peers"][HOSTILE.peer_id]["strikes"] == 1
    assert node.verifier.accepted_groups == 0


def test_inflated_rewards_are_reward_mismatch_and_ban_after_the_strike_limit(
    node: Node, hostile: Peer
) -> None:
    def inflate(g: protocol.WireGroup) -> protocol.WireGroup:
        return replace(g, claimed_rewards=tuple(1.0 for _ in g.claimed_rewards))

    for i in range(node.book.strike_limit):
        assert not node.book.is_banned(HOSTILE.peer_id)
        assert deliver(node, hostile, *hostile.publish(with_groups(hostile.batch(), inflate))) == []
        assert node.verifier.rejections == {"reward_mismatch": i + 1}
    assert node.book.is_banned(HOSTILE.peer_id)
    assert node.book.bans()[0][3] == "reward_mismatch"
    assert deliver(node, hostile, *hostile.publish()) == []  # even its honest-looking batch
    assert node.verifier.rejections["banned"] == 1
    node.mono.t += 60.0  # the first ban lasts 60 s; then the peer is heard again
    assert deliver(node, hostile, *hostile.publish())


def test_small_claim_differences_within_tolerance_are_accepted(node: Node, honest: Peer) -> None:
    def nudge(g: protocol.WireGroup) -> protocol.WireGroup:
        return replace(g, claimed_rewards=tuple(r + 1e-4 for r in g.claimed_rewards))

    assert deliver(node, honest, *honest.publish(with_groups(honest.batch(), nudge)))


@pytest.mark.parametrize("bad", [0.5, -1000.0], ids=["positive", "implausible"])
def test_bad_logprobs_reject_the_batch(node: Node, hostile: Peer, bad: float) -> None:
    def poison(g: protocol.WireGroup) -> protocol.WireGroup:
        first = replace(g.completions[0], logprobs=(-0.5, bad, -0.125))
        return replace(g, completions=(first, *g.completions[1:]))

    assert deliver(node, hostile, *hostile.publish(with_groups(hostile.batch(), poison))) == []
    assert node.verifier.rejections == {"bad_logprobs": 1}


# --- floods and bans -----------------------------------------------------------------------------------


def test_flood_is_rate_limited_and_banned(node: Node, hostile: Peer) -> None:
    burst = node.book.burst
    published = [hostile.publish(hostile.batch(hostile.groups(1))) for _ in range(burst + 1)]
    results = [deliver(node, hostile, *p) for p in published]  # all at the same instant
    assert [bool(r) for r in results] == [True] * burst + [False]
    assert node.verifier.rejections == {"rate_limited": 1}
    assert node.book.is_banned(HOSTILE.peer_id) and node.book.bans()[0][3] == "rate_limited"


def test_ban_durations_grow_and_expire(node: Node, hostile: Peer, honest: Peer) -> None:
    def forge() -> None:
        batch = hostile.batch(hostile.groups(1))
        data = flip(codec.encode_message(HOSTILE, SWARM, batch), 10)
        assert deliver(node, hostile, hostile.announce(data, batch), data) == []

    for count, duration in enumerate((60.0, 120.0, 240.0), start=1):
        forge()
        assert node.book.bans() == [(HOSTILE.peer_id, duration, count, "bad_signature")]
        node.mono.t += duration - 1
        assert node.book.is_banned(HOSTILE.peer_id)
        node.mono.t += 1
        assert not node.book.is_banned(HOSTILE.peer_id)
    assert node.book.snapshot()["peers"][HOSTILE.peer_id]["bans"] == 3


def test_hostile_peer_changes_nothing_in_honest_data(node: Node, honest: Peer, hostile: Peer) -> None:
    """An honest peer interleaved with a hostile one that poisons, tampers, forges and replays."""
    poison_text = "<answer>POISON</answer>"

    def poison(g: protocol.WireGroup) -> protocol.WireGroup:  # plausible text that claims to be right
        completions = tuple(replace(c, text=poison_text) for c in g.completions)
        return replace(g, completions=completions, claimed_rewards=tuple(1.0 for _ in completions))

    def retask(g: protocol.WireGroup) -> protocol.WireGroup:
        return replace(g, task=replace(g.task, config={"min_terms": 9}))

    def reused_seq() -> tuple[bytes, bytes]:  # new bytes announced under its first seq, signed later
        batch = hostile.batch()
        data = codec.encode_message(HOSTILE, SWARM, batch)
        return hostile.announce(data, batch, seq=1), data

    attacks = [
        (hostile.publish(with_groups(hostile.batch(), poison)), HOSTILE.peer_id),
        (hostile.publish(with_groups(hostile.batch(), retask)), HOSTILE.peer_id),
        ((flip(honest.publish()[0], 40), b"x"), HONEST.peer_id),  # a forged record in the honest name
        (reused_seq(), HOSTILE.peer_id),
        (hostile.publish(with_groups(hostile.batch(), poison)), HOSTILE.peer_id),  # third strike
    ]
    for (record, data), subkey in attacks:
        node.mono.t += 5.0  # one round: within the honest rate (12 batches per minute)
        assert len(deliver(node, honest, *honest.publish())) == 2
        assert node.receive(record, data, subkey=subkey, stream_peer=HOSTILE.peer_id) == []
    assert node.book.is_banned(HOSTILE.peer_id) and not node.book.is_banned(HONEST.peer_id)
    assert node.verifier.rejections["reward_mismatch"] == 2
    assert node.verifier.rejections["bad_task"] == node.verifier.rejections["replay"] == 1
    assert len(node.accepted) == 2 * len(attacks) == node.verifier.accepted_groups
    assert all(g.provenance.producer == HONEST.peer_id for g in node.accepted)
    assert all(c.text != poison_text for g in node.accepted for c in g.completions)
    assert all(g.ref.config == node.verifier.bank.question(g.ref).ref.config for g in node.accepted)
    assert_labels(node.verifier)


def test_internal_errors_are_counted_logged_once_and_not_charged(
    node: Node, honest: Peer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(ref):
        raise RuntimeError("dataset generator crashed")

    monkeypatch.setattr(node.verifier.bank, "question", broken)
    with caplog.at_level(logging.DEBUG, logger="swarmnode.swarm.exchange.verify"):
        for _ in range(3):
            assert deliver(node, honest, *honest.publish()) == []
    assert node.verifier.rejections == {"internal_error": 3}
    assert sum(r.levelno >= logging.WARNING for r in caplog.records) == 1
    assert not node.book.is_banned(HONEST.peer_id)
    assert node.book.snapshot()["peers"][HONEST.peer_id]["strikes"] == 0


# --- reasons are metric labels -------------------------------------------------------------------------


def test_verify_reasons_are_new_prometheus_label_values() -> None:
    assert not set(VERIFY_REASONS) & set(limits.REJECT_REASONS)
    assert len(set(ALL_REASONS)) == len(ALL_REASONS)
    assert all(re.fullmatch(r"[a-z][a-z_]*", r) for r in ALL_REASONS)


# --- fuzz: nothing a peer sends makes the verifier raise ----------------------------------------------


@FUZZ
@given(record=st.binary(max_size=512), subkey=st.one_of(st.text(max_size=60), st.just(HONEST.peer_id)))
def test_random_records_never_raise(bank: TaskBank, record: bytes, subkey: str) -> None:
    node = Node(bank)
    assert node.verifier.check_announcement(record, subkey) is None
    assert sum(node.verifier.rejections.values()) == 1
    assert_labels(node.verifier)


@FUZZ
@given(data=st.binary(min_size=1, max_size=512), announced=st.booleans())
def test_random_payloads_never_raise(bank: TaskBank, data: bytes, announced: bool) -> None:
    node = Node(bank)
    announcement = protocol.BatchAnnouncement(
        peer_id=HOSTILE.peer_id,
        swarm_id=SWARM,
        round=1,
        policy_version=7,
        payload_sha256=limits.payload_digest(data) if announced else bytes(32),
        payload_len=len(data),
        n_groups=1,
        timestamp=NOW,
        seq=1,
    )
    assert node.verifier.check_batch(announcement, data, HOSTILE.peer_id) == []
    assert sum(node.verifier.rejections.values()) == 1
    assert_labels(node.verifier)


@pytest.fixture(scope="module")
def valid_message(peer_bank: TaskBank) -> tuple[protocol.RolloutBatch, bytes]:
    peer = Peer(HOSTILE, peer_bank)
    batch = peer.batch(peer.groups(1))
    return batch, codec.encode_message(HOSTILE, SWARM, batch)


@FUZZ
@given(data=st.data())
def test_mutated_valid_batches_are_rejected_without_raising(
    bank: TaskBank,
    peer_bank: TaskBank,
    valid_message: tuple[protocol.RolloutBatch, bytes],
    data: st.DataObject,
) -> None:
    batch, message = valid_message
    pos = data.draw(st.integers(0, len(message) - 1))
    value = data.draw(st.integers(0, 255).filter(lambda v: v != message[pos]))
    mutated = message[:pos] + bytes([value]) + message[pos + 1 :]
    node = Node(bank)
    record = Peer(HOSTILE, peer_bank).announce(mutated, batch)  # the announcer vouches for the bytes
    assert deliver(node, Peer(HOSTILE, peer_bank), record, mutated) == []
    assert sum(node.verifier.rejections.values()) == 1
    assert_labels(node.verifier)
