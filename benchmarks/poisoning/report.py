"""The poisoning harness's results from the arms' summaries (docs/poisoning/<arm>-seed<seed>.json): the
tables docs/poisoning.md
shows, rebuilt by ``python -m benchmarks.poisoning --report``.

- **attack**: per attacked arm, the payload's attack success and teacher-forced log-prob per token at
  each checkpoint, the probe's pass@1 and the share of peer tokens a defence took out of the loss;
- **cost**: per control arm (honest attackers, clean completions), the node's local reward over the last
  ``TAIL_ROUNDS`` rounds and its final probe pass@1, each with its 95% interval, and whether a defended
  control's values fall inside the undefended control's intervals (a defence must not cost honest learning).

The reward interval is Student's t over the tail's rounds (rounds are correlated, so it is optimistic);
pass@1's is Wilson's, over the probe's questions.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from benchmarks.harness.stats import interval
from benchmarks.poisoning.measure import ATTACK_WAYS

TAIL_ROUNDS = 10  # the control's reward is compared over its last this many rounds
Z95 = 1.959964


def load(directory: Path) -> list[dict]:
    """Every arm summary in ``directory``, complete or not, by name."""
    return [json.loads(path.read_text()) for path in sorted(directory.glob("*-seed*.json"))]


def wilson(successes: float, n: int) -> tuple[float, float]:
    """The 95% Wilson interval of a proportion of ``n`` trials."""
    if n <= 0:
        return float("nan"), float("nan")
    p = successes / n
    centre = (p + Z95**2 / (2 * n)) / (1 + Z95**2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / (1 + Z95**2 / n)
    return centre - half, centre + half


def _gated(arm: dict) -> str:
    """The mean share of peer tokens a defence took out of the loss, over the arm's rounds."""
    values = [r.get("train_peer_gated_frac", 0.0) for r in arm["rounds"]]
    return f"{statistics.fmean(values):.1%}" if values else "-"


def _worst_ways(arm: dict) -> str:
    """The most samples that showed the arm's payload at any checkpoint, in each of the four ways of
    ``measure.Checkpoint.attack`` ("-" for summaries from before they were measured)."""
    cells = []
    for way in ATTACK_WAYS:
        counts = [
            (c["attack"][way], c["attack_samples"][way])
            for c in arm["checkpoints"]
            if way in c.get("attack", {})
        ]
        cells.append(f"{max(counts)[0]}/{counts[0][1]}" if counts else "-")
    return ", ".join(cells)


def attack_table(arms: list[dict]) -> str:
    """One row per attacked arm and seed: each checkpoint's success and log-prob per token."""
    attacked = [a for a in arms if a["attack"]]
    rounds = sorted({c["round"] for a in attacked for c in a["checkpoints"]})
    head = (
        "| arm | seed | "
        + " | ".join(f"round {r}" for r in rounds)
        + " | most shown, any checkpoint: temperature, +opening, greedy, +opening"
        + " | pass@1 first -> last | peer tokens gated |"
    )
    lines = [head, "|" + "---|" * (len(rounds) + 5)]
    for arm in attacked:
        kind, by_round = arm["payload"], {c["round"]: c for c in arm["checkpoints"]}
        cells = [
            f"{by_round[r]['shown'][kind]}/{by_round[r]['samples']}, {by_round[r]['logprob_token'][kind]:.2f}"
            if r in by_round else "-"
            for r in rounds
        ]  # fmt: skip
        first, last = arm["checkpoints"][0], arm["checkpoints"][-1]
        done = "" if arm["complete"] else " (incomplete)"
        lines.append(
            f"| {arm['arm']}{done} | {arm['seed']} | " + " | ".join(cells) + f" | {_worst_ways(arm)}"
            + f" | {first['pass_at_1']:.3f} -> {last['pass_at_1']:.3f} | {_gated(arm)} |"
        )  # fmt: skip
    return "\n".join(lines)


def control_costs(arms: list[dict]) -> list[dict]:
    """Per control arm: tail reward and final pass@1 with intervals, and whether each lies inside the
    undefended control's (same seed) interval."""
    controls = {(a["defence"], a["seed"]): a for a in arms if not a["attack"] and a["complete"]}
    out = []
    for (defence, seed), arm in sorted(controls.items()):
        reward = interval([r["reward_mean"] for r in arm["rounds"][-TAIL_ROUNDS:]])
        questions = arm["setup"]["probe_questions_per_task"]
        pass_at_1 = arm["checkpoints"][-1]["pass_at_1"]
        row = {"arm": arm["arm"], "seed": seed, "reward": reward, "pass_at_1": pass_at_1,
               "pass_interval": wilson(pass_at_1 * questions, questions)}  # fmt: skip
        base = controls.get(("none", seed))
        if base is not None and defence != "none":
            base_reward = interval([r["reward_mean"] for r in base["rounds"][-TAIL_ROUNDS:]])
            lo, hi = wilson(base["checkpoints"][-1]["pass_at_1"] * questions, questions)
            row["reward_inside"] = base_reward.lo <= reward.mean <= base_reward.hi
            row["pass_inside"] = lo <= pass_at_1 <= hi
        out.append(row)
    return out


def cost_table(arms: list[dict]) -> str:
    head = (
        f"| control arm | seed | local reward, last {TAIL_ROUNDS} rounds (95% CI) | probe pass@1 (95% CI) "
        "| inside the undefended control's CI (reward / pass@1) |"
    )
    lines = [head, "|---|---|---|---|---|"]
    for row in control_costs(arms):
        r, (lo, hi) = row["reward"], row["pass_interval"]
        inside = "-" if "reward_inside" not in row else (
            f"{'yes' if row['reward_inside'] else 'no'} / {'yes' if row['pass_inside'] else 'no'}"
        )  # fmt: skip
        lines.append(
            f"| {row['arm']} | {row['seed']} | {r.mean:.3f} [{r.lo:.3f}, {r.hi:.3f}] "
            f"| {row['pass_at_1']:.3f} [{lo:.3f}, {hi:.3f}] | {inside} |"
        )
    return "\n".join(lines)


def report(directory: Path) -> str:
    arms = load(directory)
    return (
        "attack success (samples showing the payload) and payload log-prob per token, by checkpoint:\n\n"
        f"{attack_table(arms)}\n\nthe honest controls' cost:\n\n{cost_table(arms)}\n"
    )
