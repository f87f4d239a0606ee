"""A receiving node and scripted sending peers around a real Verifier: real reasoning-gym tasks, real
Ed25519 identities, real encoded messages, fake clocks. Shared by the verifier's unit and fuzz tests;
its ``bank`` and ``peer_bank`` fixtures are registered for the whole suite by tests/conftest.py (a test
module that needs another bank defines its own fixture of that name)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, settings

from swarmnode.config import TasksConfig, TaskSpec
from swarmnode.identity import Identity
from swarmnode.rollouts import Completion, Provenance, RolloutGroup
from swarmnode.swarm.exchange.peers import PeerBook
from swarmnode.swarm.exchange.verify import ALL_REASONS, Verifier
from swarmnode.swarm.wire import codec, convert, limits, protocol
from swarmnode.tasks import Question, TaskBank
from tests.helpers import oracles
from tests.helpers.clocks import FakeClock

SWARM = "verify-test"
NOW = 1_767_225_600.0  # the receiver's wall clock (unix seconds)
MIX = {
    "basic_arithmetic": TaskSpec(config={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
    "propositional_logic": TaskSpec(),
}
FUZZ = settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))

HONEST = Identity.generate()
HOSTILE = Identity.generate()


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


def oracle(question: Question, bank: TaskBank) -> str:
    """A correct answer (``tests.helpers.oracles``), or for the few propositional_logic items that have
    none a restated premise (a wrong answer)."""
    return oracles.oracle(question, bank) or question.entry["metadata"]["premises"][0]


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
            answer = oracle(question, self.bank)
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

    def signed_at(self) -> float:
        """A later time for each later seq, as for an honest sender (all within a second before NOW)."""
        return NOW - 1.0 + self.seq * 1e-4

    def batch(self, groups: list[RolloutGroup] | None = None, **changes) -> protocol.RolloutBatch:
        self.seq += 1
        batch = convert.make_rollout_batch(
            groups if groups is not None else self.groups(),
            peer_id=self.identity.peer_id,
            swarm_id=SWARM,
            round=self.round,
            policy_version=7,
            model_name="tiny-llama",
            tokenizer_fingerprint="ab" * 32,
            timestamp=self.signed_at(),
            seq=self.seq,
        )
        return replace(batch, **changes)

    def announce(self, data: bytes, batch: protocol.RolloutBatch, **changes) -> bytes:
        """The signed DHT record announcing ``data`` (which need not be ``batch``'s honest encoding)."""
        self.seq += 1
        announcement = protocol.BatchAnnouncement(
            peer_id=self.identity.peer_id,
            swarm_id=SWARM,
            round=batch.round,
            policy_version=batch.policy_version,
            payload_sha256=limits.payload_digest(data),
            payload_len=len(data),
            n_groups=len(batch.groups),
            timestamp=self.signed_at(),
            seq=self.seq,
        )
        return codec.encode_message(self.identity, SWARM, replace(announcement, **changes))

    def publish(self, batch: protocol.RolloutBatch | None = None) -> tuple[bytes, bytes]:
        """(announcement record, payload bytes) of a validly signed batch."""
        batch = batch if batch is not None else self.batch()
        data = codec.encode_message(self.identity, SWARM, batch)
        return self.announce(data, batch), data


def deliver(node: Node, peer: Peer, record: bytes, data: bytes) -> list[RolloutGroup]:
    pid = peer.identity.peer_id
    return node.receive(record, data, subkey=pid, stream_peer=pid)


def flip(data: bytes, pos: int) -> bytes:
    return data[:pos] + bytes([data[pos] ^ 0x01]) + data[pos + 1 :]


def signature_offset(message: bytes) -> int:
    """Where the 64-byte signature starts in an envelope (after "s" and a bin8 header of length 64)."""
    return message.rindex(b"\xa1s\xc4\x40") + 4


def with_groups(batch: protocol.RolloutBatch, change) -> protocol.RolloutBatch:
    return replace(batch, groups=tuple(change(g) for g in batch.groups))


def assert_labels(verifier: Verifier) -> None:
    assert set(verifier.rejections) <= set(ALL_REASONS)


@pytest.fixture(scope="module")
def bank() -> TaskBank:
    """The receiver's bank (format bonus 0.1)."""
    return TaskBank(TasksConfig(mix=MIX, format_reward=0.1, seed=1))


@pytest.fixture(scope="module")
def peer_bank() -> TaskBank:
    """The sender's bank: same mix, another format bonus (claims are task scores: they still agree)."""
    return TaskBank(TasksConfig(mix=MIX, format_reward=0.5, seed=2))
