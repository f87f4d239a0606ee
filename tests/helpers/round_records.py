"""A made-up round record, for tests of what reads one (metrics collector, round line, metrics.jsonl)."""

from __future__ import annotations

from dataclasses import replace

from swarmnode.learn.trainer import StepStats
from swarmnode.round_record import RoundRecord

STEP = StepStats(sequences=6, tokens=120, loss=0.25, kl=0.01, clip_low_frac=0.02, clip_high_frac=0.03,
                 grad_norm=1.5, masked_frac=0.1, is_weight_mean=0.9, is_weight_max=1.8, ess=0.8,
                 behaviour_kl=0.004, lr_scale=0.95, seconds=2.5, tokens_per_s=48.0)  # fmt: skip
RECORD = RoundRecord(
    round=7, policy_version=7, reward_mean=0.625, task_score_mean=0.5, reward_peer_mean=0.25,
    format_rate=0.75, reward_by_task={"basic_arithmetic": 0.5, "propositional_logic": 0.75},
    groups_total=5, groups_local=2, groups_peer=2, groups_replayed=1, replay_dropped_stale=0,
    reincarnated=False, groups_kept=4, sampled_tokens=640, sample_tokens_per_s=160.0,
    seconds_sample=4.0, seconds_score=0.5, seconds_share=1.5, seconds_train=2.5, seconds_sync=0.0,
    seconds_total=8.5, train=STEP,
)  # fmt: skip


def a_round_record(**changes) -> RoundRecord:
    """``RECORD`` with ``changes`` (field names as keywords)."""
    return replace(RECORD, **changes)
