"""What a receiver spends on a peer's batch and takes from it is bounded by its own config, not by the
wire maxima: token ids in range, completions per group and text per completion no more than it would
sample itself, scoring within a CPU/wall budget (an overrun is the sender's fault), and only audited
datasets in a swarm node's mix."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import pytest

from swarmnode.config import SamplingConfig, TasksConfig, TaskSpec
from swarmnode.errors import ConfigError
from swarmnode.identity import Identity
from swarmnode.rollouts import TaskRef
from swarmnode.swarm.exchange import standing
from swarmnode.swarm.exchange.peers import PeerBook
from swarmnode.swarm.exchange.verify import SCORE_BUDGET_CPU_S, TEXT_BYTES_PER_TOKEN, ReceiveLimits, Verifier
from swarmnode.swarm.wire import convert, limits, protocol
from swarmnode.tasks import TaskBank, answer_char_limit
from tests.helpers.verify_world import HOSTILE, SWARM, Node, Peer, deliver, with_groups

FINGERPRINT = "ab" * 32  # what verify_world's peers declare; here also the receiver's own
WORST_ANSWER_S = 0.05  # one answer's scoring cost at its cap, with room (the audit bounds it at 0.1 s)


def receiver(bank: TaskBank, **limits) -> Node:
    node = Node(bank)
    defaults = {"tokenizer_fingerprint": FINGERPRINT, "vocab_size": 512}
    node.verifier = Verifier(
        bank, SWARM, node.book, clock=node.wall, limits=ReceiveLimits(**{**defaults, **limits})
    )
    return node


def strikes(node: Node) -> float:
    return node.book.snapshot()["peers"][HOSTILE.peer_id]["strikes"]


def test_out_of_vocabulary_token_ids_are_rejected_counted_and_charged(
    bank: TaskBank, peer_bank: TaskBank
) -> None:
    """ids of 0xFFFFFFFF killed both nodes of the review (IndexError in the learner)."""
    node, hostile = receiver(bank), Peer(HOSTILE, peer_bank)

    def oov(g: protocol.WireGroup) -> protocol.WireGroup:
        first = replace(g.completions[0], token_ids=(0xFFFFFFFF, 1, 4))
        return replace(g, completions=(first, *g.completions[1:]))

    assert deliver(node, hostile, *hostile.publish(with_groups(hostile.batch(), oov))) == []
    assert node.verifier.rejections == {"bad_token_ids": 1} and strikes(node) == 1
    # a peer on another tokenizer: its ids mean nothing here and are never used, so they are not checked
    other = hostile.batch(tokenizer_fingerprint="cd" * 32)
    assert deliver(node, hostile, *hostile.publish(with_groups(other, oov)))


def test_groups_are_cut_to_what_the_receiver_samples_itself(bank: TaskBank, peer_bank: TaskBank) -> None:
    """The wire allows 64 completions of 16 KiB; a node with G = 2 and 16 new tokens takes no more than
    it samples itself: the first two completions of a group, and no group with a longer text. Honest
    peers with larger configs are not charged."""
    node, peer = receiver(bank, completions_per_group=2, text_bytes=64), Peer(HOSTILE, peer_bank)
    batch = peer.batch()  # two groups of four completions
    first, second = batch.groups
    long_text = replace(second.completions[0], text="x" * 65)
    too_long = replace(second, completions=(long_text, *second.completions[1:]))
    scored = []
    node.verifier.bank = _Counting(bank, scored)
    groups = deliver(node, peer, *peer.publish(replace(batch, groups=(first, too_long))))
    assert [g.ref for g in groups] == [convert.task_from_wire(first.task)]
    assert [c.text for c in groups[0].completions] == [c.text for c in first.completions[:2]]
    assert node.verifier.rejections == {"over_cap": 1}
    assert strikes(node) == 0 and len(scored) == 2  # the cut completions and the dropped group: unscored


class _Counting:
    """A task bank that counts the completions it scores."""

    def __init__(self, bank: TaskBank, log: list):
        self._bank, self._log = bank, log

    def score_group(self, question, completions, provenance, **kw):
        self._log.extend(completions)
        return self._bank.score_group(question, completions, provenance, **kw)

    def __getattr__(self, name):
        return getattr(self._bank, name)


def _worst_case_batch(peer: Peer, bank: TaskBank, groups: int, completions: int) -> protocol.RolloutBatch:
    """propositional_logic answers at their length cap that cost its parser the most, honestly claimed."""
    answer = ("P ∧ " * 64)[: answer_char_limit("propositional_logic") - 1] + "P"
    text = f"<answer>{answer}</answer>"
    wire_groups = []
    for i in range(groups):
        ref = TaskRef.make("propositional_logic", 900 + i, i)
        score = bank.score(bank.question(ref), text)[1]
        wire_groups.append(
            protocol.WireGroup(
                task=convert.task_to_wire(ref),
                completions=tuple(protocol.WireCompletion(text=text, n_tokens=0) for _ in range(completions)),
                claimed_rewards=(score,) * completions,
            )
        )
    return replace(peer.batch(), groups=tuple(wire_groups))


def test_a_batch_of_worst_case_answers_costs_at_most_the_budget_and_strikes(
    bank: TaskBank, peer_bank: TaskBank
) -> None:
    """The review's 4 MiB batch cost ~1 CPU-hour to score. Now scoring stops at the budget (default 2 s
    of CPU), the batch is rejected and the sender struck."""
    node, hostile = receiver(bank, score_wall_s=60.0), Peer(HOSTILE, peer_bank)  # the CPU budget decides
    batch = _worst_case_batch(
        hostile, peer_bank, limits.MAX_GROUPS_PER_BATCH, limits.MAX_COMPLETIONS_PER_GROUP
    )
    record, data = hostile.publish(batch)
    t0 = time.thread_time()
    assert deliver(node, hostile, record, data) == []
    spent = time.thread_time() - t0
    print(
        f"\nworst-case batch, {len(data)} bytes: {spent:.2f} s CPU to reject (budget {SCORE_BUDGET_CPU_S} s)"
    )
    assert node.verifier.rejections == {"over_budget": 1} and strikes(node) == 1
    assert spent <= SCORE_BUDGET_CPU_S + WORST_ANSWER_S + 0.3  # + decoding and signature checks


def test_an_honest_batch_within_the_budget_is_accepted(bank: TaskBank, peer_bank: TaskBank) -> None:
    node, peer = receiver(bank, score_cpu_s=5.0), Peer(HOSTILE, peer_bank)
    batch = _worst_case_batch(peer, peer_bank, 4, 4)
    assert len(deliver(node, peer, *peer.publish(batch))) == 4


def test_a_wall_clock_overrun_alone_is_our_load_and_charges_nobody(
    bank: TaskBank, peer_bank: TaskBank, monkeypatch
) -> None:
    node, peer = receiver(bank, score_wall_s=1.0), Peer(HOSTILE, peer_bank)
    ticks = iter(range(0, 10_000, 5))
    monkeypatch.setattr(node.verifier, "monotonic", lambda: float(next(ticks)))  # 5 s per look: a busy host
    assert deliver(node, peer, *peer.publish()) == []
    assert node.verifier.rejections == {"over_budget": 1} and strikes(node) == 0


def test_swarm_mode_accepts_only_audited_datasets() -> None:
    bank = TaskBank(TasksConfig(mix={"leg_counting": TaskSpec(), "basic_arithmetic": TaskSpec()}, seed=1))
    with pytest.raises(ConfigError, match="tasks.mix.leg_counting.*audited"):
        Verifier(bank, SWARM, PeerBook())


@pytest.mark.parametrize(
    "sampling, field",
    [
        (
            SamplingConfig(completions_per_question=limits.MAX_COMPLETIONS_PER_GROUP + 1),
            "completions_per_question",
        ),
        (SamplingConfig(questions_per_round=limits.MAX_GROUPS_PER_BATCH + 1), "questions_per_round"),
        (SamplingConfig(max_new_tokens=limits.MAX_COMPLETION_TOKENS + 1), "max_new_tokens"),
    ],
)
def test_own_config_beyond_the_wire_limits_is_refused_at_start(sampling: SamplingConfig, field: str) -> None:
    """Such a config used to crash publish() every round."""
    with pytest.raises(ConfigError, match=f"sampling.{field}"):
        ReceiveLimits.for_node(sampling, tokenizer_fingerprint="", vocab_size=512)


def test_limits_follow_the_receivers_own_config() -> None:
    own = ReceiveLimits.for_node(
        SamplingConfig(completions_per_question=6, max_new_tokens=32),
        tokenizer_fingerprint="ab",
        vocab_size=9,
    )
    assert own.completions_per_group == 6 and own.text_bytes == 32 * TEXT_BYTES_PER_TOKEN
    big = ReceiveLimits.for_node(SamplingConfig(max_new_tokens=4096), tokenizer_fingerprint="", vocab_size=9)
    assert big.text_bytes == limits.MAX_COMPLETION_TEXT_BYTES


def test_attacker_chosen_subkeys_are_logged_escaped(bank: TaskBank, caplog: pytest.LogCaptureFixture) -> None:
    """A DHT subkey is any string anyone wrote: printed raw, it could forge log lines or drive a terminal."""
    node = receiver(bank)
    evil = "12D3KooW\x1b[2J\nINFO banned peer 12D3KooWhonest"
    with caplog.at_level(logging.DEBUG, logger="swarmnode.swarm.exchange.verify"):
        assert node.verifier.check_announcement(b"\xc1", evil) is None
    assert caplog.records and "\x1b" not in caplog.text and "\nINFO banned" not in caplog.text


def test_scoring_cpu_for_peers_without_standing_is_bounded_whatever_their_number(
    bank: TaskBank, peer_bank: TaskBank, monkeypatch
) -> None:
    """The per-batch budget is per identity: k fresh identities each sending a worst-case batch cost k
    budgets (the outside attacker: one such batch every 2 s saturates the verifier thread). Together they
    get the probation share of the scoring CPU: its capacity and refill, however many they are."""
    monkeypatch.setitem(standing._SHARES, False, (standing.PROBATION_SCORE_CPU_PER_S, 1.0))
    node = receiver(bank, score_wall_s=60.0)
    node.verifier.scoring = standing.ScoringBudget(node.book.has_standing)
    senders = [Peer(Identity.generate(), peer_bank) for _ in range(6)]
    t0, started = time.thread_time(), time.monotonic()
    for sender in senders:
        batch = _worst_case_batch(sender, peer_bank, 16, limits.MAX_COMPLETIONS_PER_GROUP)
        assert deliver(node, sender, *sender.publish(batch)) == []
    spent, elapsed = time.thread_time() - t0, time.monotonic() - started
    refill = standing.PROBATION_SCORE_CPU_PER_S * elapsed
    print(
        f"\n{len(senders)} worst-case batches, fresh identities: {spent:.2f} s CPU ({refill:.2f} s refilled)"
    )
    assert node.verifier.rejections == {"over_budget": len(senders)}
    # the share's capacity and what it refilled meanwhile, one answer per batch, decoding and signatures
    assert spent <= 1.0 + refill + len(senders) * (WORST_ANSWER_S + 0.15)
