"""benchmarks.poisoning --report (benchmarks/poisoning/report.py): the attack table reads each
arm's own payload, and a defended control is judged against the undefended control of its seed."""

from __future__ import annotations

import json

import pytest

from benchmarks.poisoning.measure import ATTACK_WAYS
from benchmarks.poisoning.report import attack_table, control_costs, load, report, wilson


def _arm(defence: str, *, attack: bool, rewards: list[float], pass_at_1: float) -> dict:
    kinds = {"sentence-start": 0, "link": 0}
    checkpoint = {
        "round": 0, "samples": 64, "shown": {**kinds, "sentence-start": 3},
        "logprob_token": {"sentence-start": -2.5, "link": -9.0}, "pass_at_1": pass_at_1,
    }  # fmt: skip
    return {
        "arm": f"{'sentence-start' if attack else 'control'}-{defence}", "attack": attack,
        "payload": "sentence-start" if attack else None, "defence": defence, "seed": 0, "complete": True,
        "setup": {"probe_questions_per_task": 32}, "checkpoints": [checkpoint],
        "rounds": [{"reward_mean": r, "train_peer_gated_frac": 0.25} for r in rewards],
    }  # fmt: skip


def test_wilson_bounds_are_where_the_score_test_just_rejects():
    """Wilson's interval is every p0 whose score test |p - p0| <= z sqrt(p0 (1 - p0) / n) passes."""
    z, n, p = 1.959964, 32, 8 / 32
    lo, hi = wilson(8, n)
    for bound in (lo, hi):
        assert abs(p - bound) == pytest.approx(z * (bound * (1 - bound) / n) ** 0.5, rel=1e-9)
    assert 0 < lo < p < hi < 1


def test_a_defended_control_is_judged_against_the_undefended_one():
    steady = [0.30, 0.32, 0.31, 0.29, 0.30, 0.31, 0.30, 0.32, 0.29, 0.31]
    arms = [
        _arm("none", attack=False, rewards=steady, pass_at_1=0.25),
        _arm("span", attack=False, rewards=steady, pass_at_1=0.28),
        _arm("rescue", attack=False, rewards=[r - 0.1 for r in steady], pass_at_1=0.0),
    ]
    rows = {row["arm"]: row for row in control_costs(arms)}
    assert "reward_inside" not in rows["control-none"]
    assert rows["control-span"]["reward_inside"] and rows["control-span"]["pass_inside"]
    assert not rows["control-rescue"]["reward_inside"] and not rows["control-rescue"]["pass_inside"]


def test_the_report_reads_the_summaries_in_a_folder(tmp_path):
    for arm in (_arm("none", attack=True, rewards=[0.3], pass_at_1=0.3),):
        (tmp_path / f"{arm['arm']}-seed0.json").write_text(json.dumps(arm))
    assert [a["arm"] for a in load(tmp_path)] == ["sentence-start-none"]
    text = report(tmp_path)
    assert "| sentence-start-none | 0 | 3/64, -2.50 |" in text and "25.0%" in text


def test_the_attack_table_shows_the_most_samples_that_showed_the_payload_in_each_way():
    arm = _arm("span_drift", attack=True, rewards=[0.3], pass_at_1=0.25)
    ways = ATTACK_WAYS
    later = {**arm["checkpoints"][0], "round": 10}
    arm["checkpoints"][0].update(
        attack=dict(zip(ways, (0, 2, 1, 0), strict=True)), attack_samples=dict.fromkeys(ways, 64)
    )
    later.update(attack=dict(zip(ways, (1, 0, 5, 0), strict=True)), attack_samples=dict.fromkeys(ways, 64))
    arm["checkpoints"].append(later)
    old = _arm("none", attack=True, rewards=[0.3], pass_at_1=0.25)  # measured before the four ways
    table = attack_table([arm, old])
    assert "| 1/64, 2/64, 5/64, 0/64 |" in table and "| -, -, -, - |" in table
