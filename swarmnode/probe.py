"""The fixed probe: the current policy, greedy, on the same held-out questions every few rounds.

A round's reward is measured on the questions the node happened to draw, which depend on its seed, its
task weights and ``sampling.questions_per_round``; arms of an experiment need one yardstick instead. The
probe asks the first ``probe.questions_per_task`` items of the eval stream (``tasks.eval_seed``) of every
task of the mix, weight-0 tasks included: the same questions in every arm whatever the node's weights,
question count or peers. It scores them with ``swarmnode eval``'s own function (``evaluate.score_policy``),
so a probe line equals ``swarmnode eval`` of the same weights.

When (``due``): before the first round of a fresh run (round 0, the untrained model), after every round r
with r % ``probe.every_rounds`` == 0, and after the final round; never twice for one round (a resumed run
skips the probes its log already holds). Each probe appends one line to ``probe.jsonl`` in the run folder
(``ProbeResult.as_dict``); like metrics.jsonl, a full disk skips the line instead of stopping the node.
Greedy decoding draws no random numbers, so probing leaves the run's random stream as it was.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from swarmnode.common import log
from swarmnode.evaluate import score_policy
from swarmnode.learn.heap import return_freed_heap, sampling_heap

if TYPE_CHECKING:
    from swarmnode.config import NodeConfig
    from swarmnode.policy import Policy
    from swarmnode.rollouts import TaskRef
    from swarmnode.runlog import RunLog
    from swarmnode.tasks import TaskBank

PROBE_FILE = "probe.jsonl"


def probe_refs(bank: TaskBank, per_task: int) -> dict[str, list[TaskRef]]:
    """The probe's questions: the first ``per_task`` held-out refs of every task of the mix."""
    return bank.eval_refs(per_task)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


@dataclass(frozen=True)
class ProbeResult:
    """One probe: per task pass@1, score and answer-format rate (``score_policy``), and its wall time."""

    round: int
    questions_per_task: int
    by_task: dict[str, dict[str, float]]
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        """The probe.jsonl line; ``pass@1`` and ``score`` are means over tasks (each task counts once)."""
        rows = list(self.by_task.values())
        return {
            "round": self.round,
            "questions_per_task": self.questions_per_task,
            "by_task": self.by_task,
            "pass@1": _mean([row["pass@1"] for row in rows]),
            "score": _mean([row["score"] for row in rows]),
            "seconds": self.seconds,
        }


class Probe:
    """Probes ``policy`` on the bank's held-out questions when due and appends the result to ``runlog``."""

    def __init__(self, cfg: NodeConfig, bank: TaskBank, policy: Policy, runlog: RunLog):
        self.every = cfg.probe.every_rounds
        self.per_task = cfg.probe.questions_per_task
        self.max_new_tokens = cfg.sampling.max_new_tokens
        self.system_prompt = cfg.sampling.system_prompt
        self.bank, self.policy, self.runlog = bank, policy, runlog
        self.refs = probe_refs(bank, self.per_task)

    def due(self, round_: int, final_round: int | None) -> bool:
        """Whether the state after ``round_`` (0: before the first) is probed: on, and r % k == 0 or the
        final round."""
        return self.every > 0 and (round_ % self.every == 0 or round_ == final_round)

    def done(self, round_: int) -> bool:
        """Whether the log already holds the probe of ``round_`` (a resumed run does not repeat it)."""
        return any(record["round"] == round_ for record in self.runlog.records())

    def run(self, round_: int) -> ProbeResult:
        """Probe the policy as it is now, as round ``round_``'s probe: append its line and say it."""
        start = time.perf_counter()
        with sampling_heap():
            by_task = score_policy(
                self.policy,
                self.bank,
                self.refs,
                max_new_tokens=self.max_new_tokens,
                system_prompt=self.system_prompt,
            )
        return_freed_heap()
        result = ProbeResult(round_, self.per_task, by_task, time.perf_counter() - start)
        line = result.as_dict()
        self.runlog.append(line)
        log(
            f"probe {round_:>4}  pass@1 {line['pass@1']:.3f}  score {line['score']:.3f}  "
            f"({self.per_task} questions x {len(by_task)} tasks, greedy, {result.seconds:.1f}s)"
        )
        return result
