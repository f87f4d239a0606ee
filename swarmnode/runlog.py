"""What the user sees and keeps: one console line per round and every round's record in JSONL.

``metrics.jsonl`` is read and written as dicts (``RoundRecord.as_dict`` makes a round's line); the console
line reads the ``RoundRecord`` itself. The probe's ``probe.jsonl`` (probe.py) is a ``RunLog`` too: one
record per probed round, cut back with the round log on resume.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarmnode.common import WriteFailures, atomic_write

if TYPE_CHECKING:
    from swarmnode.round_record import RoundRecord

METRICS_FILE = "metrics.jsonl"


class RunLog:
    """Appends one JSON object per round (a ``"round"`` key) to ``<run_dir>/<name>``, metrics.jsonl by
    default; ``failures`` lets several logs of one node count their failed appends together."""

    def __init__(self, run_dir: Path, name: str = METRICS_FILE, failures: WriteFailures | None = None):
        self.path = run_dir / name
        # appends that failed (full disk): skipped, counted
        self.write_failures = failures if failures is not None else WriteFailures()

    def _text(self) -> str:
        return self.path.read_text() if self.path.exists() else ""

    def records(self) -> list[dict[str, Any]]:
        return _parse(self._text())

    def truncate_after(self, round_: int) -> list[int]:
        """Drop records of rounds after ``round_`` (work the last checkpoint does not contain).

        Rewritten atomically; returns the dropped round numbers.
        """
        text = self._text()
        records = _parse(text)
        kept = [r for r in records if r["round"] <= round_]
        dropped = [r["round"] for r in records if r["round"] > round_]
        # Also rewrite when a line is cut or the last newline is missing: the next append would
        # otherwise land on the same line as the last record.
        if dropped or len(records) != len(text.splitlines()) or (text and not text.endswith("\n")):
            atomic_write(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        return dropped

    def append(self, record: dict[str, Any]) -> None:
        """Append one record (e.g. ``RoundRecord.as_dict``); on a full disk the record is skipped (said once,
        counted), never raised."""
        with self.write_failures.guard(self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")
                f.flush()
                os.fsync(f.fileno())


def _parse(text: str) -> list[dict[str, Any]]:
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line cut by a crash ends the log
    return records


def round_line(record: RoundRecord) -> str:
    """The per-round console line."""
    return (
        f"round {record.round:>4}  reward {record.reward_mean:.3f}  "
        f"format {record.format_rate:.0%}  groups {record.groups_kept}/{record.groups_total}  "
        f"sample {record.sample_tokens_per_s:.0f} tok/s  "
        f"step {record.seconds_total:.1f}s (sample {record.seconds_sample:.1f} / "
        f"train {record.seconds_train:.1f})"
    )
