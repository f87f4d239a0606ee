"""Chaos: a tiny-model swarm while nodes are killed, checkpoints corrupted, a disk fills and a clock jumps.

The driver, shared with the short version in tests/integration/test_chaos.py, is
``benchmarks/reliability/chaos.py``: its docstring says what runs and what must hold. Exits 1 on a problem.

    sudo .venv/bin/python -m benchmarks.chaos --nodes 8 --rounds 12 --kills 4 --json runs/chaos/report.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from benchmarks.machine import describe_machine, machine_info
from benchmarks.reliability.chaos import run_chaos


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--kills", type=int, default=4)
    parser.add_argument("--deadline", type=float, default=6.0, help="swarm.share_deadline_s")
    parser.add_argument("--checkpoint-every", type=int, default=2)
    parser.add_argument("--clock-jump", type=float, default=20.0, help="seconds node01's clock jumps")
    parser.add_argument("--no-disk-full", action="store_true", help="skip the tmpfs part (needs root)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-limit", type=float, default=1800.0)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    machine = machine_info("benchmarks.chaos")
    print(f"machine: {describe_machine(machine)}", flush=True)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="swarmnode-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    report = run_chaos(
        workdir, nodes=args.nodes, rounds=args.rounds, kills=args.kills, deadline_s=args.deadline,
        checkpoint_every=args.checkpoint_every, clock_jump_s=args.clock_jump, disk_full=not args.no_disk_full,
        seed=args.seed, time_limit_s=args.time_limit,
    )  # fmt: skip
    report["machine"] = machine
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k not in ("per_node", "machine")}, indent=1))
    print("HELD" if not report["problems"] else "PROBLEMS:\n  " + "\n  ".join(report["problems"]))
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
