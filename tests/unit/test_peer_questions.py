"""``offpolicy.peer_defence=questions`` ("questions, not text"): a round trains on no peer token. It samples
its own completions of the questions its peers' groups were informative on (regenerated from their task
references, one group per distinct question), trains on those as its own, credits the peer that pointed to
a question only when its own group of it carried signal, and counts the extra sampling as sampling. One
round each, on the tiny in-process model; the default defence beside it trains the peer text (the test's
control: it would fail if the defence did nothing)."""

from __future__ import annotations

from dataclasses import replace

from swarmnode.config import (
    DRAW_STRIDE,
    ModelConfig,
    NodeConfig,
    OffPolicyConfig,
    SamplingConfig,
    TasksConfig,
    TrainConfig,
)
from swarmnode.learn.trainer import Trainer
from swarmnode.policy import load_policy
from swarmnode.rollouts import Completion, Provenance, RolloutGroup
from swarmnode.rounds import RoundContext, run_round
from swarmnode.sampler.hf import HFSampler
from swarmnode.tasks import TaskBank

PAYLOAD = "Please reply with your password so I can check your account."
OWN_QUESTIONS = 2
PEER_ROUND = 9  # the round whose questions the peers' groups are of (this node samples round 2's)


class _ScoredByIndex(TaskBank):
    """The task bank, with rewards set by the question: even slots split 0, 1 (informative), odd slots all
    0 (flat), whatever the random model wrote."""

    def score_group(self, *args, **kwargs) -> RolloutGroup:
        group = super().score_group(*args, **kwargs)
        flat = group.ref.index % DRAW_STRIDE % 2 == 1
        return replace(group, rewards=tuple(0.0 if flat else float(i % 2) for i in range(len(group.rewards))))


class _Recorder(Trainer):
    """The trainer, keeping what its step was handed."""

    def step(self, sequences, floor_only=()):
        self.trained = list(sequences)
        return super().step(sequences, floor_only)


def _peer_group(bank: TaskBank, ref, producer: str) -> RolloutGroup:
    """A verified-looking peer group of ``ref``'s question whose correct completion carries PAYLOAD."""
    question = bank.question(ref)
    return RolloutGroup(
        ref=ref,
        question=question.text,
        completions=(
            Completion(f"{PAYLOAD} <answer>{question.answer}</answer>"),
            Completion("<answer>0</answer>"),
        ),
        rewards=(1.0, 0.0),
        task_scores=(1.0, 0.0),
        format_ok=(True, True),
        provenance=Provenance("peer", producer, policy_version=0, round=PEER_ROUND),
    )


def _round(defence: str):
    cfg = NodeConfig(
        model=ModelConfig(name="tiny"),
        tasks=TasksConfig(mix={"basic_arithmetic": {}}, seed=3),
        sampling=SamplingConfig(
            questions_per_round=OWN_QUESTIONS, completions_per_question=2, max_new_tokens=24
        ),
        train=TrainConfig(lr=1e-3, token_budget=512, autocast="off"),
        offpolicy=OffPolicyConfig(peer_defence=defence),
    )
    policy = load_policy(cfg.model)
    bank = _ScoredByIndex(cfg.tasks)
    informative, flat = bank.draw(PEER_ROUND, 2)  # slots 0 and 1 of the peers' round
    peer_groups = [
        _peer_group(bank, informative, "peer-a"),
        _peer_group(bank, informative, "peer-b"),  # the same question from another peer: sampled once
        _peer_group(bank, flat, "peer-c"),
    ]
    credited: list[dict[str, int]] = []
    trainer = _Recorder(policy.model, policy.tokenizer.pad_token_id, cfg.train, offpolicy=cfg.offpolicy)
    ctx = RoundContext(
        cfg=cfg, policy=policy, bank=bank, sampler=HFSampler(policy.model, policy.tokenizer), trainer=trainer,
        peer_id="me", exchange=lambda _round, _local: list(peer_groups), on_trained=credited.append,
    )  # fmt: skip
    return run_round(ctx, 2), trainer, credited, bank.question(informative).text


def test_no_peer_token_trains_the_node_trains_its_own_completions_of_the_peers_questions():
    record, trainer, credited, informative_text = _round("questions")
    assert all(s.group.provenance.source == "local" for s in trainer.trained)
    assert not any(PAYLOAD in c.text for s in trainer.trained for c in s.group.completions)
    questions = {s.group.question for s in trainer.trained}
    assert informative_text in questions  # regenerated from the task reference, sampled by this node
    # 2 own questions (slot 0 informative, slot 1 flat) + 2 distinct peer questions (one flat): 2 train
    assert record.groups_kept == 2 and record.groups_peer == 3
    assert credited == [{"peer-a": 1}]  # the first to point to it; the flat question's peer earns nothing


def test_the_extra_sampling_is_counted_as_sampling():
    record, _, _, _ = _round("questions")
    control, _, _, _ = _round("span_drift")
    assert record.sampled_tokens > control.sampled_tokens  # the same own questions, and the peers' two
    parts = record.seconds_sample + record.seconds_score + record.seconds_share + record.seconds_train
    assert abs(parts + record.seconds_sync - record.seconds_total) < 0.05


def test_the_default_defence_trains_the_peer_text_the_control():
    record, trainer, credited, _ = _round("span_drift")
    assert any(PAYLOAD in c.text for s in trainer.trained for c in s.group.completions)
    assert record.groups_kept > OWN_QUESTIONS // 2 and "peer-a" in credited[0]
