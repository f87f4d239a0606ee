"""Honest peers that differ from us are skipped, not banned: a node advertises a task fingerprint (its
mix and scorer version) in its roster card, and groups from a peer with another one are never pulled,
so no honest difference in mix or reasoning-gym version can look like a bad_task or reward_mismatch."""

from __future__ import annotations

import importlib.metadata
import re
import time
import tomllib
from pathlib import Path

import pytest

from swarmnode import tasks
from swarmnode.config import TasksConfig, TaskSpec
from swarmnode.identity import Identity
from swarmnode.swarm.exchange.compat import TASK_FINGERPRINT_FIELD, card_fingerprint, roster_extra
from swarmnode.swarm.wire import protocol
from swarmnode.tasks import TaskBank
from tests.helpers import verify_world

ROOT = Path(__file__).resolve().parents[3]
MIX = {"basic_arithmetic": TaskSpec(config={"min_terms": 2, "max_terms": 2}), "bf": TaskSpec()}


def card(extra: dict) -> protocol.RosterCard:
    return protocol.RosterCard(
        peer_id=Identity.generate().peer_id, swarm_id="s", model_name="m", tokenizer_fingerprint="ab",
        policy_version=0, round=0, addrs=(), timestamp=time.time(), seq=1, extra=extra,
    )  # fmt: skip


def test_the_fingerprint_names_the_mix_and_the_scorer_not_the_node() -> None:
    ours = TaskBank(TasksConfig(mix=MIX, seed=1, format_reward=0.1)).fingerprint
    same = TaskBank(TasksConfig(mix=dict(reversed(MIX.items())), seed=2, format_reward=0.5)).fingerprint
    assert ours == same and re.fullmatch(r"[0-9a-f]{32}", ours)
    other_config = {**MIX, "bf": TaskSpec(config={"difficulty": 2})}
    assert TaskBank(TasksConfig(mix=other_config, seed=1)).fingerprint != ours
    assert TaskBank(TasksConfig(mix={"bf": TaskSpec()}, seed=1)).fingerprint != ours


def weighted(mix: dict[str, TaskSpec], **weights: float) -> dict[str, TaskSpec]:
    """``mix`` with some datasets' weights changed (configs kept; validated, unlike ``model_copy``)."""
    return {name: TaskSpec(weight=weights.get(name, w.weight), config=w.config) for name, w in mix.items()}


def test_weights_are_not_in_the_fingerprint_zero_included() -> None:
    """A specialist (weight 0 for a dataset it keeps in its mix) stays compatible with its peers."""
    ours = TaskBank(TasksConfig(mix=MIX, seed=1)).fingerprint
    assert TaskBank(TasksConfig(mix=weighted(MIX, bf=0), seed=1)).fingerprint == ours
    assert TaskBank(TasksConfig(mix=weighted(MIX, basic_arithmetic=7.5, bf=0.5), seed=3)).fingerprint == ours


def test_a_node_keeps_peers_groups_of_a_task_it_never_samples() -> None:
    receiver = TaskBank(TasksConfig(mix=weighted(verify_world.MIX, basic_arithmetic=0), seed=1))
    sender = TaskBank(TasksConfig(mix=weighted(verify_world.MIX, propositional_logic=0), seed=2))
    assert receiver.fingerprint == sender.fingerprint
    node, peer = verify_world.Node(receiver), verify_world.Peer(verify_world.HONEST, sender)
    batch = peer.batch()
    groups = verify_world.deliver(node, peer, *peer.publish(batch))
    assert len(groups) == len(batch.groups) == 2 and node.verifier.rejections == {}
    assert {group.ref.dataset for group in groups} == {"basic_arithmetic"}  # the receiver's weight-0 task
    assert not any(ref.dataset == "basic_arithmetic" for r in range(1, 30) for ref in receiver.draw(r, 4))


def test_another_reasoning_gym_version_is_another_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    before = TaskBank(TasksConfig(mix=MIX, seed=1)).fingerprint
    monkeypatch.setattr(tasks, "REASONING_GYM_VERSION", "0.0.1")
    assert TaskBank(TasksConfig(mix=MIX, seed=1)).fingerprint != before


def test_roster_cards_carry_the_fingerprint_and_cards_without_one_are_incompatible() -> None:
    fp = TaskBank(TasksConfig(mix=MIX, seed=1)).fingerprint
    assert card_fingerprint(card(roster_extra(fp))) == fp
    assert roster_extra(fp) == {TASK_FINGERPRINT_FIELD: fp}
    for extra in ({}, {TASK_FINGERPRINT_FIELD: 5}, {TASK_FINGERPRINT_FIELD: "x" * 10_000}):
        assert card_fingerprint(card(extra)) is None  # an older node, or garbage: not ours


def test_reasoning_gym_is_pinned_to_the_installed_version() -> None:
    """Scores must agree across honest nodes: another version may score differently (reward_mismatch)."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    [pin] = [d for d in deps if d.startswith("reasoning-gym")]
    assert pin == f"reasoning-gym=={importlib.metadata.version('reasoning-gym')}"
