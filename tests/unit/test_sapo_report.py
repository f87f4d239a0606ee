"""The multi-seed SAPO table: paired intervals against silo, verdicts, and resuming from summaries.

Synthetic summaries only (no model runs). The expected intervals are computed here by hand from the
paired differences and the standard deviation, written out here.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from scipy.stats import t as student_t

from benchmarks.harness.stats import Interval
from benchmarks.sapo_table import children_cpu_s
from benchmarks.sharing.sapo_report import (
    BEGIN,
    END,
    ROUND_FIELDS,
    dump,
    load_summaries,
    paired,
    pending,
    report,
    summary_path,
    verdict,
    write_report,
)

SILO = {  # seed -> per node, reward per round (cumulative per node: .3 .6 | .4 .4 | .6 .4)
    0: [[0.1, 0.2], [0.3, 0.3]],
    1: [[0.2, 0.2], [0.0, 0.4]],
    2: [[0.5, 0.1], [0.2, 0.2]],
}
SHARED = {  # cumulative per node: .8 .8 | .6 .6 | 1.0 .6  ->  paired differences .35 .2 .3
    0: [[0.4, 0.4], [0.3, 0.5]],
    1: [[0.3, 0.3], [0.2, 0.4]],
    2: [[0.6, 0.4], [0.3, 0.3]],
}
HAND_DIFFS = [0.35, 0.2, 0.3]


def part(arm: str, seed: int, rewards: list[list[float]], *, peer: int = 2, pass1: float = 0.5) -> dict:
    """A summary as benchmarks.sapo_table writes it, with ``rewards`` per node and round."""
    nodes = []
    for i, per_round in enumerate(rewards):
        rounds = {name: [0.0] * len(per_round) for name in ROUND_FIELDS}
        rounds |= {
            "reward_mean": per_round,
            "task_score_mean": [r / 2 for r in per_round],
            "sampled_tokens": [100 * (4 - peer)] * len(per_round),
            "groups_local": [4 - peer] * len(per_round),
            "groups_kept": [4] * len(per_round),
            "groups_peer": [peer] * len(per_round),
        }
        nodes.append({"node": i, "rounds": rounds, "eval": {"pass@1": pass1 + 0.01 * i, "score": pass1}})
    return {
        "arm": arm, "seed": seed, "table": "sharing", "what": arm, "local": 4 - peer, "peer": peer,
        "setup": {"config": "node_configs/arithmetic-easy.yaml", "sets": [], "groups": 4, "rounds": 2},
        "machine_line": "test machine", "wall_s": 60.0, "eval_s": 6.0, "nodes": nodes,
    }  # fmt: skip


def arms_of(table: dict[int, list[list[float]]], name: str, peer: int) -> dict[int, dict]:
    return {seed: part(name, seed, rewards, peer=peer) for seed, rewards in table.items()}


def hand_interval(diffs: list[float]) -> tuple[float, float]:
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    half = student_t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return mean - half, mean + half


def test_seeds_needed_is_the_first_count_whose_interval_excludes_zero():
    # mean 1, sd 1: t(5) / sqrt(6) = 2.571 / 2.449 > 1, t(6) / sqrt(7) = 2.447 / 2.646 < 1 (t tables)
    assert Interval(3, 1.0, 1.0).seeds_needed() == 7
    assert Interval(3, 1.0, 100.0).seeds_needed() is None  # more than MAX_SEEDS_SUGGESTED
    assert Interval(1, 1.0, float("nan")).seeds_needed() is None


def test_the_paired_interval_is_the_hand_computed_one():
    iv, missing = paired(arms_of(SHARED, "2/2", 2), arms_of(SILO, "silo", 0), "reward", rounds=2)
    lo, hi = hand_interval(HAND_DIFFS)
    assert (iv.n, missing) == (3, [])
    assert iv.mean == pytest.approx(0.85 / 3)
    assert (iv.lo, iv.hi) == (pytest.approx(lo, abs=1e-4), pytest.approx(hi, abs=1e-4))
    assert iv.significant and lo > 0


def test_significance_flips_when_the_interval_crosses_zero():
    flipped = {**SHARED, 1: [[0.0, 0.0], [0.2, 0.0]]}  # cumulative .0 .2: difference -.3 on seed 1
    iv, _ = paired(arms_of(flipped, "2/2", 2), arms_of(SILO, "silo", 0), "reward", rounds=2)
    lo, hi = hand_interval([0.35, -0.3, 0.3])
    assert (iv.lo, iv.hi) == (pytest.approx(lo, abs=1e-4), pytest.approx(hi, abs=1e-4))
    assert lo < 0 < hi and not iv.significant
    assert "not significant" in verdict("2/2", "reward", iv, [])
    worse, _ = paired(arms_of(SILO, "silo-like", 0), arms_of(SHARED, "silo", 2), "reward", rounds=2)
    assert worse.significant and "significantly worse" in verdict("x", "reward", worse, [])


def test_the_first_round_alone_is_compared_when_asked():
    iv, _ = paired(arms_of(SHARED, "2/2", 2), arms_of(SILO, "silo", 0), "reward", rounds=1)
    assert iv.mean == pytest.approx(sum([0.35 - 0.2, 0.25 - 0.1, 0.45 - 0.35]) / 3)


def test_an_arm_on_fewer_nodes_pairs_with_the_same_silo_nodes():
    one_node = {seed: part("2/2", seed, rewards[:1]) for seed, rewards in SHARED.items()}
    iv, _ = paired(one_node, arms_of(SILO, "silo", 0), "reward", rounds=2)
    assert iv.mean == pytest.approx(sum([0.8 - 0.3, 0.6 - 0.4, 1.0 - 0.6]) / 3)


def test_a_missing_silo_seed_is_reported_not_crashed():
    silo = {s: p for s, p in arms_of(SILO, "silo", 0).items() if s != 2}
    iv, missing = paired(arms_of(SHARED, "2/2", 2), silo, "reward", rounds=2)
    assert (iv.n, missing) == (2, [2])
    assert (iv.lo, iv.hi) == tuple(pytest.approx(x, abs=1e-4) for x in hand_interval(HAND_DIFFS[:2]))
    assert "[2]" in verdict("2/2", "reward", iv, missing)
    text = report(list(silo.values()) + list(arms_of(SHARED, "2/2", 2).values()), "plot.png")
    assert "Seed(s) [2] have no silo summary" in text


def test_one_seed_gives_no_interval_and_no_verdict_of_significance():
    iv, _ = paired({0: part("2/2", 0, SHARED[0])}, {0: part("silo", 0, SILO[0], peer=0)}, "reward", 2)
    assert iv.n == 1 and not iv.significant
    assert "too few for an interval" in verdict("2/2", "reward", iv, [])


def test_the_report_is_built_from_summaries_on_disk(tmp_path):
    for p in [*arms_of(SILO, "silo", 0).values(), *arms_of(SHARED, "2/2", 2).values()]:
        summary_path(tmp_path, p["arm"], p["seed"]).write_text(dump(p))
    assert sorted(f.name for f in tmp_path.iterdir())[:3] == [f"2-2-seed{s}.json" for s in range(3)]
    parts = load_summaries(tmp_path)
    text = report(parts, "plot.png")
    row = next(line for line in text.splitlines() if line.startswith("| 2/2 |"))
    lo, hi = hand_interval(HAND_DIFFS)
    assert f"[{lo:+.2f}, {hi:+.2f}]" in row
    assert "significantly better than silo" in text
    # silo samples 4 groups per node and round, 2/2 two: half the tokens
    assert "| 2/2 | 400 | 0.50 |" in text


def test_summaries_of_two_setups_are_refused(tmp_path):
    other = part("silo", 1, SILO[1], peer=0)
    other["setup"] = {**other["setup"], "rounds": 40}
    summary_path(tmp_path, "silo", 0).write_text(dump(part("silo", 0, SILO[0], peer=0)))
    summary_path(tmp_path, "silo", 1).write_text(dump(other))
    with pytest.raises(SystemExit, match="2 setups"):
        load_summaries(tmp_path)


def test_a_summary_is_strict_json_with_nan_as_null():
    summary = part("silo", 0, SILO[0], peer=0)
    summary["nodes"][0]["rounds"]["train_ess"] = [float("nan"), 1.0]
    text = dump(summary)
    assert "NaN" not in text and '"train_ess": [null,1.0]' in text
    assert json.loads(text)["nodes"][1]["rounds"]["reward_mean"] == SILO[0][1]


def test_the_report_replaces_only_the_text_between_its_markers(tmp_path):
    doc = tmp_path / "sapo-table.md"
    doc.write_text(f"# prose above\n{BEGIN}\nold table\n{END}\nprose below\n")
    write_report(doc, "new table")
    assert doc.read_text() == f"# prose above\n{BEGIN}\nnew table\n{END}\nprose below\n"
    bare = tmp_path / "bare.md"
    bare.write_text("hand-written, no markers\n")
    with pytest.raises(SystemExit, match="markers"):
        write_report(bare, "new table")
    assert bare.read_text() == "hand-written, no markers\n"


def test_parts_with_a_summary_are_skipped_unless_fresh(tmp_path):
    summary_path(tmp_path, "2/2", 0).write_text("{}")
    assert pending(["silo", "2/2"], [0, 1], tmp_path, fresh=False) == [("silo", 0), ("silo", 1), ("2/2", 1)]
    everything = pending(["silo", "2/2"], [0, 1], tmp_path, fresh=True)
    assert everything == [("silo", 0), ("silo", 1), ("2/2", 0), ("2/2", 1)]


def test_a_parts_cpu_time_counts_the_children_that_ended():
    """What a summary's ``nodes_cpu_s`` is made of: the CPU time of child processes once waited for."""
    before = children_cpu_s()
    subprocess.run([sys.executable, "-c", "sum(range(3_000_000))"], check=True)
    assert children_cpu_s() > before
