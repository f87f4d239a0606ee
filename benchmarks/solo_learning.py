"""Learning check: SmolLM2 solo on easy arithmetic; mean reward of the first vs the last 10 rounds.

    python -m benchmarks.solo_learning                       # runs 40 rounds, then prints the summary
    python -m benchmarks.solo_learning --summarize runs/X    # summary of an existing run folder

The run is the real `swarmnode solo` command; the summary reads its metrics.jsonl.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def summarize(run_dir: Path, window: int = 10) -> str:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    if len(records) < 2 * window:
        raise SystemExit(f"{run_dir}: {len(records)} rounds, need at least {2 * window}")
    first, last = records[:window], records[-window:]

    def mean(rows, key):
        return sum(r[key] for r in rows) / len(rows)

    lines = [f"{run_dir}: {len(records)} rounds", f"{'':<22}{'first 10':>10}{'last 10':>10}"]
    for key, label in (
        ("reward_mean", "reward (task+format)"),
        ("task_score_mean", "task score"),
        ("format_rate", "answer-format rate"),
    ):
        lines.append(f"{label:<22}{mean(first, key):>10.3f}{mean(last, key):>10.3f}")
    seconds = sum(r["seconds_total"] for r in records)
    lines.append(f"wall time of the rounds: {seconds / 60:.1f} min ({seconds / len(records):.0f} s/round)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--summarize", type=Path, help="only summarize this existing run folder")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--run-dir", type=Path, default=REPO / "runs" / "learn-arith")
    parser.add_argument("--config", type=Path, default=REPO / "node_configs" / "arithmetic-easy.yaml")
    args = parser.parse_args()
    if args.summarize is None:
        cmd = [
            sys.executable,
            "-m",
            "swarmnode.cli",
            "solo",
            "--config",
            str(args.config),
            "--rounds",
            str(args.rounds),
            "--run-dir",
            str(args.run_dir),
        ]
        subprocess.run(cmd, check=True)
    print(summarize(args.summarize or args.run_dir))


if __name__ == "__main__":
    main()
