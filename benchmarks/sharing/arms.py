"""The arms of ``benchmarks.sapo_table``: how many groups a node samples and takes from peers, and the
config overrides each node of an arm gets. Pure: no process is started here.

Table 1, sharing (SAPO, arXiv 2509.08721, Table 1; a node trains on ``groups`` question groups a round):
  silo, silo-L  every node alone, all groups local: ``silo`` with ``groups`` of them, ``silo-L`` with L
                (silo-2 is the control a 2/2 swarm needs: the same sampling, without the peer groups)
  L/E           a swarm: L local groups + E verified peer groups per round
  silo-matched  E2's control: a silo node that samples MATCHED_QUESTIONS groups a round and trains on at
                most MATCHED_MAX_GROUPS informative ones, so it trains on as many groups and tokens as 2/2
Table 2, off-policy corrections: foreign-none/luffy (peers withhold their log-probs), stale-none/remix
(silo nodes that also replay their own older groups).
Specialists (experiment E1): two tasks A and B in every node's mix (``TaskSplit``):
  spec-silo        specialists alone: nodes 0..n/2-1 sample only A, the others only B
  spec-L/E         the same specialists in a swarm, ``groups`` split in half
  generalist-silo  silo nodes sampling A and B 50/50, at spec-silo's sampling
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from benchmarks.sharing.sapo_report import slug

SILO = "silo"
_SILO_L = re.compile(r"silo-([1-9]\d*)")
STREAMS_PER_SEED = 1000  # node i of seed s draws questions under tasks.seed = STREAMS_PER_SEED * s + i
MATCHED = "silo-matched"
# silo-matched's settings, chosen from E2's summaries (docs/sharing/e2, 40 rounds) before it ran, by
# ``python -m benchmarks.sharing.matching``: 2/2 kept 2.93 groups (433 tokens) a round. A silo node's own
# group is informative with a probability that rises to ~0.9 (rounds 4-8) and falls to ~0.33 (rounds 20-40),
# so a cap of 3 would need ~16 questions a round to keep 2.9 (4x silo-4's sampling); a cap of 4, 2/2's most,
# keeps an expected 2.83 groups (~432 tokens) from 7 questions, 3.04 (~463) from 8: 7 is nearest both.
MATCHED_QUESTIONS = 7
MATCHED_MAX_GROUPS = 4


def stream_seed(seed: int, node: int) -> int:
    """Node ``node``'s question stream under ``seed``: the same in every arm (what pairs arms by seed)."""
    return STREAMS_PER_SEED * seed + node


def silo_name(arm: str, local: int) -> str:
    """The arm named by its group count: ``silo`` (older summaries' name for silo with ``--groups``
    local groups) reads as ``silo-<local>``; every other name is kept."""
    return f"{SILO}-{local}" if arm == SILO else arm


@dataclass(frozen=True)
class TaskSplit:
    """Exactly two tasks, A and B, in every node's mix, with the same dataset configs: every node verifies
    and trains on peers' groups of both, and all keep one task fingerprint (weights are not part of it).
    Only the sampling weights differ: specialists (nodes 0..n/2-1 sample A alone, the rest B alone), or a
    generalist's 50/50."""

    a: str
    b: str
    configs: dict[str, dict[str, Any]] = field(hash=False)  # dataset -> reasoning-gym config
    specialists: bool = True

    def weights(self, node: int, nodes: int) -> dict[str, float]:
        if not self.specialists:
            return {self.a: 1.0, self.b: 1.0}
        return {self.a: 1.0, self.b: 0.0} if node < nodes // 2 else {self.a: 0.0, self.b: 1.0}

    def mix_override(self, node: int, nodes: int) -> str:
        """One ``--set`` that replaces the whole ``tasks.mix`` (a dotted override replaces the value it
        names, so no task of ``--config``'s mix is left over); JSON is YAML."""
        weights = self.weights(node, nodes)
        mix = {name: {"weight": weights[name], "config": self.configs[name]} for name in (self.a, self.b)}
        return "tasks.mix=" + json.dumps(mix, sort_keys=True)


def parse_split(specs: list[str], base_mix: dict[str, dict[str, Any]]) -> TaskSplit:
    """``--specialise A B``: each ``NAME`` (its config from ``base_mix``, the --config's mix, else the
    dataset's defaults) or ``NAME=<YAML mapping>`` (that config)."""
    names = [spec.partition("=")[0].strip() for spec in specs]
    if len(set(names)) != 2:
        raise ValueError(f"--specialise takes two different tasks, A and B; got {names}")
    configs = {}
    for name, spec in zip(names, specs, strict=True):
        _, given, raw = spec.partition("=")
        config = yaml.safe_load(raw) if given else base_mix.get(name, {})
        if not isinstance(config, dict):
            raise ValueError(
                f"--specialise {spec!r}: the config after '=' is a YAML mapping, e.g. {{max_digits: 2}}"
            )
        configs[name] = config
    a, b = names
    return TaskSplit(a, b, configs)


@dataclass(frozen=True)
class Arm:
    name: str
    table: str  # "sharing", "offpolicy" or "specialists"
    local: int  # question groups sampled per node and round
    peer: int  # peer groups trained on per round (0: a silo node, run with `swarmnode solo`)
    sets: tuple[str, ...] = field(default=())  # extra config overrides
    what: str = ""
    split: TaskSplit | None = None  # per-node task weights (the specialist arms)

    @property
    def swarm(self) -> bool:
        return self.peer > 0

    @property
    def slug(self) -> str:
        return slug(self.name)

    def node_sets(self, node: int, nodes: int) -> list[str]:
        """This arm's overrides for node ``node`` of ``nodes``: its sets, and its node's task mix."""
        return [*self.sets, *([self.split.mix_override(node, nodes)] if self.split else [])]


def silo_arm(local: int, name: str | None = None) -> Arm:
    return Arm(name or f"{SILO}-{local}", "sharing", local, 0, what=f"{local} local groups, no sharing")


def matched_arm() -> Arm:
    """E2's control (module docstring): the same node as silo-4, sampling more and training on fewer."""
    return Arm(
        MATCHED, "sharing", MATCHED_QUESTIONS, 0, (f"train.max_groups={MATCHED_MAX_GROUPS}",),
        what=f"{MATCHED_QUESTIONS} local groups, at most {MATCHED_MAX_GROUPS} informative ones trained",
    )  # fmt: skip


def split_arm(groups: int, split: str) -> Arm:
    local, peer = (int(x) for x in split.split("/"))
    if local + peer != groups or peer <= 0 or local <= 0:
        raise ValueError(f"split {split}: need L/E with L, E > 0 and L + E = --groups ({groups})")
    return Arm(split, "sharing", local, peer, what=f"{local} local + {peer} peer groups")


def offpolicy_arms(groups: int, replay_groups: int) -> list[Arm]:
    half = groups // 2
    withheld = ("swarm.share_logprobs=false",)
    replay = (f"replay.groups_per_round={replay_groups}", "train.updates_per_round=2")
    return [
        *(
            Arm(f"foreign-{mode}", "offpolicy", groups - half, half, (*withheld, f"offpolicy.foreign={mode}"),
                what=f"{groups - half}/{half}, peers' log-probs withheld, foreign correction {mode}")
            for mode in ("none", "luffy")
        ),
        *(
            Arm(f"stale-{mode}", "offpolicy", groups, 0, (*replay, f"offpolicy.local={mode}"),
                what=f"silo + {replay_groups} replayed own groups, 2 updates/round, local correction {mode}")
            for mode in ("none", "remix")
        ),
    ]  # fmt: skip


def specialist_arms(groups: int, split: TaskSplit) -> list[Arm]:
    half = groups // 2
    pair = f"{split.a} | {split.b}"
    generalist = TaskSplit(split.a, split.b, split.configs, specialists=False)
    return [
        Arm("spec-silo", "specialists", groups, 0, what=f"specialists ({pair}), {groups} local groups",
            split=split),
        Arm(f"spec-{groups - half}/{half}", "specialists", groups - half, half, split=split,
            what=f"specialists ({pair}), {groups - half} local + {half} peer groups"),
        Arm("generalist-silo", "specialists", groups, 0, split=generalist,
            what=f"{split.a} and {split.b} 50/50, {groups} local groups"),
    ]  # fmt: skip


def build_arms(
    groups: int, splits: list[str], replay_groups: int, split: TaskSplit | None = None
) -> list[Arm]:
    """Every named arm: silo, the L/E splits, the off-policy arms and, given a task split, the specialist
    arms. ``silo-L`` arms, for any L, and silo-matched are made on request (``select_arms``)."""
    arms = [
        silo_arm(groups, SILO),
        *(split_arm(groups, s) for s in splits),
        *offpolicy_arms(groups, replay_groups),
    ]
    return arms + (specialist_arms(groups, split) if split else [])


def select_arms(names: list[str] | None, arms: list[Arm]) -> list[Arm]:
    """The arms ``names`` asks for, in its order (None: every arm of ``arms``); ``silo-L`` for any L, and
    silo-matched."""
    if names is None:
        return arms
    known = {a.name: a for a in arms} | {MATCHED: matched_arm()}
    unknown = [n for n in names if n not in known and not _SILO_L.fullmatch(n)]
    if unknown:
        hint = "" if any(a.split for a in arms) else " (the specialist arms need --specialise A B)"
        raise ValueError(f"unknown arm(s) {unknown}; choose from {[*known, 'silo-L (any L)']}{hint}")
    return [known[n] if n in known else silo_arm(int(_SILO_L.fullmatch(n).group(1))) for n in names]
