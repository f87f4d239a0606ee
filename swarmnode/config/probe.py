"""Section ``probe``: when, and on how many held-out questions, the policy is measured for experiments."""

from __future__ import annotations

from pydantic import Field

from swarmnode.config.strict import Strict


class ProbeConfig(Strict):
    """A fixed yardstick for experiments (swarmnode/probe.py): the current policy, greedy, on the same
    held-out questions in every arm, whatever its weights, questions_per_round or peers; written to
    probe.jsonl."""

    every_rounds: int = Field(
        0,
        ge=0,
        description="Probe before the first round (round 0), after every round r with r % every_rounds == 0 "
        "and after the last round; 0 = off. A probe costs a `swarmnode eval` of questions_per_task.",
    )
    questions_per_task: int = Field(
        32,
        gt=0,
        description="Held-out questions per task of the mix (weight-0 tasks included): the first N of the "
        "eval stream (tasks.eval_seed), as `swarmnode eval` asks them.",
    )
