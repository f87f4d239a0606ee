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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmnode import protocol as P
from swarmnode.config import TasksConfig, TaskSpec
from swarmnode.identity import Identity
from swarmnode.peers import PeerBook
from swarmnode.rollouts import Completion, Provenance, RolloutGroup
from swarmnode.tasks import Question, TaskBank
from swarmnode.verify import ALL_REASONS, VERIFY_REASONS, Verifier

SWARM = "verify-test"
NOW = 1_767_225_600.0  # the receiver's wall clock (unix seconds)
MIX = {
    "basic_arithmetic": TaskSpec(config={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
    "propositional_logic": TaskSpec(),
}
FUZZ = settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))

HONEST = Identity.generate()
HOSTILE = Identity.generate()


class FakeClock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def bank() -> TaskBank:
    """The receiver's bank (format bonus 0.1)."""
    return TaskBank(TasksConfig(mix=MIX, format_reward=0.1, seed=1))


@pytest.fixture(scope="module")
def peer_bank() -> TaskBank:
    """The sender's bank: same mix, another format bonus (claims are task scores: they still agree)."""
    return TaskBank(TasksConfig(mix=MIX, format_reward=0.5, seed=2))


class Node:
    """The receiving side: a verifier with fake wall and monotonic clocks."""

    def __init__(self, bank: TaskBank, **book_kwargs):
        self.wall = FakeClock(NOW)
        self.mono = FakeClock(1000.0)
        self.book = PeerBook(self.mono, **book_kwargs)
        self.verifier = Verifier(bank, SWARM, self.book, clock=self.wall)
        self.accepted: list[RolloutGroup] = []

    def receive(self, record: bytes, data: bytes, *, subkey: str, stream_peer: str) -> list[RolloutGroup]:
        """What the swarm loop does: read the DHT record, pull the payload from the announcer, verify."""
        announcement = self.verifier.check_announcement(record, subkey)
        if announcement is None:
            return []
        groups = self.verifier.check_batch(announcement, data, stream_peer)
        self.accepted.extend(groups)
        return groups


def oracle(question: Question) -> str:
    """A correct answer (propositional_logic accepts the conjunction of its premises)."""
    if question.answer is not None:
        return question.answer
    return " ∧ ".join(f"({premise})" for premise in question.entry["metadata"]["premises"])


class Peer:
    """A sender: samples (scripted) completions, scores them with its own bank, signs and announces."""

    def __init__(self, identity: Identity, bank: TaskBank):
        self.identity = identity
        self.bank = bank
        self.seq = 0
        self.round = 0

    def groups(self, n: int = 2) -> list[RolloutGroup]:
        self.round += 1
        provenance = Provenance(
            source="local", producer=self.identity.peer_id, policy_version=7, round=self.round
        )
        out = []
        for ref in self.bank.draw(self.round, n):
            question = self.bank.question(ref)
            answer = oracle(question)
            texts = [
                f"Let me see.\n<answer>{answer}</answer>",
                "<answer></answer>",
                f"answer: {answer}",
                "no idea",
            ]
            completions = [
                Completion(text=t, token_ids=(3, 1, 4), logprobs=(-0.5, -1.25, -0.125)) for t in texts
            ]
            out.append(self.bank.score_group(question, completions, provenance))
        return out

    def batch(self, groups: list[RolloutGroup] | None = None, **changes) -> P.RolloutBatch:
        self.seq += 1
        batch = P.make_rollout_batch(
            groups if groups is not None else self.groups(),
            peer_id=self.identity.peer_id,
            swarm_id=SWARM,
            round=self.round,
            policy_version=7,
            model_name="tiny-llama",
            tokenizer_fingerprint="ab" * 32,
            timestamp=NOW - 1.0,
            seq=self.seq,
        )
        return replace(batch, **changes)

    def announce(self, data: bytes, batch: P.RolloutBatch, **changes) -> bytes:
        """The signed DHT record announcing ``data`` (which need not be ``batch``'s honest encoding)."""
        self.seq += 1
        announcement = P.BatchAnnouncement(
            peer_id=self.identity.peer_id,
            swarm_id=SWARM,
            round=batch.round,
            policy_version=batch.policy_version,
            payload_sha256=P.payload_digest(data),
            payload_len=len(data),
            n_groups=len(batch.groups),
            timestamp=NOW - 0.5,
            seq=self.seq,
        )
        return P.encode_message(self.identity, SWARM, replace(announcement, **changes))

    def publish(self, batch: P.RolloutBatch | None = None) -> tuple[bytes, bytes]:
        """(announcement record, payload bytes) of a validly signed batch."""
        batch = batch if batch is not None else self.batch()
        data = P.encode_message(self.identity, SWARM, batch)
        return self.announce(data, batch), data


def deliver(node: Node, peer: Peer, record: bytes, data: bytes) -> list[RolloutGroup]:
    pid = peer.identity.peer_id
    return node.receive(record, data, subkey=pid, stream_peer=pid)


def flip(data: bytes, pos: int) -> bytes:
    return data[:pos] + bytes([data[pos] ^ 0x01]) + data[pos + 1 :]


def signature_offset(message: bytes) -> int:
    """Where the 64-byte signature starts in an envelope (after "s" and a bin8 header of length 64)."""
    return message.rindex(b"\xa1s\xc4\x40") + 4


def with_groups(batch: P.RolloutBatch, change) -> P.RolloutBatch:
    return replace(batch, groups=tuple(change(g) for g in batch.groups))


def assert_labels(verifier: Verifier) -> None:
    assert set(verifier.rejections) <= set(ALL_REASONS)


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
        assert group.rewards[0] == pytest.approx(1.1) and group.task_scores[1] == 0.0
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
    assert node.verifier.already_accepted(P.payload_digest(data))


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
    data = P.encode_message(HOSTILE, SWARM, batch)
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
    announcement = P.decode_message(record, swarm_id=SWARM)[0]
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


def test_payload_served_by_another_peer_is_wrong_sender_and_bans_that_peer(node: Node, honest: Peer) -> None:
    record, data = honest.publish()
    assert node.receive(record, data, subkey=HONEST.peer_id, stream_peer=HOSTILE.peer_id) == []
    assert node.verifier.rejections == {"wrong_sender": 1}
    assert node.book.is_banned(HOSTILE.peer_id) and not node.book.is_banned(HONEST.peer_id)


def test_payload_that_differs_from_its_announcement_is_hash_mismatch(node: Node, hostile: Peer) -> None:
    record, data = hostile.publish()
    other = P.encode_message(HOSTILE, SWARM, hostile.batch())
    assert deliver(node, hostile, record, other) == []
    assert node.verifier.rejections == {"hash_mismatch": 1}
    assert node.book.snapshot()["peers"][HOSTILE.peer_id]["strikes"] == 1


# --- replay, staleness, malformed --------------------------------------------------------------------


def test_replayed_older_announcement_is_replay(node: Node, honest: Peer) -> None:
    old_record, _ = honest.publish()
    new_record, new_data = honest.publish()
    assert node.verifier.check_announcement(new_record, HONEST.peer_id) is not None
    assert node.verifier.check_announcement(old_record, HONEST.peer_id) is None
    assert node.verifier.rejections == {"replay": 1}
    assert not node.book.is_banned(HONEST.peer_id)  # anyone can write an old signed record back


def test_stale_announcement_and_batch(node: Node, honest: Peer) -> None:
    batch = honest.batch()
    data = P.encode_message(HONEST, SWARM, batch)
    old = NOW - node.verifier.max_age_s - P.MAX_CLOCK_SKEW_S - 1
    assert (
        node.verifier.check_announcement(honest.announce(data, batch, timestamp=old), HONEST.peer_id) is None
    )
    future = NOW + P.MAX_CLOCK_SKEW_S + 1
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
    assert v.check_announcement(b"\x80" * (P.MAX_RECORD_BYTES + 1), HONEST.peer_id) is None
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
        P.WireTask("basic_arithmetic", {"min_terms": 5, "max_terms": 5}, seed=3, index=1),  # not our config
        P.WireTask("basic_arithmetic", {}, seed=3, index=1),  # default config: not ours either
        P.WireTask("no_such_dataset", {}, seed=3, index=1),  # unknown dataset
        P.WireTask("bf", {}, seed=3, index=1),  # a real dataset outside our mix
        P.WireTask("propositional_logic", {}, seed=3, index=2**31),  # index out of range
        P.WireTask("propositional_logic", {}, seed=10_000_019, index=0),  # our held-out eval questions
    ],
    ids=["config", "default-config", "unknown", "not-in-mix", "index", "eval-seed"],
)
def test_tampered_task_ref_is_bad_task(node: Node, hostile: Peer, task: P.WireTask) -> None:
    batch = hostile.batch()
    batch = replace(batch, groups=(batch.groups[0], replace(batch.groups[1], task=task)))
    assert deliver(node, hostile, *hostile.publish(batch)) == []
    assert node.verifier.rejections == {"bad_task": 1}
    assert node.book.snapshot()["peers"][HOSTILE.peer_id]["strikes"] == 1
    assert node.verifier.accepted_groups == 0


def test_inflated_rewards_are_reward_mismatch_and_ban_after_the_strike_limit(
    node: Node, hostile: Peer
) -> None:
    def inflate(g: P.WireGroup) -> P.WireGroup:
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
    def nudge(g: P.WireGroup) -> P.WireGroup:
        return replace(g, claimed_rewards=tuple(r + 1e-4 for r in g.claimed_rewards))

    assert deliver(node, honest, *honest.publish(with_groups(honest.batch(), nudge)))


@pytest.mark.parametrize("bad", [0.5, -1000.0], ids=["positive", "implausible"])
def test_bad_logprobs_reject_the_batch(node: Node, hostile: Peer, bad: float) -> None:
    def poison(g: P.WireGroup) -> P.WireGroup:
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
        data = flip(P.encode_message(HOSTILE, SWARM, batch), 10)
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

    def poison(g: P.WireGroup) -> P.WireGroup:  # plausible text that claims to be right
        completions = tuple(replace(c, text=poison_text) for c in g.completions)
        return replace(g, completions=completions, claimed_rewards=tuple(1.0 for _ in completions))

    def retask(g: P.WireGroup) -> P.WireGroup:
        return replace(g, task=replace(g.task, config={"min_terms": 9}))

    old = hostile.publish()  # published first, replayed later
    attacks = [
        (hostile.publish(with_groups(hostile.batch(), poison)), HOSTILE.peer_id),
        (hostile.publish(with_groups(hostile.batch(), retask)), HOSTILE.peer_id),
        ((flip(honest.publish()[0], 40), b"x"), HONEST.peer_id),  # a forged record in the honest name
        (old, HOSTILE.peer_id),
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
    with caplog.at_level(logging.DEBUG, logger="swarmnode.verify"):
        for _ in range(3):
            assert deliver(node, honest, *honest.publish()) == []
    assert node.verifier.rejections == {"internal_error": 3}
    assert sum(r.levelno >= logging.WARNING for r in caplog.records) == 1
    assert not node.book.is_banned(HONEST.peer_id)
    assert node.book.snapshot()["peers"][HONEST.peer_id]["strikes"] == 0


# --- reasons are metric labels -------------------------------------------------------------------------


def test_verify_reasons_are_new_prometheus_label_values() -> None:
    assert not set(VERIFY_REASONS) & set(P.REJECT_REASONS)
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
    announcement = P.BatchAnnouncement(
        peer_id=HOSTILE.peer_id,
        swarm_id=SWARM,
        round=1,
        policy_version=7,
        payload_sha256=P.payload_digest(data) if announced else bytes(32),
        payload_len=len(data),
        n_groups=1,
        timestamp=NOW,
        seq=1,
    )
    assert node.verifier.check_batch(announcement, data, HOSTILE.peer_id) == []
    assert sum(node.verifier.rejections.values()) == 1
    assert_labels(node.verifier)


@pytest.fixture(scope="module")
def valid_message(peer_bank: TaskBank) -> tuple[P.RolloutBatch, bytes]:
    peer = Peer(HOSTILE, peer_bank)
    batch = peer.batch(peer.groups(1))
    return batch, P.encode_message(HOSTILE, SWARM, batch)


@FUZZ
@given(data=st.data())
def test_mutated_valid_batches_are_rejected_without_raising(
    bank: TaskBank, peer_bank: TaskBank, valid_message: tuple[P.RolloutBatch, bytes], data: st.DataObject
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
