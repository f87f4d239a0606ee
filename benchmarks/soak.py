"""Soak: many tiny nodes for many rounds on one machine; memory and open files must stay flat.

The driver, shared with the short version in tests/integration/test_soak.py, is
``benchmarks/reliability/soak.py``: its docstring says what runs and what must hold. Exits 1 on a problem.

    .venv/bin/python -m benchmarks.soak --nodes 16 --rounds 50 --json runs/soak/report.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from benchmarks.harness.processes import REPO
from benchmarks.machine import describe_machine, machine_info
from benchmarks.reliability.soak import check, run_soak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--deadline", type=float, default=10.0, help="swarm.share_deadline_s")
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=5, help="first rounds left out of the slopes")
    parser.add_argument("--cooldown", type=int, default=2, help="last rounds left out (nodes leaving)")
    parser.add_argument("--period", type=float, default=2.0, help="seconds between samples")
    parser.add_argument("--time-limit", type=float, default=2400.0, help="longest run (s)")
    parser.add_argument("--max-rss-slope", type=float, default=256.0, help="KiB/round allowed per node")
    parser.add_argument("--max-fds-slope", type=float, default=0.1, help="fds/round allowed per node")
    parser.add_argument("--config", type=Path, default=REPO / "node_configs" / "tiny.yaml")
    parser.add_argument("--workdir", type=Path, default=None, help="run folders (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="write the report as JSON here")
    args = parser.parse_args()

    machine = machine_info("benchmarks.soak")
    print(f"machine: {describe_machine(machine)}", flush=True)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="swarmnode-soak-"))
    report = run_soak(
        workdir,
        nodes=args.nodes,
        rounds=args.rounds,
        deadline_s=args.deadline,
        checkpoint_every=args.checkpoint_every,
        warmup=args.warmup,
        cooldown=args.cooldown,
        period_s=args.period,
        time_limit_s=args.time_limit,
        config=args.config,
    )
    report["machine"] = machine
    problems = check(report, max_rss_slope_kib=args.max_rss_slope, max_fds_slope=args.max_fds_slope)
    report["problems"] = problems
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "per_node"}, indent=1))
    print("HELD" if not problems else "PROBLEMS:\n  " + "\n  ".join(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
