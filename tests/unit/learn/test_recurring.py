"""The recurring-span gate (learn/recurring.py): peer text that recurs across questions and that this node
never writes leaves the loss; its memory is bounded by what rounds train on.

The mechanics run on hand-made token ids; the learning test on the peaked tiny model of
test_peer_defence.py (its own samples likely under it, like a trained model's).
"""

from __future__ import annotations

import random

import pytest
import torch

from swarmnode.config import OffPolicyConfig
from swarmnode.learn.batch import TrainSequence, pad_batch
from swarmnode.learn.logprobs import completion_logprobs
from swarmnode.learn.recurring import OWN_ROUNDS, RECUR_QUESTIONS, SPANS, TAINT, RecurringSpans
from swarmnode.learn.trainer import Trainer
from swarmnode.prompts import encode_prompt
from swarmnode.rollouts import Provenance, RolloutGroup, TaskRef
from swarmnode.sampler.hf import HFSampler
from tests.unit.learn.test_peer_defence import TRAIN, _peaked_policy

PAYLOAD = (401, 402, 403, 404, 405)  # token ids no own completion below contains (the tiny vocab: 512)


def _group(source: str, producer: str, question: str) -> RolloutGroup:
    provenance = Provenance(source=source, producer=producer, policy_version=0, round=1)
    return RolloutGroup(
        TaskRef.make("basic_arithmetic", 0, 0), question, (), (0.0,), (0.0,), (False,), provenance
    )


def _seq(ids, source="peer", producer="p", question="q") -> TrainSequence:
    return TrainSequence((1, 2), tuple(ids), 1.0, None, _group(source, producer, question))


def _own(question="own") -> TrainSequence:
    return _seq((10, 11, 12, 13, 14, 15), source="local", producer="me", question=question)


def test_a_foreign_span_is_kept_on_fewer_questions_and_gated_from_the_one_that_makes_it_recur():
    gate = RecurringSpans()
    for k in range(RECUR_QUESTIONS - 1):  # on RECUR_QUESTIONS - 1 questions: trained
        assert not gate.gate([_own(), _seq((20 + k, *PAYLOAD, 30 + k), question=f"q{k}")])[1].gated
    far = tuple(range(100, 100 + TAINT + 4))  # words the node may write, near the payload and far from it
    out = gate.gate([_own(), _seq((*far, *PAYLOAD, *far), question="last")])
    start = len(far)
    # the payload and TAINT tokens either side of it (its sentence), nothing further
    assert out[1].gated == frozenset(range(start - TAINT, start + len(PAYLOAD) + TAINT))


def test_recurrence_is_counted_over_all_producers_and_the_same_question_counts_once():
    gate = RecurringSpans()
    same = [_seq(PAYLOAD, producer=f"sybil{i}", question="one question") for i in range(8)]
    assert not any(s.gated for s in gate.gate([_own(), *same]))  # eight producers, one question: kept
    sybils = [_seq(PAYLOAD, producer=f"sybil{i}", question=f"q{i}") for i in range(RECUR_QUESTIONS)]
    assert all(s.gated for s in gate.gate([_own(), *sybils])[1:])  # one question each, recurring together


def test_text_this_node_writes_itself_is_never_gated_however_often_peers_repeat_it():
    gate = RecurringSpans()
    own = _seq((7, 8, 9, *PAYLOAD), source="local", producer="me", question="own")
    peers = [_seq(PAYLOAD, question=f"q{i}") for i in range(10)]
    assert not any(s.gated for s in gate.gate([*peers], own_untrained=[own]))  # untrained own text counts
    for _ in range(OWN_ROUNDS - 1):  # and stays its own for OWN_ROUNDS rounds ...
        assert not any(s.gated for s in gate.gate([*peers]))
    assert all(s.gated for s in gate.gate([*peers]))  # ... then, unwritten since, it is foreign again


def test_words_of_the_question_itself_are_never_gated():
    """A peer that repeats the question's own words ("to 12 significant digits") across questions of a task
    this node has not sampled writes the task's text, not a payload (the cross-task case: a decimal
    specialist's completions read by a node that samples only integer arithmetic)."""
    gate = RecurringSpans()
    asked = [
        TrainSequence((7, *PAYLOAD, 8 + i), (*PAYLOAD, 30 + i), 1.0, None, _group("peer", "p", f"q{i}"))
        for i in range(RECUR_QUESTIONS)
    ]
    assert not any(s.gated for s in gate.gate([_own(), *asked]))


def test_a_foreign_span_is_remembered_for_good_and_the_memory_is_bounded_whatever_peers_send():
    """An attacker that spaces its payload out gets no second budget: 2 questions early, one 40 rounds later
    is gated. The memory keeps MAX_PEER_SPANS peer spans (the most recently seen) and OWN_ROUNDS rounds of
    own ones: a flood of new text every round leaves it flat at that bound, and what the flood pushes out
    is what was seen longest ago."""
    gate = RecurringSpans()
    for k in range(RECUR_QUESTIONS - 1):
        gate.gate([_own(), _seq((20 + k, *PAYLOAD), question=f"early{k}")])
    for _ in range(40):
        gate.gate([_own()])
    assert gate.gate([_own(), _seq(PAYLOAD, question="late")])[1].gated == frozenset(range(len(PAYLOAD)))

    cap, tokens, draw = 4096, 512, random.Random(0)
    gate = RecurringSpans(max_peer_spans=cap)
    for k in range(RECUR_QUESTIONS - 1):
        gate.gate([_seq((20 + k, *PAYLOAD), question=f"early{k}")])
    sizes = []
    for round_ in range(3 * OWN_ROUNDS):  # the worst case: every peer and own token new every round
        fresh = [draw.randrange(1000, 10**6) for _ in range(tokens)]
        own = [draw.randrange(1000, 10**6) for _ in range(tokens)]
        gate.gate([_seq(fresh, question=f"w{round_}"), _seq(own, source="local", question="own")])
        sizes.append(gate.size)
    assert max(sizes) <= cap + len(SPANS) * tokens * OWN_ROUNDS
    assert sizes[-1] < 1.01 * sizes[OWN_ROUNDS]  # flat once full
    # the flood pushed the payload's early questions out: it may train on RECUR_QUESTIONS - 1 again
    assert not gate.gate([_seq(PAYLOAD, question="after the flood")])[0].gated


def test_the_learner_keeps_gated_tokens_out_of_the_loss_and_counts_them():
    policy = _peaked_policy()
    trainer = Trainer(
        policy.model,
        policy.tokenizer.pad_token_id,
        TRAIN,
        offpolicy=OffPolicyConfig(peer_defence="recurring"),
    )
    trainer.recurring = RecurringSpans(taint=0)  # the payload's own tokens alone, to count them exactly
    own = [_seq((100 + i, 200 + i, 300 + i), source="local", question="own") for i in range(2)]
    own[1] = TrainSequence(own[1].prompt_ids, own[1].completion_ids, -1.0, None, own[1].group)
    peers = [_seq((50 + i, *PAYLOAD, 60 + i), question=f"q{i}") for i in range(RECUR_QUESTIONS)]
    stats = trainer.step([*own, *peers])
    assert stats.peer_gated_frac == pytest.approx(len(PAYLOAD) / (len(PAYLOAD) + 2))
    batch = pad_batch(trainer.recurring.gate(peers), policy.tokenizer.pad_token_id, torch.device("cpu"))
    assert batch.keep_mask is not None
    assert not batch.keep_mask[:, 1:-1].any() and batch.keep_mask[:, [0, -1]].all()


# ---------------------------------------------------------------------------------------------------
# learning: a fluent payload sent on a new question every step
# ---------------------------------------------------------------------------------------------------
LR = 1e-4
STEPS = 30


def _run(defence: str, payload: bool) -> tuple[list[float], list[float]]:
    """As test_peer_defence's ``_fluent_run``, but the peers (four identities) send on a new question each
    step, as an attacker does: the payload (a completion the model itself wrote, fluent by construction) at
    +1 with a fixed sibling at -1, or honest fresh samples. Returns (the payload's rise in nats per token
    after each step, the peer tokens gated each step)."""
    torch.manual_seed(0)
    policy = _peaked_policy()
    prompt = tuple(encode_prompt(policy.tokenizer, "What is 2 + 3?"))
    sampler = HFSampler(policy.model, policy.tokenizer)
    pair = sampler.sample([list(prompt)], 2, max_new_tokens=24, temperature=1.0, seed=3)[0]
    trainer = Trainer(
        policy.model,
        policy.tokenizer.pad_token_id,
        TRAIN.model_copy(update={"lr": LR}),
        offpolicy=OffPolicyConfig(peer_defence=defence),
    )
    fluent = pair[0].token_ids

    def logp() -> float:
        batch = pad_batch([_seq(fluent)], policy.tokenizer.pad_token_id, torch.device("cpu"))
        with torch.no_grad():
            return float(completion_logprobs(policy.model, batch, 1.0)[batch.completion_mask].mean())

    before, rise, gated = logp(), [], []
    for step in range(STEPS):
        fresh = sampler.sample([list(prompt)], 10, max_new_tokens=24, temperature=1.0, seed=100 + step)[0]
        signs = (-1.0, 1.0) * 5
        own_group = _group("local", "me", "own")
        own = [
            TrainSequence(prompt, c.token_ids, a, None, own_group)
            for c, a in zip(fresh[:8], signs[:8], strict=True)
        ]
        peer_group = _group("peer", f"sybil{step % 4}", f"question {step}")
        if payload:
            texts = [(fluent, 1.0), (pair[1].token_ids, -1.0)]
        else:
            texts = [(c.token_ids, a) for c, a in zip(fresh[8:], signs[8:], strict=True)]
        peer = [TrainSequence(prompt, ids, a, None, peer_group) for ids, a in texts]
        gated.append(trainer.step([*own, *peer]).peer_gated_frac)
        rise.append(logp() - before)
    return rise, gated


def test_a_fluent_payload_sent_on_new_questions_is_not_taught_past_its_first_questions():
    """The drift gate alone lets a fluent payload rise as far as the node's own text rises, step after step
    (bounded, not stopped: docs/poisoning.md, -3.49 -> -2.95 nats per token in 40 SmolLM2 rounds). Sent on
    a new question every step, it is gated from its RECUR_QUESTIONS-th question on: what its first
    RECUR_QUESTIONS - 1 steps taught is all it teaches (AdamW's momentum carries those on for a while:
    measured +0.21 after them, then a plateau at +0.59 against +1.31 and rising under the drift gate)."""
    drift, _ = _run("span_drift", payload=True)
    recurring, gated = _run("span_drift_recurring", payload=True)
    assert (
        min(gated[RECUR_QUESTIONS - 1 :]) >= 0.9
    )  # the payload and its sibling, nearly all, every later step
    assert recurring[-1] < drift[-1] / 2
    assert recurring[-1] - recurring[-6] < 0.02 < drift[-1] - drift[-6]  # a plateau; the other still rises


def test_an_honest_peer_of_the_same_model_is_hardly_gated():
    """Its honest cost: a peer sampling as this node does writes the words and pairs this node writes
    (measured: 2.4% of its tokens gated by this gate alone, 0.35% before the TAINT neighbourhood)."""
    _, gated = _run("recurring", payload=False)
    assert sum(gated) / len(gated) <= 0.05
