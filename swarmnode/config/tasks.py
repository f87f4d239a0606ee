"""Section ``tasks``: the reasoning-gym mix a node samples and verifies, and the seeds of its question
streams (the training stream and the held-out one of ``swarmnode eval``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from swarmnode.config.strict import Strict

# Question slots per round in a node's question stream: question j of round r is item r * DRAW_STRIDE + j
# (tasks.TaskBank.draw), whatever the number drawn, so sampling.questions_per_round is at most this.
DRAW_STRIDE = 1024

SAPO_TASKS = (
    "arc_1d",
    "basic_arithmetic",
    "base_conversion",
    "bf",
    "binary_matrix",
    "calendar_arithmetic",
    "decimal_arithmetic",
    "fraction_simplification",
    "propositional_logic",
)


class TaskSpec(Strict):
    weight: float = Field(
        1.0,
        ge=0,
        description="Relative sampling weight in the mix. 0 = never sampled here, but still in the mix: "
        "peers' groups of it are verified and trained on, and the task fingerprint stays the swarm's "
        "(weights are not in it), so a specialist node can keep its peers' mix.",
    )
    config: dict[str, Any] = Field(default_factory=dict, description="reasoning-gym dataset config.")


class TasksConfig(Strict):
    mix: dict[str, TaskSpec] = Field(
        default_factory=lambda: {name: TaskSpec() for name in SAPO_TASKS},
        description="reasoning-gym datasets and their weights/configs (default: the nine SAPO tasks).",
    )
    seed: int | None = Field(
        None,
        ge=0,
        lt=2**63,
        description="Seed of this node's question stream (None = derived from its peer id).",
    )
    eval_seed: int = Field(
        10_000_019, ge=0, lt=2**63, description="Seed of the held-out questions used by `swarmnode eval`."
    )
    format_reward: float = Field(
        0.1, ge=0, le=1, description="Reward added when the answer is given in the stated format."
    )

    @field_validator("mix")
    @classmethod
    def _non_empty(cls, mix: dict[str, TaskSpec]) -> dict[str, TaskSpec]:
        if not mix:
            raise ValueError("the task mix is empty: list at least one reasoning-gym dataset")
        if not any(spec.weight > 0 for spec in mix.values()):
            raise ValueError("every weight is 0, so the node would sample nothing: give one a weight > 0")
        return mix
