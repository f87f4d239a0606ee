"""Fuzzing the verification pipeline: DHT announcement -> pulled payload -> decode -> task regeneration
-> local scoring, with a real task bank and real signatures.

Properties, for every input: the verifier never raises; each rejected input is counted exactly once under
a reason from ``verify.ALL_REASONS``, and never as ``internal_error`` (that counter is where an
unexpected exception would land, so fuzzing asserts it stays at zero); whatever is accepted carries
rewards this node computed itself from the completion text, never the claimed ones.

Three sources of inputs: signed structural mutants of a valid batch (the announcer vouches for the
mutated bytes, so every field check is reachable); batches built by a peer that scores its own random
completions honestly (acceptance paths with adversarial text); and random task references (regeneration
of arbitrary (dataset, seed, index) items).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarmnode.rollouts import Completion, Provenance
from swarmnode.swarm.exchange.verify import ALL_REASONS
from swarmnode.swarm.wire import codec, limits, protocol
from swarmnode.tasks import INDEX_LIMIT, SEED_LIMIT, TaskBank
from tests.helpers.mutations import fuzz_settings, note, sign_body, structural_mutant
from tests.helpers.verify_world import HOSTILE, MIX, SWARM, Node, Peer

PEER = HOSTILE.peer_id


@pytest.fixture(scope="module")
def valid(peer_bank: TaskBank) -> protocol.RolloutBatch:
    """An honest batch of two groups; mutants are announced with its round, version and group count."""
    peer = Peer(HOSTILE, peer_bank)
    return peer.batch(peer.groups(2))


def deliver(node: Node, peer: Peer, data: bytes, batch_like: protocol.RolloutBatch) -> list:
    """The swarm loop's path for one pulled payload that its announcer vouched for (signed sha256)."""
    record = peer.announce(data, batch_like)
    return node.receive(record, data, subkey=PEER, stream_peer=PEER)


def check_outcome(node: Node, bank: TaskBank, accepted: list) -> None:
    rejections = node.verifier.rejections
    assert set(rejections) <= set(ALL_REASONS), rejections
    assert rejections["internal_error"] == 0, "an exception escaped a check (see the log)"
    if not accepted:
        assert sum(rejections.values()) == 1, rejections
        note(f"reject: {next(iter(rejections))}")
        return
    assert sum(rejections.values()) == 0, rejections
    note("accept")
    for group in accepted:  # rewards are this node's own scores of the text, whatever was claimed
        question = bank.question(group.ref)
        assert group.rewards == tuple(bank.score(question, c.text)[0] for c in group.completions)
        assert group.provenance.producer == PEER and group.provenance.source == "peer"


@fuzz_settings()
@given(data=st.data())
def test_signed_mutants_of_a_valid_batch(bank, peer_bank, valid, data):
    body = data.draw(structural_mutant(valid.to_body()))
    payload = sign_body(HOSTILE, limits.ROLLOUT_BATCH, body, SWARM)
    node = Node(bank)
    check_outcome(node, bank, deliver(node, Peer(HOSTILE, peer_bank), payload, valid))


adversarial_text = (
    st.text(max_size=300)
    | st.builds(lambda a, b: f"{a}<answer>{b}</answer>", st.text(max_size=40), st.text(max_size=60))
    | st.sampled_from(["<answer>", "</answer><answer>", "answer is", "Answer: 1e999", "<answer>nan</answer>"])
    | st.integers().map(lambda n: f"<answer>{n}</answer>")
    | st.just("(P ∨ Q) ∧ ¬R " * 900)  # ~16 KiB: the text cap, through propositional_logic's parser
)


@fuzz_settings(scale=0.5)
@given(
    texts=st.lists(st.lists(adversarial_text, min_size=1, max_size=6), min_size=1, max_size=4),
    honest_claims=st.booleans(),
)
def test_batches_of_adversarial_completions(bank, peer_bank, texts, honest_claims):
    """A peer scores its own random completions (honestly or not) and sends them; the receiver accepts
    only what it scores the same, with its own rewards."""
    peer = Peer(HOSTILE, peer_bank)
    provenance = Provenance(source="local", producer=PEER, policy_version=7, round=1)
    groups = []
    for ref, group_texts in zip(peer_bank.draw(1, len(texts)), texts, strict=True):
        question = peer_bank.question(ref)
        completions = [Completion(text=t) for t in group_texts]
        group = peer_bank.score_group(question, completions, provenance)
        if not honest_claims:
            group = replace(group, task_scores=tuple(1.0 - s for s in group.task_scores))
        groups.append(group)
    batch = peer.batch(groups)
    node = Node(bank)
    check_outcome(node, bank, deliver(node, peer, codec.encode_message(HOSTILE, SWARM, batch), batch))


@fuzz_settings(scale=0.5)
@given(
    dataset=st.sampled_from([*MIX, "bf", "gsm_symbolic", "x" * 128]),
    seed=st.sampled_from([0, 1, SEED_LIMIT - 1, 2**62]) | st.integers(0, SEED_LIMIT - 1),
    index=st.sampled_from([0, INDEX_LIMIT - 1, INDEX_LIMIT, 2**63 - 1]) | st.integers(0, 2**63 - 1),
)
def test_random_task_refs_regenerate_or_are_bad_task(bank, peer_bank, valid, dataset, seed, index):
    """Any (dataset, seed, index) a peer names is regenerated here or refused as bad_task; none crashes."""
    body = valid.to_body()
    for group in body["groups"]:
        config = dict(MIX[dataset].config) if dataset in MIX else {}
        group["task"].update(dataset=dataset, config=config, seed=seed, index=index)
    payload = sign_body(HOSTILE, limits.ROLLOUT_BATCH, body, SWARM)
    node = Node(bank)
    accepted = deliver(node, Peer(HOSTILE, peer_bank), payload, valid)
    check_outcome(node, bank, accepted)
    if not accepted:  # a valid ref with claims computed for another question: reward_mismatch
        assert set(node.verifier.rejections) <= {"bad_task", "reward_mismatch", "over_limit", "bad_field"}
