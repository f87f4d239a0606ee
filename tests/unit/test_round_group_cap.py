"""``train.max_groups``: a node that samples more question groups than it trains on keeps the first N
informative ones in sampling order, trains on nothing else, and says so in ``groups_kept``; without the cap
(the default) every informative group trains. One round each, on the tiny in-process model."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

from swarmnode.config import DRAW_STRIDE, ModelConfig, NodeConfig, SamplingConfig, TasksConfig, TrainConfig
from swarmnode.learn.batch import TrainSequence
from swarmnode.learn.trainer import Trainer
from swarmnode.policy import load_policy
from swarmnode.rollouts import Provenance, RolloutGroup, TaskRef
from swarmnode.rounds import RoundContext, cap_groups, run_round
from swarmnode.sampler.hf import HFSampler
from swarmnode.tasks import TaskBank

QUESTIONS = 5
FLAT = {1}  # the slot whose group scores alike (zero advantage): it never trains and never counts


class _ScoredBySlot(TaskBank):
    """The task bank, with rewards set by the question's slot in the round: slots in FLAT all 0, the others
    split 0, 1, 0, 1, ... (informative), whatever the random model wrote."""

    def score_group(self, *args, **kwargs) -> RolloutGroup:
        group = super().score_group(*args, **kwargs)
        slot = group.ref.index % DRAW_STRIDE
        rewards = tuple(0.0 if slot in FLAT else float(i % 2) for i in range(len(group.rewards)))
        return replace(group, rewards=rewards)


class _Recorder(Trainer):
    """The trainer, keeping what each step was handed."""

    def step(self, sequences, floor_only=()):
        self.trained, self.floor_only = list(sequences), list(floor_only)
        return super().step(sequences, floor_only)


def _slots(sequences) -> list[int]:
    """The round slots of the groups ``sequences`` come from, in order of first appearance."""
    return list(dict.fromkeys(s.group.ref.index % DRAW_STRIDE for s in sequences))


def _round(max_groups: int | None):
    cfg = NodeConfig(
        model=ModelConfig(name="tiny"),
        tasks=TasksConfig(mix={"basic_arithmetic": {}}, seed=3),
        sampling=SamplingConfig(questions_per_round=QUESTIONS, completions_per_question=2, max_new_tokens=8),
        train=TrainConfig(lr=1e-3, token_budget=512, autocast="off", max_groups=max_groups),
    )
    policy = load_policy(cfg.model)
    trainer = _Recorder(policy.model, policy.tokenizer.pad_token_id, cfg.train, offpolicy=cfg.offpolicy)
    ctx = RoundContext(
        cfg=cfg,
        policy=policy,
        bank=_ScoredBySlot(cfg.tasks),
        sampler=HFSampler(policy.model, policy.tokenizer),
        trainer=trainer,
        peer_id="me",
    )
    return run_round(ctx, 2), trainer


def test_the_cap_keeps_the_first_informative_groups_in_sampling_order_and_only_them():
    record, trainer = _round(max_groups=2)
    assert _slots(trainer.trained) == [0, 2]  # slot 1 is flat: it neither trains nor uses up the cap
    assert record.groups_kept == 2 and record.groups_local == QUESTIONS
    assert record.train.sequences == len(trainer.trained) == 4  # 2 groups x 2 completions
    # the informative groups left out are still this node's own text of the round: the span gate's floors
    # read them with the flat group (as they would read a silo node's 5 groups), but nothing trains on them
    assert sorted(_slots(trainer.floor_only)) == [1, 3, 4]
    assert all(s.advantage == 0 for s in trainer.floor_only)


def test_without_a_cap_every_informative_group_trains():
    record, trainer = _round(max_groups=None)
    assert _slots(trainer.trained) == [0, 2, 3, 4] and record.groups_kept == 4
    assert _slots(trainer.floor_only) == [1]


def test_a_cap_above_the_informative_groups_changes_nothing():
    record, trainer = _round(max_groups=QUESTIONS)
    assert _slots(trainer.trained) == [0, 2, 3, 4] and record.groups_kept == 4


def test_the_cap_is_off_by_default_and_at_least_one():
    assert TrainConfig().max_groups is None
    with pytest.raises(ValidationError, match="max_groups"):
        TrainConfig(max_groups=0)


def _group(source: str, index: int) -> RolloutGroup:
    provenance = Provenance(
        source=source, producer="me" if source == "local" else "peer", policy_version=0, round=1
    )
    ref = TaskRef.make("basic_arithmetic", 0, index)
    return RolloutGroup(ref, "q", (), (0.0, 1.0), (0.0, 1.0), (True, True), provenance)


def test_a_swarm_nodes_cap_takes_its_own_groups_first_and_floors_only_its_own_text():
    own, peer = [_group("local", i) for i in range(2)], [_group("peer", 10 + i) for i in range(2)]
    sequences = [TrainSequence((1,), (2, 3), adv, None, g) for g in own + peer for adv in (-1.0, 1.0)]
    kept, left_out = cap_groups(sequences, 3)
    assert [s.group for s in kept] == [own[0]] * 2 + [own[1]] * 2 + [peer[0]] * 2
    assert left_out == []  # a peer group left out is only dropped
    kept, left_out = cap_groups(sequences, 1)
    assert [s.group for s in kept] == [own[0]] * 2
    assert [(s.group, s.advantage) for s in left_out] == [(own[1], 0.0)] * 2
    assert cap_groups(sequences, None) == (sequences, [])
