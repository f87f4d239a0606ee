"""Rollout data types shared by the sampler, the verifier, the trainer and the wire protocol.

A question is never shipped or trusted as text: it is named by a ``TaskRef`` from which any node
regenerates the question and its ground truth. A ``RolloutGroup`` is G completions of one question
plus where they came from (``Provenance``): the off-policy correction picks its treatment by source,
policy version and tokenizer, and staleness = learner version - ``policy_version``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal


def _canonical_json(config: Mapping[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class TaskRef:
    """(dataset, config, seed, index): enough to regenerate one reasoning-gym question deterministically."""

    dataset: str
    seed: int
    index: int
    config: str = "{}"  # canonical JSON (sorted keys): hashable and unambiguous; see make()

    @classmethod
    def make(cls, dataset: str, seed: int, index: int, config: Mapping[str, Any] | None = None) -> TaskRef:
        return cls(dataset=dataset, seed=int(seed), index=int(index), config=_canonical_json(config or {}))

    def config_dict(self) -> dict[str, Any]:
        return json.loads(self.config)

    def key(self) -> str:
        """Canonical string form, stable across processes (used for dedup and logs)."""
        return json.dumps([self.dataset, self.config_dict(), self.seed, self.index], sort_keys=True)


@dataclass(frozen=True)
class Completion:
    """One sampled completion.

    ``token_ids``/``logprobs`` are in the *sampling* model's tokenizer; ``logprobs`` are the behaviour
    policy's per-token log-probs at the sampling temperature (None when the producer has none or they
    are not usable, e.g. a peer on another tokenizer).
    """

    text: str
    token_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    finished: bool = True  # False when cut at max_new_tokens


@dataclass(frozen=True)
class Provenance:
    source: Literal["local", "peer"]
    producer: str  # peer id of the node that sampled it
    policy_version: int  # producer's policy version when sampling
    round: int  # producer's round number
    model_name: str = ""
    tokenizer_fingerprint: str = ""


@dataclass(frozen=True)
class RolloutGroup:
    """G completions of one question, their locally computed rewards, and where they came from."""

    ref: TaskRef
    question: str
    completions: tuple[Completion, ...]
    rewards: tuple[float, ...]  # task score + format bonus: what the learner optimises
    task_scores: tuple[float, ...]  # the dataset's own score alone: what peers claim and compare
    format_ok: tuple[bool, ...]
    provenance: Provenance

    @property
    def informative(self) -> bool:
        """False when all rewards are equal: group-normalised advantages are all zero."""
        return max(self.rewards) - min(self.rewards) > 1e-9
