"""Sections ``offpolicy`` and ``replay``: data the current weights did not sample. ``offpolicy`` picks
the correction for each source (this node's own rollouts, same-tokenizer peers, peers on another
tokenizer) and what peer text may teach; ``replay`` reuses this node's own recent groups."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from swarmnode.config.strict import Strict


class OffPolicyConfig(Strict):
    """Correction for data not sampled by the current weights, chosen per source (see learn/offpolicy.py)."""

    local: Literal["none", "tis", "icepop", "remix"] = Field(
        "tis", description="This node's own rollouts (corrects sampler/learner mismatch and staleness)."
    )
    peer: Literal["none", "tis", "icepop"] = Field(
        "tis", description="Peers on this tokenizer that ship log-probs (untrusted: truncated or masked)."
    )
    foreign: Literal["none", "luffy"] = Field(
        "none", description="Peers on another tokenizer (no usable log-probs): ratio 1 (SAPO) or LUFFY."
    )
    peer_defence: Literal[
        "none",
        "span",
        "span_multiscale",
        "drift",
        "span_drift",
        "recurring",
        "span_drift_recurring",
        "token_budget",
        "rescue",
        "questions",
    ] = Field(
        "span_drift",
        description="What peer text beyond its verified answer may teach, against peers that hide a payload "
        "in correct completions (learn/peer_defence.py; measured in docs/poisoning.md): none; "
        "span = peer tokens in 8-token spans this node would not write (its own log-probs) leave the loss; "
        "span_multiscale = the same over spans of 1, 2, 4 and 8 tokens; "
        "drift = peer tokens in spans whose log-prob rose since the base model more than this node's own "
        "text rose leave the loss (holds fluent payloads; keeps a frozen copy of the starting weights); "
        "span_drift = span_multiscale and drift; "
        "recurring = peer tokens within 8 of a word or word pair that peers wrote for 3 or more questions "
        "and this node did not write in 16 rounds leave the loss (learn/recurring.py); "
        "span_drift_recurring = span_drift and recurring; "
        "token_budget = no producer outweighs one own group; rescue = peer groups only for tasks this "
        "node fails at; questions = no peer text is trained: the node samples and trains on its own "
        "completions of the questions peers' groups were informative on (rounds.resample_peer_questions).",
    )
    tis_cap: float = Field(2.0, gt=0, description="tis: largest importance weight C.")
    icepop_low: float = Field(0.5, gt=0, description="icepop: tokens with pi_old/mu below this are masked.")
    icepop_high: float = Field(5.0, gt=0, description="icepop: tokens with pi_old/mu above this are masked.")
    luffy_gamma: float = Field(0.1, gt=0, description="luffy: gamma in the shaping p / (p + gamma).")
    ess_base: float | None = Field(
        None, gt=0, le=1, description="Damp the lr by sqrt(min(1, ESS/ess_base)) (VCPO); None = off."
    )

    @model_validator(mode="after")
    def _window(self) -> OffPolicyConfig:
        if self.icepop_low >= self.icepop_high:
            raise ValueError("offpolicy.icepop_low must be below offpolicy.icepop_high")
        return self


class ReplayConfig(Strict):
    """Reuse of this node's own recent groups; off unless groups_per_round > 0."""

    groups_per_round: int = Field(
        0, ge=0, description="Own older groups replayed next to fresh ones per round."
    )
    capacity: int = Field(64, gt=0, description="Groups kept for replay (oldest evicted).")
    max_staleness: int = Field(
        2, ge=1, description="Policy versions a group may lag the learner and still be replayed (N)."
    )
    reincarnate_after: int | None = Field(
        None,
        gt=0,
        description="ReMix's policy reincarnation: at this optimizer step replay stops for good and the "
        "KL reference becomes the current policy (paper: T=50); None = never.",
    )
