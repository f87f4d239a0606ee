"""How silo-matched's settings (``arms.MATCHED_QUESTIONS``, ``arms.MATCHED_MAX_GROUPS``) follow from E2's
committed summaries: what a silo node that samples Q questions a round and trains on at most N informative
ones would keep, against what 2/2 kept. Reads summaries only; runs nothing.

The model: in round r each of a silo node's own groups is informative (a nonzero advantage) with the share
p_r that silo-4's and silo-2's own groups had at round r, pooled over nodes and seeds; nodes differ more than
a binomial says (silo-4's per-node counts out of 4 are overdispersed), so the informative count of Q is
beta-binomial with the intra-class correlation of those counts, by moments. Groups kept = min(N, informative),
averaged over the rounds; tokens trained = groups kept x the silo arms' tokens per kept group.

    .venv/bin/python -m benchmarks.sharing.matching   # the table behind the choice, from docs/sharing/e2
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

from benchmarks.sharing import arms as arm_settings
from benchmarks.sharing.experiments import by_arm
from benchmarks.sharing.report import load_experiment

SILOS = ("silo-4", "silo-2")  # whose own groups give the informative share
SWARM = "2/2"  # whose groups kept and tokens trained a round silo-matched matches
QUESTION_COUNTS = range(4, 17)


def _values(parts: dict[int, dict], field: str, rounds: int) -> list[list[float]]:
    """Per node of every seed, ``field`` over its first ``rounds`` rounds."""
    return [node["rounds"][field][:rounds] for part in parts.values() for node in part["nodes"]]


def informative_share(arms: dict[str, dict[int, dict]], rounds: int) -> list[float]:
    """Per round, the share of the silo arms' own groups that were informative."""
    kept = [row for arm in SILOS for row in _values(arms.get(arm, {}), "groups_kept", rounds)]
    local = [row for arm in SILOS for row in _values(arms.get(arm, {}), "groups_local", rounds)]
    return [sum(k[r] for k in kept) / sum(n[r] for n in local) for r in range(rounds)]


def overdispersion(arms: dict[str, dict[int, dict]], rounds: int) -> float:
    """The intra-class correlation of silo-4's per-node informative counts of 4, by moments: their
    variance over n p (1 - p), pooled over rounds, is 1 + (n - 1) rho (0 if they are binomial or tighter)."""
    kept = _values(arms["silo-4"], "groups_kept", rounds)
    observed = expected = 0.0
    for r in range(rounds):
        counts = [k[r] for k in kept]
        p = statistics.fmean(counts) / 4
        observed += statistics.pvariance(counts)
        expected += 4 * p * (1 - p)
    return max((observed / expected - 1) / 3, 0.0)


def _beta_binomial(k: int, n: int, p: float, rho: float) -> float:
    if rho <= 0 or p in (0.0, 1.0):
        return math.comb(n, k) * p**k * (1 - p) ** (n - k)
    a, b = p * (1 / rho - 1), (1 - p) * (1 / rho - 1)
    log = math.lgamma(k + a) + math.lgamma(n - k + b) - math.lgamma(n + a + b)
    log += math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    return math.comb(n, k) * math.exp(log)


def expected_kept(shares: list[float], questions: int, cap: int, rho: float) -> float:
    """Groups kept a round, mean over the rounds, by a node sampling ``questions`` and keeping ``cap``."""
    per_round = [
        sum(min(cap, k) * _beta_binomial(k, questions, p, rho) for k in range(questions + 1)) for p in shares
    ]
    return statistics.fmean(per_round)


def mean_per_round(parts: dict[int, dict], field: str, rounds: int) -> float:
    return statistics.fmean(v for row in _values(parts, field, rounds) for v in row)


def nearest_count(arms: dict[str, dict[int, dict]], cap: int, rounds: int) -> int:
    """The question count whose expected groups kept under ``cap`` is nearest 2/2's."""
    shares, rho = informative_share(arms, rounds), overdispersion(arms, rounds)
    target = mean_per_round(arms[SWARM], "groups_kept", rounds)
    return min(QUESTION_COUNTS, key=lambda q: abs(expected_kept(shares, q, cap, rho) - target))


def table(arms: dict[str, dict[int, dict]], rounds: int) -> list[str]:
    shares, rho = informative_share(arms, rounds), overdispersion(arms, rounds)
    silo = {arm: arms[arm] for arm in SILOS if arm in arms}
    per_group = sum(mean_per_round(p, "train_tokens", rounds) for p in silo.values()) / sum(
        mean_per_round(p, "groups_kept", rounds) for p in silo.values()
    )
    kept, tokens = (mean_per_round(arms[SWARM], f, rounds) for f in ("groups_kept", "train_tokens"))
    lines = [
        f"2/2 kept {kept:.2f} groups and trained {tokens:.0f} tokens a round; the silo arms' own groups were "
        f"informative {statistics.fmean(shares):.2f} of the time (round by round: "
        f"{' '.join(f'{p:.2f}' for p in shares)}), rho {rho:.3f}, {per_group:.0f} tokens a kept group.",
        "",
        "| questions a round | cap | expected groups kept | expected tokens trained |",
        "|---|---|---|---|",
    ]
    for cap in (3, 4):
        for q in QUESTION_COUNTS:
            e = expected_kept(shares, q, cap, rho)
            lines.append(f"| {q} | {cap} | {e:.2f} | {e * per_group:.0f} |")
    return lines


def main() -> int:
    arms = by_arm(load_experiment("e2", Path(__file__).resolve().parents[2] / "docs" / "sharing"))
    rounds = next(iter(arms[SWARM].values()))["setup"]["rounds"]
    print("\n".join(table(arms, rounds)))
    chosen = (arm_settings.MATCHED_QUESTIONS, arm_settings.MATCHED_MAX_GROUPS)
    print(f"\nchosen: {chosen[0]} questions, cap {chosen[1]}; nearest under that cap: "
          f"{nearest_count(arms, chosen[1], rounds)} questions")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
