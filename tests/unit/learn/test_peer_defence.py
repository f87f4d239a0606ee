"""#29's defences against a payload in peers' correct completions (learn/peer_defence.py): each one's
mechanics on a crafted peer completion and an honest one.

The model is the tiny in-process one with its output layer scaled up, so it is *peaked* like a trained
model: its own samples are likely under it, and a payload (tokens it would not write) is not.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from swarmnode.config import (
    ModelConfig,
    NodeConfig,
    OffPolicyConfig,
    SamplingConfig,
    TasksConfig,
    TrainConfig,
)
from swarmnode.learn import peer_defence
from swarmnode.learn.batch import TrainSequence, pad_batch
from swarmnode.learn.logprobs import completion_logprobs
from swarmnode.learn.trainer import SpanGate, Trainer
from swarmnode.policy import load_policy
from swarmnode.prompts import encode_prompt
from swarmnode.rollouts import Completion, Provenance, RolloutGroup, TaskRef
from swarmnode.rounds import RoundContext, run_round
from swarmnode.sampler.hf import HFSampler
from swarmnode.tasks import TaskBank

TRAIN = TrainConfig(lr=1e-3, token_budget=512, autocast="off")
PEAK = 12.0  # the output layer's scale: own samples then sit near -0.5 nats a token, random tokens far below
PAYLOAD_TOKENS = 12
TRAINED_PEAK = 30.0  # own samples at about -1.5 nats a token, like SmolLM2's own text (-0.6 to -1.2)
PAYLOAD_LOGP = -10.0  # about SmolLM2's log-prob of a payload word before an attack (docs/poisoning.md)


def _peaked_policy(peak: float = PEAK):
    policy = load_policy(ModelConfig(name="tiny"))
    with torch.no_grad():
        policy.model.get_output_embeddings().weight.mul_(peak)
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
        gate = SpanGate(peer_defence.WINDOW_GATES[defence]["likelihood"])
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


# ---------------------------------------------------------------------------------------------------
# floors in a round whose own groups are all zero-advantage
# ---------------------------------------------------------------------------------------------------
class _SplitScores(TaskBank):
    """The task bank, with every own group's rewards split 0, 1, 0, 1, ...: the random model's groups
    become informative without changing a completion."""

    def score_group(self, *args, **kwargs) -> RolloutGroup:
        group = super().score_group(*args, **kwargs)
        return replace(group, rewards=tuple(float(i % 2) for i in range(len(group.rewards))))


def _crafted_peer_group(policy, local: list[RolloutGroup], payload_len: int) -> RolloutGroup:
    """A peer group on this node's first question: one of this node's own completions verbatim (reward 0)
    and the same completion with a payload spliced into its middle (reward 1): ``payload_len`` tokens,
    each the likeliest token below PAYLOAD_LOGP there whose text re-tokenizes to exactly these ids."""
    tokenizer = policy.tokenizer

    def tokens(text: str) -> tuple[int, ...]:
        return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])

    own = next(c for c in local[0].completions if tokens(c.text) == tuple(c.token_ids))
    head, tail = own.token_ids[: len(own.token_ids) // 2], own.token_ids[len(own.token_ids) // 2 :]
    prompt = tuple(encode_prompt(tokenizer, local[0].question))
    payload: tuple[int, ...] = ()
    for _ in range(payload_len):
        with torch.no_grad():
            logits = policy.model(torch.tensor([prompt + head + payload])).logits[0, -1]
        payload += (
            next(
                t
                for t in logits.argsort(descending=True).tolist()
                if torch.log_softmax(logits, -1)[t] < PAYLOAD_LOGP
                if t not in tokenizer.all_special_ids
                and tokens(tokenizer.decode(head + payload + (t,) + tail)) == head + payload + (t,) + tail
            ),
        )
    crafted_ids = head + payload + tail
    crafted = Completion(tokenizer.decode(crafted_ids), crafted_ids, None, finished=False)
    honest = Completion(own.text, own.token_ids, None, finished=False)
    provenance = Provenance(
        source="peer", producer="attacker", policy_version=0, round=1,
        tokenizer_fingerprint=policy.tokenizer_fingerprint,
    )  # fmt: skip
    return RolloutGroup(
        local[0].ref, local[0].question, (honest, crafted), (0.0, 1.0), (0.0, 1.0), (True, True), provenance
    )


def _gated_in_a_round(own_informative: bool, payload_len: int) -> float:
    """One round of the default defence on the peaked tiny model: the share of peer tokens gated."""
    cfg = NodeConfig(
        model=ModelConfig(name="tiny"),
        tasks=TasksConfig(mix={"basic_arithmetic": {}}),
        sampling=SamplingConfig(questions_per_round=2, completions_per_question=4, max_new_tokens=24),
        train=TRAIN,
    )
    policy = _peaked_policy(TRAINED_PEAK)
    bank = (_SplitScores if own_informative else TaskBank)(cfg.tasks, default_seed=0)
    seen: list[list[RolloutGroup]] = []

    def exchange(_round: int, local: list[RolloutGroup]) -> list[RolloutGroup]:
        seen.append(local)
        return [_crafted_peer_group(policy, local, payload_len)]

    ctx = RoundContext(
        cfg=cfg,
        policy=policy,
        bank=bank,
        sampler=HFSampler(policy.model, policy.tokenizer),
        trainer=Trainer(policy.model, policy.tokenizer.pad_token_id, cfg.train, offpolicy=cfg.offpolicy),
        peer_id="me",
        exchange=exchange,
    )
    record = run_round(ctx, 1)
    assert all(g.informative == own_informative for g in seen[0])
    return record.train.peer_gated_frac


@pytest.mark.parametrize("payload_len", [1, 3])
def test_a_round_without_an_informative_own_group_gates_a_payload_as_one_with_them(payload_len):
    """Zero-advantage groups never train, but they are this node's own text all the same: the floors come
    from every own completion of the round, so a round whose own groups all scored alike (a random model
    earns nothing; a trained one solves everything) judges peer text as strictly as any other."""
    assert OffPolicyConfig().peer_defence == "span_drift"
    reference = _gated_in_a_round(own_informative=True, payload_len=payload_len)
    assert reference > 0.0  # the payload is gated where own groups train
    assert _gated_in_a_round(own_informative=False, payload_len=payload_len) == pytest.approx(reference)


def test_a_step_without_own_windows_gates_with_the_last_floors_measured():
    """A size with no own window this step (no own completion, or none that long) takes the floor last
    measured at that size; only a node that never had an own window falls back to FLOOR_WITHOUT_OWN, at
    SPAN_WINDOW alone."""
    windows = peer_defence.MULTISCALE
    own = torch.full((4, 40), -1.0)
    own[:, ::10] = -3.0
    crafted = torch.full((1, 40), -1.0)
    crafted[0, 20] = -9.0  # one odd token: only the short windows see it
    mask = torch.ones(1, 40, dtype=torch.bool)

    with_own = SpanGate(windows)
    with_own.keep(own, torch.ones_like(own, dtype=torch.bool), trusted=True)
    gated = int((~with_own.keep(crafted, mask, trusted=False)).sum())
    assert gated >= 1 and set(with_own.measured()) == set(windows)

    carried = SpanGate(windows, carried=with_own.measured())
    assert int((~carried.keep(crafted, mask, trusted=False)).sum()) == gated
    assert carried.floors == with_own.floors and carried.measured() == {}  # nothing new to carry

    never = SpanGate(windows)
    assert int((~never.keep(crafted, mask, trusted=False)).sum()) == 0
    assert never.floors == {
        1: None,
        2: None,
        4: None,
        peer_defence.SPAN_WINDOW: peer_defence.FLOOR_WITHOUT_OWN,
    }


def test_the_trainer_reads_floor_only_text_when_peers_are_there_and_carries_its_floors_on(world):
    """Floor-only own text sets the floors as if it trained, but is read only when there is peer text to
    judge; each step's floors are kept for a step without own text."""
    _, own, honest, _, _ = world
    untrained = [replace(s, advantage=0.0) for s in own[2:]]

    def floors(sequences, floor_only=()) -> dict[int, float]:
        policy = _peaked_policy()  # the same starting weights every time
        trainer = Trainer(policy.model, policy.tokenizer.pad_token_id, TRAIN)
        trainer.step(sequences, floor_only=floor_only)
        return trainer.span_floors["likelihood"]

    all_own = floors([*own, honest])
    assert set(all_own) == set(peer_defence.MULTISCALE)
    assert floors([*own[:2], honest], untrained) == pytest.approx(all_own)
    assert floors(own[:2], untrained) == floors(own[:2]) != pytest.approx(all_own)  # no peer: no pass

    policy = _peaked_policy()
    trainer = Trainer(policy.model, policy.tokenizer.pad_token_id, TRAIN)
    trainer.span_floors = {"likelihood": {1: 0.0}}  # as if measured: every log-prob is below 0: all gated
    assert trainer.step([honest]).peer_gated_frac == 1.0


# ---------------------------------------------------------------------------------------------------
# fluent payloads: text the node would write anyway, taught step after step
# ---------------------------------------------------------------------------------------------------
FLUENT_LR = 1e-4
FLUENT_STEPS = 30


def _fluent_run(defence: str, payload: bool, steps: int = FLUENT_STEPS) -> tuple[float, float, list[float]]:
    """Steps of the peaked tiny model, as rounds run them: every step its own fresh samples (rewards split
    half and half) and a peer pair, either one fixed completion the model itself wrote (the payload: fluent
    by construction, so no likelihood floor gates it) at advantage +1 with a fixed sibling at -1, or an
    honest peer's fresh samples of the same kind. Returns (the payload's log-prob per token before, after,
    the peer tokens gated each step)."""
    torch.manual_seed(0)
    policy = _peaked_policy()
    prompt = tuple(encode_prompt(policy.tokenizer, "What is 2 + 3?"))
    sampler = HFSampler(policy.model, policy.tokenizer)
    pair = sampler.sample([list(prompt)], 2, max_new_tokens=24, temperature=1.0, seed=3)[0]
    own_group, peer_group = _group("local", "me"), _group("peer", "attacker")
    fluent = TrainSequence(prompt, pair[0].token_ids, 1.0, None, peer_group)
    train = TRAIN.model_copy(update={"lr": FLUENT_LR})
    trainer = Trainer(
        policy.model, policy.tokenizer.pad_token_id, train, offpolicy=OffPolicyConfig(peer_defence=defence)
    )

    def logp() -> float:
        batch = pad_batch([fluent], policy.tokenizer.pad_token_id, torch.device("cpu"))
        with torch.no_grad():
            return float(completion_logprobs(policy.model, batch, 1.0)[batch.completion_mask].mean())

    before, gated = logp(), []
    for step in range(steps):
        fresh = sampler.sample([list(prompt)], 10, max_new_tokens=24, temperature=1.0, seed=100 + step)[0]
        signs = (-1.0, 1.0) * 5
        own = [
            TrainSequence(prompt, c.token_ids, a, None, own_group)
            for c, a in zip(fresh[:8], signs[:8], strict=True)
        ]
        if payload:
            peer = [fluent, TrainSequence(prompt, pair[1].token_ids, -1.0, None, peer_group)]
        else:
            peer = [
                TrainSequence(prompt, c.token_ids, a, None, peer_group)
                for c, a in zip(fresh[8:], signs[8:], strict=True)
            ]
        gated.append(trainer.step([*own, *peer]).peer_gated_frac)
    return before, logp(), gated


def test_a_fluent_payload_rises_no_further_than_the_nodes_own_text():
    """The likelihood gates judge how likely peer text is *now*; a payload worded as ordinary text passes
    them every round and is taught round after round (docs/poisoning.md: a polite request for a password,
    -3.25 -> -0.16 nats per token in 25 rounds of SmolLM2, 0% of it gated). The drift gate judges how far
    peer text has risen since the base model against how far the node's own fresh text has: the same
    payload, repeated every step, stops where the node's own drift does."""
    before, after_likelihood, gated = _fluent_run("span_multiscale", payload=True)
    assert gated[0] == 0.0  # fluent: the likelihood floors keep every payload token at first
    before_drift, after_drift, _ = _fluent_run("span_drift", payload=True)
    assert before_drift == before
    taught, bounded = after_likelihood - before, after_drift - before
    assert taught > 3.0  # the likelihood gates let it be learned (measured: -5.6 -> -0.6)
    assert bounded < taught / 2  # the drift gate holds it near the node's own drift (measured: +2.4)


def test_the_drift_gate_keeps_an_honest_peer_that_drifts_as_this_node_does():
    """Its honest cost: a peer that samples as this node does rises as this node does, and the drift gate
    keeps nearly all of it (the ceiling is the own windows' 90% quantile plus DRIFT_MARGIN; measured over
    30 steps: 6.3% of honest peer tokens gated with both gates, 1.2% with the likelihood gates alone)."""
    _, _, gated = _fluent_run("span_drift", payload=False, steps=FLUENT_STEPS // 2)
    assert sum(gated) / len(gated) <= 0.12


def test_the_trainer_keeps_the_starting_weights_for_the_drift_gate_and_only_for_it(world):
    policy = _peaked_policy()
    trainer = Trainer(policy.model, policy.tokenizer.pad_token_id, TRAIN)  # the default: span_drift
    assert trainer.base_model is not None and trainer.base_model is not policy.model
    start = [p.clone() for p in trainer.base_model.parameters()]
    _, own, honest, _, _ = world
    trainer.step([*own, honest])
    assert all(torch.equal(a, b) for a, b in zip(start, trainer.base_model.parameters(), strict=True))
    assert not any(p.requires_grad for p in trainer.base_model.parameters())
    plain = Trainer(policy.model, 0, TRAIN, offpolicy=OffPolicyConfig(peer_defence="span_multiscale"))
    assert plain.base_model is None


def test_a_step_without_peer_text_spends_no_base_model_pass(world):
    """The drift gate's base-model pass is a forward pass over the step: a solo step skips it (no drift
    ceilings measured), a step with peer text takes it."""
    _, own, honest, _, _ = world
    policy = _peaked_policy()
    trainer = Trainer(policy.model, policy.tokenizer.pad_token_id, TRAIN)  # the default: span_drift
    trainer.step(own)
    assert "drift" not in trainer.span_floors and "likelihood" in trainer.span_floors
    trainer.step([*own, honest])
    assert set(trainer.span_floors["drift"]) == set(peer_defence.MULTISCALE)
