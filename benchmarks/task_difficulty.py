"""Step 0 of the sharing experiments: the untrained model's greedy pass@1 on candidate tasks
(``benchmarks/sharing/difficulty.py``: the audited datasets, harder arithmetic settings), ``--questions``
held-out questions each, as ``swarmnode eval`` scores them; a table on stdout and every number in
``--json``. Candidates in the 10-40% band are marked (E1), and those at 10-15% (E2).

    .venv/bin/python -m benchmarks.task_difficulty --set sampling.max_new_tokens=48
    .venv/bin/python -m benchmarks.task_difficulty --only "bf, default" --questions 2 --json /tmp/d.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from benchmarks.machine import describe_machine, machine_info
from benchmarks.sharing.difficulty import CANDIDATES, measure, table
from swarmnode.config import load_config, parse_override

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=REPO / "node_configs" / "arithmetic-easy.yaml",
        help="model, system prompt, answer length and eval seed (its task mix is replaced per candidate)",
    )
    parser.add_argument(
        "--set", action="append", default=[], help="config override, e.g. sampling.max_new_tokens=48"
    )
    parser.add_argument("--questions", type=int, default=200, help="held-out questions per candidate")
    parser.add_argument("--only", nargs="+", default=None, metavar="LABEL", help="these candidates only")
    parser.add_argument("--json", type=Path, default=REPO / "docs" / "sharing" / "task-difficulty.json")
    args = parser.parse_args()
    candidates = [c for c in CANDIDATES if args.only is None or c.label in args.only]
    if args.only and len(candidates) != len(set(args.only)):
        parser.error(f"unknown --only label(s); choose from {[c.label for c in CANDIDATES]}")
    cfg = load_config(args.config, dict(parse_override(s) for s in args.set))
    machine = machine_info("benchmarks.task_difficulty")
    print(f"machine: {describe_machine(machine)}\nmodel: {cfg.model.name}", file=sys.stderr)
    t0 = time.monotonic()

    def progress(row) -> None:
        print(f"{row.candidate.label}: pass@1 {row.pass1:.3f} ({row.seconds:.0f} s)", file=sys.stderr)

    rows = measure(cfg, candidates, args.questions, on_row=progress)
    print(table(rows))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    config = args.config.resolve()
    record = {
        "command": "python -m benchmarks.task_difficulty " + shlex.join(sys.argv[1:]),
        "config": str(config.relative_to(REPO) if config.is_relative_to(REPO) else config),
        "sets": args.set,
        "model": cfg.model.name,
        "max_new_tokens": cfg.sampling.max_new_tokens,
        "eval_seed": cfg.tasks.eval_seed,
        "machine_line": describe_machine(machine, now=False),
        "wall_s": round(time.monotonic() - t0, 1),
        "rows": [r.as_dict() for r in rows],
    }
    args.json.write_text(json.dumps(record, indent=1) + "\n")
    print(f"json: {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
