"""One round's record: what ``rounds.run_round`` returns and the node hands to its log, metrics and console.

Inside the process it is this frozen dataclass, read by attribute (the metrics collector, the round line,
the progress bar). It becomes a dict only where it leaves the process: ``as_dict`` gives the round's
``metrics.jsonl`` line, whose keys users parse and TensorBoard uses as tags, so a field's name is a
published key (tests/unit/test_round_record.py lists them and fails on a rename). Records read back from
``metrics.jsonl`` (``RunLog.records``, ``swarmnode status``, the benchmarks) stay dicts.

``StepStats`` and ``PeerRoundCounts`` are imported for type checking only: the modules that read records
(runlog, metrics, tensorboard) are also loaded by ``swarmnode status`` and the bootstrap, which need
neither torch nor the network stack.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from swarmnode.learn.trainer import StepStats
    from swarmnode.swarm.exchange.records import PeerRoundCounts


@dataclass(frozen=True)
class RoundRecord:
    """Round ``round``: rewards of the node's own (local) groups, group counts by source, phase times in
    seconds, the update's ``train`` statistics and, on a swarm node, what its exchange received (``peer``,
    set by the node with ``dataclasses.replace`` after the round)."""

    round: int
    policy_version: int  # after this round's update
    reward_mean: float  # over local completions
    task_score_mean: float
    reward_peer_mean: float  # over the peer groups chosen for training
    format_rate: float  # share of local completions using the answer tags
    reward_by_task: dict[str, float]  # local reward by dataset, sorted by name
    groups_total: int  # local + peer + replayed
    groups_local: int
    groups_peer: int
    groups_replayed: int
    replay_dropped_stale: int  # replayed groups dropped as too old, so far
    reincarnated: bool  # ReMix's reincarnation has happened
    groups_kept: int  # groups in the update (nonzero advantage)
    sampled_tokens: int
    sample_tokens_per_s: float
    seconds_sample: float
    seconds_score: float
    seconds_share: float
    seconds_train: float
    seconds_sync: float
    seconds_total: float
    train: StepStats
    peer: PeerRoundCounts | None = None

    def as_dict(self) -> dict[str, Any]:
        """The ``metrics.jsonl`` line: the fields above by name, then ``train_*`` (``StepStats``), then a
        swarm node's ``peer_*`` (``PeerRoundCounts.as_dict``)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("train", "peer")}
        out["reward_by_task"] = dict(self.reward_by_task)
        out.update({f"train_{key}": value for key, value in self.train.as_dict().items()})
        if self.peer is not None:
            out.update(self.peer.as_dict())
        return out
