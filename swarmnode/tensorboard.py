"""Optional TensorBoard event files with the per-round scalars of ``metrics.jsonl`` (``run.tensorboard``).

Every number in a round's record becomes a scalar at step = the round, tagged with its ``metrics.jsonl``
key (a nested key joined with "/": ``reward_by_task/basic_arithmetic``), under ``<run_dir>/tensorboard/``:
``tensorboard --logdir runs/a/tensorboard``. A restarted node resumes from its last checkpoint and drops
the records of later rounds from ``metrics.jsonl``; its event file then hides those rounds' events too
(``purge_step``), so both keep the same history. Writing needs the ``tensorboard`` package, imported only
when the option is on: ``pip install 'swarmnode[tensorboard]'``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from swarmnode.errors import ConfigError

TENSORBOARD_DIR = "tensorboard"


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numbers of a ``metrics.jsonl`` line by tag; strings and missing values (None) have no scalar."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if isinstance(value, dict):
            out.update({f"{key}/{tag}": v for tag, v in scalars(value).items()})
        elif isinstance(value, int | float):  # bool included, as 0 / 1
            out[key] = float(value)
    return out


class TensorBoardLog:
    """Writes each round's scalars; checks at construction that TensorBoard can be imported."""

    def __init__(self, run_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError(
                "run.tensorboard is true but the tensorboard package is not installed: "
                "pip install 'swarmnode[tensorboard]' (or set run.tensorboard=false)"
            ) from None
        self._make_writer = SummaryWriter
        self.log_dir = run_dir / TENSORBOARD_DIR
        self._writer = None

    def append(self, record: dict[str, Any]) -> None:
        """One round's scalars, from its ``metrics.jsonl`` line (``RoundRecord.as_dict``)."""
        step = record["round"]
        if self._writer is None:  # the first round of this process: hide events of any later round
            self._writer = self._make_writer(log_dir=str(self.log_dir), purge_step=step)
        for tag, value in scalars(record).items():
            if tag != "round":
                self._writer.add_scalar(tag, value, global_step=step)
        self._writer.flush()  # a round is minutes of work: on disk at once, like metrics.jsonl

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
