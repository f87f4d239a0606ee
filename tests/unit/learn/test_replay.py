"""Replay of own groups: bounded, by policy version, staleness cap with drops counted, used once."""

from swarmnode.config import load_config
from swarmnode.learn.replay import ReplayBuffer
from swarmnode.rollouts import Provenance, RolloutGroup, TaskRef


def _group(index: int, version: int, rewards=(1.0, 0.0)) -> RolloutGroup:
    provenance = Provenance(source="local", producer="me", policy_version=version, round=version + 1)
    ref = TaskRef.make("basic_arithmetic", 0, index)
    return RolloutGroup(ref, "q", (), rewards, rewards, (True, False), provenance)


def test_staleness_cap_capacity_and_single_use():
    buffer = ReplayBuffer(capacity=3, max_staleness=2, seed=0)
    buffer.add([_group(0, 0), _group(1, 1), _group(2, 2), _group(3, 3)])  # capacity 3: index 0 evicted
    buffer.add([_group(4, 3, rewards=(0.5, 0.5))])  # zero advantage: never kept
    assert len(buffer) == 3
    chosen = buffer.sample(5, learner_version=4)  # version 1 is 3 behind: dropped, counted
    assert sorted(g.ref.index for g in chosen) == [2, 3]
    assert buffer.dropped_stale == 1
    assert buffer.sample(5, learner_version=4) == []  # each group is replayed once
    assert len(buffer) == 0


def test_sample_is_bounded_by_count_and_seeded():
    picks = []
    for _ in range(2):
        buffer = ReplayBuffer(capacity=10, max_staleness=5, seed=7)
        buffer.add([_group(i, 1) for i in range(6)])
        picks.append([g.ref.index for g in buffer.sample(2, learner_version=2)])
    assert len(picks[0]) == 2 and picks[0] == picks[1]


def test_a_solo_node_replays_its_own_stale_groups(tmp_path):
    from swarmnode.node import Node

    cfg = load_config(
        "node_configs/tiny.yaml",
        {"run.run_dir": str(tmp_path), "run.rounds": 5, "replay.groups_per_round": 2, "tasks.seed": 5},
    )
    node = Node(cfg)
    node.run()
    records = node.runlog.records()
    assert records[0]["groups_replayed"] == 0  # nothing to replay before the first round's groups
    assert sum(r["groups_replayed"] for r in records) >= 2
    # replayed groups are trained with the local correction: importance weights are no longer all 1
    replaying = [r for r in records if r["groups_replayed"] and r["train_sequences"]]
    assert any(
        r["train_is_weight_max"] > 1.0 + 1e-3 or r["train_is_weight_mean"] < 1.0 - 1e-3 for r in replaying
    )


def test_reincarnation_stops_replay_and_resets_the_kl_reference(tmp_path):
    from swarmnode.node import Node
    from swarmnode.policy import state_digest

    overrides = {
        "run.run_dir": str(tmp_path), "run.rounds": 7, "tasks.seed": 5,
        "replay.groups_per_round": 2, "replay.reincarnate_after": 3,
        "train.kl_beta": 0.01, "train.kl_convex": True,
    }  # fmt: skip
    node = Node(load_config("node_configs/tiny.yaml", overrides))
    base = state_digest(node.trainer.ref_model)
    node.run()
    records = node.runlog.records()
    before = [r for r in records if not r["reincarnated"]]
    after = [r for r in records if r["reincarnated"]]
    assert after and before[-1]["policy_version"] >= 3 > before[-2]["policy_version"]
    assert sum(r["groups_replayed"] for r in before) >= 1  # replay was on until step T ...
    assert all(r["groups_replayed"] == 0 for r in after)  # ... and off for good after it
    assert state_digest(node.trainer.ref_model) != base  # the reference moved to a trained policy
