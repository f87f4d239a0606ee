"""A Sybil flood (512 fresh identities by default) against a 4-node honest swarm and a newcomer.

The driver is ``benchmarks/reliability/sybil_flood.py``: its docstring says what runs and what is measured;
``check`` there says what must hold. Exits 1 on a problem.

    .venv/bin/python -m benchmarks.sybil_flood --identities 512 --json runs/flood/report.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from benchmarks.machine import describe_machine, machine_info
from benchmarks.reliability.sybil_flood import check, run_flood


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4, help="honest nodes (the newcomer comes on top)")
    parser.add_argument("--identities", type=int, default=512, help="Sybil identities, all hosts together")
    parser.add_argument("--hosts", type=int, default=4, help="attacker processes (libp2p hosts)")
    parser.add_argument(
        "--flood", type=float, default=120.0, help="seconds the flood goes on with the newcomer"
    )
    parser.add_argument("--deadline", type=float, default=6.0, help="swarm.share_deadline_s")
    parser.add_argument("--time-limit", type=float, default=900.0, help="longest run (s)")
    parser.add_argument("--workdir", type=Path, default=None, help="run folders (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="write the report as JSON here")
    args = parser.parse_args()

    machine = machine_info("benchmarks.sybil_flood")
    print(f"machine: {describe_machine(machine)}", flush=True)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="swarmnode-flood-"))
    report = run_flood(
        workdir, nodes=args.nodes, identities=args.identities, hosts=args.hosts, flood_s=args.flood,
        deadline_s=args.deadline, time_limit_s=args.time_limit,
    )  # fmt: skip
    report["machine"] = machine
    report["problems"] = problems = check(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    print("HELD" if not problems else "PROBLEMS:\n  " + "\n  ".join(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
