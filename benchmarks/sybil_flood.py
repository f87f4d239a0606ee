"""A Sybil flood (512 fresh identities by default) against a 4-node honest swarm and a newcomer; with
``--mix``, the Sybil mix instead: one hostile process with 256 identities (canned, silent, future-dated,
churn) against a 4-node honest swarm.

The drivers are ``benchmarks/reliability/sybil_flood.py`` and ``benchmarks/reliability/sybil_mix.py``:
their docstrings say what runs and what is measured; ``check`` in each says what must hold. Exits 1 on a
problem.

    .venv/bin/python -m benchmarks.sybil_flood --identities 512 --json runs/flood/report.json
    .venv/bin/python -m benchmarks.sybil_flood --mix --identities 256 --json runs/mix/report.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from benchmarks.machine import describe_machine, machine_info
from benchmarks.reliability import sybil_flood, sybil_mix


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mix", action="store_true", help="the Sybil mix (one hostile process) instead")
    parser.add_argument("--nodes", type=int, default=4, help="honest nodes (the flood's newcomer on top)")
    parser.add_argument(
        "--identities", type=int, default=None, help="Sybil identities in all (flood 512, mix 256)"
    )
    parser.add_argument("--hosts", type=int, default=4, help="the flood's attacker processes (libp2p hosts)")
    parser.add_argument(
        "--flood", type=float, default=None, help="seconds the attack goes on (flood 120, mix 180)"
    )
    parser.add_argument("--deadline", type=float, default=6.0, help="swarm.share_deadline_s")
    parser.add_argument("--time-limit", type=float, default=900.0, help="longest run (s)")
    parser.add_argument("--workdir", type=Path, default=None, help="run folders (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="write the report as JSON here")
    args = parser.parse_args()

    name = "benchmarks.sybil_flood" + (" --mix" if args.mix else "")
    machine = machine_info(name)
    print(f"machine: {describe_machine(machine)}", flush=True)
    prefix = "swarmnode-mix-" if args.mix else "swarmnode-flood-"
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix=prefix))
    common = {"nodes": args.nodes, "deadline_s": args.deadline, "time_limit_s": args.time_limit}
    if args.mix:
        report = sybil_mix.run_mix(
            workdir, identities=args.identities or 256, attack_s=args.flood or 180.0, **common
        )
        problems = sybil_mix.check(report)
    else:
        report = sybil_flood.run_flood(
            workdir, identities=args.identities or 512, hosts=args.hosts, flood_s=args.flood or 120.0,
            **common,
        )  # fmt: skip
        problems = sybil_flood.check(report)
    report["machine"] = machine
    report["problems"] = problems
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    print("HELD" if not problems else "PROBLEMS:\n  " + "\n  ".join(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
