"""The poisoning harness: correct peer answers that carry a payload, against a node and its defences.

A node (the embedded SmolLM2 on node_configs/arithmetic-easy.yaml by default) is trained through the
project's own round; every round up to two attacker identities send it signed batches whose correct
completions carry a payload, which pass its real verifier and pool and fill its J = 2 peer groups
(``run.py`` says how, ``peer.py`` who the attackers are,
``measure.py`` what is measured, ``payloads.py`` the payloads). One arm per ``--defences``
name (``offpolicy.peer_defence``); ``--control`` runs the honest control of each instead (the same
attackers with clean correct completions). A table row per checkpoint is printed as it goes; each arm's
summary goes to ``--summary-dir``/<arm>-seed<seed>.json, and ``--json`` gets everything. docs/poisoning.md
has the commands and the results.

    .venv/bin/python -m benchmarks.poisoning --payload sentence-start --defences none span --rounds 40
    .venv/bin/python -m benchmarks.poisoning --control --defences none span --rounds 40
    .venv/bin/python -m benchmarks.poisoning --report      # the tables, from docs/poisoning/*.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from benchmarks.machine import describe_machine, machine_info
from benchmarks.poisoning.payloads import KINDS
from benchmarks.poisoning.report import report
from benchmarks.poisoning.run import (
    DEFAULT_CONFIG,
    TABLE_HEADER,
    ArmSpec,
    arm_config,
    run_arm,
    summary,
    table_line,
    write_summary,
)


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.poisoning", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--payload", choices=KINDS, default="sentence-start", help="what the attackers hide")
    parser.add_argument(
        "--defences",
        nargs="+",
        default=["none"],
        help="one arm per name, run with offpolicy.peer_defence=NAME",
    )
    parser.add_argument("--control", action="store_true", help="the honest control: no payload, same seeds")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--every", type=int, default=5, help="measure every k rounds (and at round 0)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--questions", type=int, default=8, help="held-out questions for attack success (x G)"
    )
    parser.add_argument("--prompts", type=int, default=4, help="fixed prompts for the payload log-prob")
    parser.add_argument(
        "--greedy", type=int, default=64, help="held-out questions answered greedily for attack success"
    )
    parser.add_argument("--attackers", type=int, choices=(1, 2), default=2, help="attacker identities")
    parser.add_argument("--config", default=DEFAULT_CONFIG)
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--summary-dir", type=Path, default=Path("docs/poisoning"), help="one JSON per arm")
    parser.add_argument("--json", type=Path, default=None, help="everything, all arms, as JSON")
    parser.add_argument(
        "--report", action="store_true", help="print the tables of the summaries in --summary-dir and exit"
    )
    parser.add_argument("--run-dir", type=Path, default=None, help="keep the node's run folders here")
    parser.add_argument(
        "--rotate",
        action="store_true",
        help="a fluent attacker sends every wording in turn, whatever the defence (arm name: ...-rotating)",
    )
    args = parser.parse_args()
    if args.report:
        print(report(args.summary_dir))
        return 0

    specs = [
        ArmSpec(
            defence=name,
            payload=args.payload,
            control=args.control,
            seed=args.seed,
            rounds=args.rounds,
            every=args.every,
            questions=args.questions,
            prompts=args.prompts,
            greedy=args.greedy,
            attackers=args.attackers,
            config=args.config,
            sets=tuple(args.sets),
            rotate=args.rotate,
        )  # fmt: skip
        for name in args.defences
    ]
    for spec in specs:  # every arm's config is checked before the first one runs for an hour
        arm_config(spec)
    machine = machine_info("benchmarks.poisoning")
    command = "python -m benchmarks.poisoning " + shlex.join(sys.argv[1:])
    extra = {"command": command, "machine": machine, "machine_line": describe_machine(machine, now=False)}
    print(f"machine: {describe_machine(machine)}", flush=True)
    everything: dict = {"command": command, "machine": machine, "arms": []}

    for spec in specs:
        print(TABLE_HEADER, flush=True)

        def on_checkpoint(run, measured, spec=spec) -> None:
            print(table_line(run, measured), flush=True)
            data = summary(run, extra)
            write_summary(args.summary_dir, data, spec)
            if args.json is not None:
                arms = [a for a in everything["arms"] if a["arm"] != spec.name] + [data]
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps({**everything, "arms": arms}, indent=1) + "\n")

        run_dir = args.run_dir / f"{spec.name}-seed{spec.seed}" if args.run_dir else None
        run = run_arm(spec, run_dir=run_dir, on_checkpoint=on_checkpoint)
        data = summary(run, extra)
        path = write_summary(args.summary_dir, data, spec)
        everything["arms"].append(data)
        print(f"{spec.name}: {len(run.rounds)} rounds in {run.wall_s:.0f}s; summary {path}", flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(everything, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
