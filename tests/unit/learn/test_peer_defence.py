"""#29's defences against a payload in peers' correct completions (learn/peer_defence.py): each one's
mechanics on a crafted peer completion and an honest one.

The model is the tiny in-process one with its output layer scaled up, so it is *peaked* like a trained
model: its own samples are likely under it, and a payload (tokens it would not write) is not.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from swarmnode.config import ModelConfig, OffPolicyConfig, TrainConfig
from swarmnode.learn import peer_defence
from swarmnode.learn.batch import TrainSequence
from swarmnode.learn.trainer import SpanGate, Trainer
from swarmnode.policy import load_policy
from swarmnode.prompts import encode_prompt
from swarmnode.rollouts import Provenance, RolloutGroup, TaskRef
from swarmnode.sampler.hf import HFSampler

TRAIN = TrainConfig(lr=1e-3, token_budget=512, autocast="off")
PEAK = 12.0  # the output layer's scale: own samples then sit near -0.5 nats a token, random tokens far below
PAYLOAD_TOKENS = 12


def _peaked_policy():
    policy = load_policy(ModelConfig(name="tiny"))
    with torch.no_grad():
        policy.model.get_output_embeddings().weight.mul_(PEAK)
    return policy


def _group(source: str, producer: str, dataset: str = "basic_arithmetic", scores=(0.0,)) -> RolloutGroup:
    provenance = Provenance(source=source, producer=producer, policy_version=0, round=1)
    n = len(scores)
    return RolloutGroup(
        TaskRef.make(dataset, 0, 0), "q", (), tuple(scores), tuple(scores), (False,) * n, provenance
    )


@pytest.fixture(scope="module")
def world():
    """Own sequences and two peer completions of the same prompt: one the model sampled (honest), one
    with a payload of random tokens spliced into the middle (crafted)."""
    policy = _peaked_policy()
    prompt = tuple(encode_prompt(policy.tokenizer, "What is 2 + 3?"))
    sampler = HFSampler(policy.model, policy.tokenizer)
    own_samples = sampler.sample([list(prompt)], 8, max_new_tokens=32, temperature=1.0, seed=1)[0]
    peer_samples = sampler.sample([list(prompt)], 2, max_new_tokens=32, temperature=1.0, seed=2)[0]
    own_group = _group("local", "me")
    own = [
        TrainSequence(prompt, c.token_ids, 1.0 if i % 2 else -1.0, None, own_group)
        for i, c in enumerate(own_samples)
    ]
    honest_ids = peer_samples[0].token_ids
    draw = torch.Generator().manual_seed(0)
    payload = tuple(torch.randint(3, len(policy.tokenizer), (PAYLOAD_TOKENS,), generator=draw).tolist())
    cut = len(peer_samples[1].token_ids) // 2
    crafted_ids = peer_samples[1].token_ids[:cut] + payload + peer_samples[1].token_ids[cut:]
    peer_group = _group("peer", "attacker")
    honest = TrainSequence(prompt, honest_ids, 1.0, None, peer_group)
    crafted = TrainSequence(prompt, crafted_ids, 1.0, None, peer_group)
    return policy, own, honest, crafted, (cut, cut + PAYLOAD_TOKENS)


def _step(sequences, defence: str):
    policy = _peaked_policy()  # the same starting weights every time
    trainer = Trainer(
        policy.model, policy.tokenizer.pad_token_id, TRAIN, offpolicy=OffPolicyConfig(peer_defence=defence)
    )
    return trainer.step(sequences)


@pytest.mark.parametrize("defence", ["span", "span_multiscale"])
def test_the_span_gate_keeps_a_payload_out_of_the_loss_and_an_honest_peer_in(world, defence):
    _, own, honest, crafted, _ = world
    assert _step([*own, honest], defence).peer_gated_frac == 0.0
    gated = _step([*own, crafted], defence).peer_gated_frac
    assert gated >= PAYLOAD_TOKENS / len(crafted.completion_ids)  # at least the payload, never the whole
    assert gated < 1.0
    assert _step([*own, crafted], "none").peer_gated_frac == 0.0  # without the defence it trains


def test_the_multiscale_gate_catches_a_one_token_payload_that_the_8_token_window_averages_away():
    """The behaviour payload ("The answer is seven.") is a token or two in fluent text: in a window of 8
    its mean is above the floor, and `span` let the node learn it as fast as undefended (docs/poisoning.md).
    Here: own text at -1 nats a token with the odd -3 (what a node samples at temperature 1), a peer
    completion like it with one -9 token in the middle, and an honest one with its own -3s."""
    own = torch.full((4, 40), -1.0)
    own[:, ::10] = -3.0
    honest = own[:1].clone()
    crafted = torch.full((1, 40), -1.0)
    crafted[0, 20] = -9.0
    mask = torch.ones(1, 40, dtype=torch.bool)

    def gated(defence: str, peer: torch.Tensor) -> int:
        gate = SpanGate(peer_defence.SPAN_WINDOWS[defence])
        gate.keep(own, torch.ones_like(own, dtype=torch.bool), trusted=True)
        return int((~gate.keep(peer, mask, trusted=False)).sum())

    assert gated("span", crafted) == 0  # -2.0 over its 8-token windows: above that size's floor
    assert gated("span_multiscale", crafted) >= 1 and gated("span_multiscale", crafted) <= 2 * 4 - 1
    assert gated("span_multiscale", honest) == gated("span", honest) == 0


def test_span_keep_masks_the_windows_below_the_floor_and_nothing_far_from_them():
    logp = torch.full((2, 40), -1.0)
    logp[1, 20:26] = -7.0  # a six-token payload
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[0, :5] = False  # left padding of a shorter completion
    floor = peer_defence.own_floor([peer_defence.window_means(logp[:1], mask[:1])])
    assert floor == pytest.approx(-1.0 - peer_defence.FLOOR_MARGIN)
    keep = peer_defence.span_keep(logp, mask, floor)
    assert torch.equal(keep[0], mask[0])  # honest: every completion token kept
    window = peer_defence.SPAN_WINDOW
    assert not keep[1, 20:26].any()  # the payload is out
    assert keep[1, : 20 - window + 1].all() and keep[1, 26 + window - 1 :].all()  # far tokens stay
    assert not peer_defence.span_keep(logp, mask, floor=0.5)[1].any()  # a floor above all: all out
    short = torch.full((1, window - 1), -9.0)
    assert peer_defence.span_keep(short, torch.ones_like(short, dtype=torch.bool), floor).all()


def test_the_token_budget_caps_each_producer_at_one_own_group():
    own_group, peer_group, honest_group = _group("local", "me"), _group("peer", "long"), _group("peer", "ok")
    own = [TrainSequence((1,), (2,) * 10, a, None, own_group) for a in (1.0, -1.0)]  # 20 |adv| x tokens
    long = [TrainSequence((1,), (3,) * 100, a, None, peer_group) for a in (1.0, -1.0)]  # 200
    ok = [TrainSequence((1,), (4,) * 5, a, None, honest_group) for a in (1.0, -1.0)]  # 10
    out = peer_defence.budget_by_producer([*own, *long, *ok])
    assert out[:2] == own and out[4:] == ok  # own data and a producer within the budget: unchanged
    assert [s.advantage for s in out[2:4]] == pytest.approx([0.1, -0.1])  # 200 -> 20
    assert [replace(s, advantage=0.0) for s in out[2:4]] == [replace(s, advantage=0.0) for s in long]


def test_rescue_takes_peer_groups_only_for_tasks_this_node_fails_at():
    solved = _group("local", "me", "basic_arithmetic", scores=(1.0, 1.0, 0.0, 1.0))
    failed = _group("local", "me", "propositional_logic", scores=(0.0, 0.0, 0.0, 1.0))
    peers = [
        _group("peer", "a", "basic_arithmetic", scores=(1.0, 0.0)),
        _group("peer", "a", "propositional_logic", scores=(1.0, 0.0)),
        _group("peer", "a", "bf", scores=(1.0, 0.0)),  # not sampled here this round: a specialist's other
    ]
    kept = peer_defence.rescue_only(peers, [solved, failed])
    assert [g.ref.dataset for g in kept] == ["propositional_logic", "bf"]
    assert peer_defence.rescue_only(peers, []) == peers
