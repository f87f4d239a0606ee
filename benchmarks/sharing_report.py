"""The report of the sharing experiments (E1: specialists, E2: silo-4 / silo-2 / 2/2 and its control
silo-matched), rebuilt from the committed per-(arm, seed) summaries alone by one command: each experiment's
block of ``--report`` (between its markers), with what each arm spent a round and, for E2, its probe
against compute, and its probe-curve plot. E1's spec-2/2 run without the peer defence has a folder of its own
(``docs/sharing/e1-undefended``) and enters E1's block as one more arm. An experiment without summaries
yet keeps its block as it is.

    .venv/bin/python -m benchmarks.sharing_report   # docs/sharing.md, docs/sharing-e1.png, -e2.png
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from benchmarks.sharing.report import BLOCKS, EXPERIMENTS, FOLDERS, load_experiment
from benchmarks.sharing.sapo_report import write_report

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--summaries",
        type=Path,
        default=REPO / "docs" / "sharing",
        help="holds the summary folders " + ", ".join(f for folders in FOLDERS.values() for f in folders),
    )
    parser.add_argument("--report", type=Path, default=REPO / "docs" / "sharing.md")
    parser.add_argument("--plots", type=Path, default=REPO / "docs", help="sharing-<experiment>.png go here")
    args = parser.parse_args()
    if not args.report.exists():
        args.report.write_text("".join(f"{begin}\n{end}\n\n" for begin, end in BLOCKS.values()))
    for name, (make_report, make_plot) in EXPERIMENTS.items():
        parts = load_experiment(name, args.summaries)
        if not parts:
            folders = ", ".join(str(args.summaries / f) for f in FOLDERS[name])
            print(f"{name}: no summaries in {folders}; its block is left as it is", file=sys.stderr)
            continue
        plot = args.plots / f"sharing-{name}.png"
        make_plot(parts, plot)
        write_report(
            args.report, make_report(parts, os.path.relpath(plot, args.report.parent)), *BLOCKS[name]
        )
        print(f"{name}: {len(parts)} summaries -> {args.report}, {plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
