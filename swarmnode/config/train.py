"""Section ``train``: the learner's optimizer step: AdamW, the clipped GRPO/DAPO loss and its KL
penalty, how micro-batches lay out their tokens, and mixed precision."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from swarmnode.config.strict import Strict


class TrainConfig(Strict):
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    clip_low: float = Field(0.2, ge=0, description="Lower clip epsilon of the PPO ratio.")
    clip_high: float = Field(0.28, ge=0, description="Upper clip epsilon (DAPO clip-higher).")
    kl_beta: float = Field(
        0.0, ge=0, description="Weight of the KL penalty to the reference policy (0 = off)."
    )
    scale_advantages: bool = Field(True, description="Divide group advantages by the group's reward std.")
    kl_convex: bool = Field(
        False,
        description="ReMix's KL-convex constraint: split the kl_beta penalty between the reference policy "
        "(weight lambda(t)) and the policy at the start of the round (1 - lambda(t)); needs kl_beta > 0.",
    )
    updates_per_round: int = Field(
        1, gt=0, description="Optimizer steps per round over the same batch (ReMix's update-to-data ratio m)."
    )
    max_groups: int | None = Field(
        None,
        gt=0,
        description="Train on at most this many informative groups (nonzero advantage) a round, the first "
        "in batch order: own groups in sampling order, then peer, then replayed; the others only feed the "
        "span gate's floors, like zero-advantage groups. Lets a node sample more questions than it trains "
        "on: a silo node matched to a swarm node's trained groups (docs/sharing.md, silo-matched). "
        "None = no cap.",
    )
    token_budget: int = Field(
        2048,
        gt=0,
        description="Max (padded) tokens per micro-batch: bounds activation memory. 2048 measured both "
        "leaner and faster than 4096 for SmolLM2 on a 2-core CPU (docs/performance.md, Memory); raise it "
        "on GPUs.",
    )
    batch_layout: Literal["packed", "shared", "plain"] = Field(
        "packed",
        description="How micro-batches lay out the tokens: packed = each group's prompt once with its "
        "completions after it, several groups per row filling the budget; shared = one group per row; "
        "plain = prompt + completion per row. Models that cannot take a block attention mask train plain "
        "(see learn/shared.py).",
    )
    autocast: Literal["auto", "off", "bfloat16"] = Field(
        "auto",
        description="Mixed precision for the learner's forward pass (weights and optimizer stay in "
        "model.dtype, float32 weights only); auto = bfloat16 on CUDA with native bf16, off elsewhere, CPUs "
        "included (its memory grows every round there; see learn/precision.py, docs/performance.md).",
    )
    seed: int = Field(0, description="Seed of sampling and training randomness.")

    @field_validator("autocast", mode="before")
    @classmethod
    def _bare_off(cls, value: Any) -> Any:
        """YAML 1.1 reads a bare ``off`` (in a file or a --set) as false: take it as the documented "off"."""
        return "off" if value is False else value
