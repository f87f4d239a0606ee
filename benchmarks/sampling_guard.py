"""Did sampling get slower? ``bench sample`` at a reference commit and at this tree, in one call.

    python -m benchmarks.sampling_guard REF [--head REV] [--repeats 2] [--min-ratio 0.9] [--json FILE]

Runs ``python -m benchmarks.bench sample`` with this interpreter (the same venv: torch, transformers and
vLLM do not move between the two sides) in a temporary git worktree of ``REF`` and then in this working
tree (or a worktree of ``--head``), and prints each figure of the two with their ratio: tokens/s of
vLLM, of transformers ``generate`` (the baseline) and of the transformers backend's own decode loop, and
the seconds of vLLM's weight sync and engine start. A tokens/s ratio below ``--min-ratio`` (or a seconds
ratio above its inverse) is flagged and the exit status is 1, so a change that slows sampling shows as a
ratio before it lands. The two sides run one after the other: on a loaded machine run ``--rounds 2``
(REF, head, REF, head; figures summed) or compare on an idle one. Before a9feb44 the benchmark called the
``generate`` baseline ``transformers`` and had no decode loop of its own: such a side is read that way.
docs/performance.md, "Sampling speed", has the figures this found.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# figure -> True where more is better (tokens/s), False where less is (seconds)
FIGURES = {
    "vllm_tok_s": True,
    "generate_tok_s": True,
    "transformers_tok_s": True,
    "sync_s_mean": False,
    "vllm_start_s": False,
}


def normalise(sample: dict) -> dict:
    """One side's ``bench sample`` figures under today's names (module docstring)."""
    if "generate_tok_s" not in sample:  # before a9feb44: "transformers" was the generate baseline
        sample = {**sample, "generate_tok_s": sample.get("transformers_tok_s"), "transformers_tok_s": None}
    return {name: sample[name] for name in FIGURES if sample.get(name) is not None}


def run_bench(tree: Path, repeats: int, out: Path) -> dict:
    """``bench sample`` on the code in ``tree``, with this interpreter; its figures."""
    env = {**os.environ, "PYTHONPATH": str(tree)}  # the tree's swarmnode, not the installed one
    where = subprocess.run(
        [sys.executable, "-c", "import swarmnode; print(swarmnode.__file__)"],
        cwd=tree, env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    if not Path(where).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"{tree}: python imports swarmnode from {where}, not from the tree")
    cmd = [sys.executable, "-m", "benchmarks.bench", "sample", "--repeats", str(repeats), "--json", str(out)]
    print(f"  {tree}: {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    return normalise(json.loads(out.read_text())["sample"])


def compare(ref: dict, head: dict, min_ratio: float) -> tuple[list[str], bool]:
    """Table lines and whether any figure is flagged (module docstring)."""
    lines = [f"| {'figure':<20} | {'ref':>9} | {'head':>9} | {'head/ref':>8} |", "|---|---|---|---|"]
    flagged = False
    for name, more_is_better in FIGURES.items():
        if name not in ref or name not in head:
            continue
        ratio = head[name] / ref[name]
        slower = ratio < min_ratio if more_is_better else ratio > 1 / min_ratio
        flagged |= slower
        mark = "  SLOWER" if slower else ""
        lines.append(f"| {name:<20} | {ref[name]:>9.3f} | {head[name]:>9.3f} | {ratio:>7.2f}x |{mark}")
    return lines, flagged


def _mean(runs: list[dict]) -> dict:
    return {name: sum(r[name] for r in runs) / len(runs) for name in runs[0] if all(name in r for r in runs)}


def git(*args: str) -> None:
    subprocess.run(["git", "-C", str(REPO), *args], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("ref", help="the reference commit (e.g. the last release, or main before a change)")
    parser.add_argument("--head", help="the commit to check (default: this working tree, uncommitted too)")
    parser.add_argument("--repeats", type=int, default=2, help="bench sample's timed runs per backend")
    parser.add_argument("--rounds", type=int, default=1, help="ref/head alternations (figures averaged)")
    parser.add_argument("--min-ratio", type=float, default=0.9, help="flag tokens/s below this x ref's")
    parser.add_argument("--json", type=Path, help="also write both sides' figures and the ratios here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="sampling-guard-") as tmp:
        trees = {}
        for side, rev in (("ref", args.ref), ("head", args.head)):
            if rev is None:
                trees[side] = REPO
                continue
            trees[side] = Path(tmp) / side
            git("worktree", "add", "--detach", "-q", str(trees[side]), rev)
        try:
            runs: dict[str, list[dict]] = {"ref": [], "head": []}
            for i in range(args.rounds):
                for side in ("ref", "head"):
                    runs[side].append(run_bench(trees[side], args.repeats, Path(tmp) / f"{side}{i}.json"))
        finally:
            for tree in trees.values():
                if tree != REPO:
                    git("worktree", "remove", "--force", str(tree))
    ref, head = _mean(runs["ref"]), _mean(runs["head"])
    lines, flagged = compare(ref, head, args.min_ratio)
    print(f"\nref {args.ref}, head {args.head or 'working tree'}:")
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({"ref": ref, "head": head, "flagged": flagged}, indent=1))
    if flagged:
        print(f"\nsampling got slower: a figure moved past {args.min_ratio}x of {args.ref}'s")
        sys.exit(1)


if __name__ == "__main__":
    main()
