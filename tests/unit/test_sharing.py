"""#28's pre-stated rules on constructed summaries: every E1 and E2 verdict can be reached, E2's control
(silo-matched) included, the paired intervals are scipy's on the per-seed means, and the area under a probe
curve, by round or by compute spent, is the hand-computed one. The report and its plots are built from
summaries on disk. No model runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from scipy import stats as scipy_stats

from benchmarks.sharing import compute, experiments
from benchmarks.sharing.report import (
    BLOCKS,
    EXPERIMENTS,
    load_experiment,
    seed_curves,
    time_spent,
)
from benchmarks.sharing.sapo_report import dump, load_summaries, summary_path, write_report

A, B = "basic_arithmetic", "propositional_logic"
SEEDS = range(6)
# per seed, small differences that do not cancel: the rules must see through seed-to-seed spread
JITTER = [0.004, -0.003, 0.001, -0.002, 0.003, -0.001]
NOISE = [0.08, -0.07, 0.01, -0.09, 0.06, 0.02]  # spread too wide for any claim at 6 seeds


def node(
    i: int, weights: dict[str, float], held_out: dict[str, float], probe: list[tuple[int, float]]
) -> dict:
    """A node's summary record: its weights, held-out pass@1 per task, a probe curve (every task alike)."""

    def scores(v: float) -> dict[str, float]:
        return {"pass@1": v, "score": v, "format": 1.0}

    lines = [
        {"round": r, "questions_per_task": 32, "by_task": {t: scores(v) for t in weights}, **scores(v),
         "seconds": 1.0}
        for r, v in probe
    ]  # fmt: skip
    by_task = {t: scores(v) for t, v in held_out.items()}
    return {
        "node": i,
        "weights": weights,
        "rounds": {},
        "probe": lines,
        "eval": {"pass@1": 0.0, "by_task": by_task},
    }


def summary(arm: str, seed: int, nodes: list[dict], *, local: int, peer: int) -> dict:
    setup = {"config": "x.yaml", "sets": [], "groups": 4, "rounds": 10, "probe_every": 5,
             "probe_questions": None, "eval_per_task": 500, "specialise": None}  # fmt: skip
    return {
        "arm": arm, "seed": seed, "table": "sharing", "what": arm, "local": local, "peer": peer,
        "setup": setup, "command": f"python -m benchmarks.sapo_table --arms {arm} --seeds {seed}",
        "machine_line": "test", "wall_s": 1.0, "eval_s": 1.0, "nodes": nodes,
    }  # fmt: skip


def flat_arm(arm: str, areas: list[float], *, local: int = 4, peer: int = 0) -> dict[int, dict]:
    """Two nodes per seed, their probes flat at ``areas[seed]`` +- 0.01 (the seed's mean: ``areas[seed]``)."""
    weights = {A: 1.0}
    return {
        s: summary(arm, s, [node(i, weights, {A: v}, [(0, v + d), (5, v + d), (10, v + d)])
                            for i, d in enumerate((-0.01, 0.01))], local=local, peer=peer)
        for s, v in zip(SEEDS, areas, strict=True)
    }  # fmt: skip


def e2(share: list[float], silo2: list[float]) -> dict[str, dict[int, dict]]:
    """silo-4 at 0.20 +- seed luck; 2/2 and silo-2 as offsets from it, seed by seed."""
    base = [0.20 + 0.03 * (s % 3) for s in SEEDS]
    return {
        "silo-4": flat_arm("silo-4", base),
        "2/2": flat_arm("2/2", [b + d for b, d in zip(base, share, strict=True)], local=2, peer=2),
        "silo-2": flat_arm("silo-2", [b + d for b, d in zip(base, silo2, strict=True)], local=2),
    }


def offset(mean: float, spread: list[float] = JITTER) -> list[float]:
    return [mean + j for j in spread]


@pytest.mark.parametrize(
    ("share", "silo2", "verdicts"),
    [
        (offset(0.05), NOISE, ["helps"]),
        (offset(-0.05), NOISE, ["hurts"]),
        (offset(0.0), NOISE, ["does not help here"]),
        (offset(0.0), offset(-0.05), ["does not help here", "only saves sampling"]),
        (NOISE, offset(0.0), ["batch size irrelevant"]),
        (offset(0.0), offset(0.0), ["does not help here", "batch size irrelevant"]),
        (NOISE, NOISE, ["inconclusive"]),
    ],
)
def test_every_e2_verdict_is_reachable(share, silo2, verdicts):
    share_c, batch_c, _ = experiments.e2_comparisons(e2(share, silo2))
    assert experiments.e2_verdicts(share_c, batch_c) == verdicts


def specialists(arm: str, seed: int, own: float, unsampled: float, *, peer: int) -> dict:
    """Nodes 0-1 sample A only, 2-3 B only; each scores ``own`` on its task and ``unsampled`` on the other."""
    nodes = []
    for i in range(4):
        mine, other = (A, B) if i < 2 else (B, A)
        weights = {mine: 1.0, other: 0.0}
        nodes.append(node(i, weights, {mine: own, other: unsampled}, [(0, 0.2), (10, own)]))
    return summary(arm, seed, nodes, local=4 - peer, peer=peer)


def e1(transfer: list[float], own: list[float]) -> dict[str, dict[int, dict]]:
    silo = {s: specialists("spec-silo", s, 0.40, 0.20 + 0.02 * s, peer=0) for s in SEEDS}
    swarm = {
        s: specialists("spec-2/2", s, 0.40 + own[s], 0.20 + 0.02 * s + transfer[s], peer=2) for s in SEEDS
    }
    return {"spec-silo": silo, "spec-2/2": swarm}


@pytest.mark.parametrize(
    ("transfer", "own", "verdicts"),
    [
        (offset(0.06), offset(0.0), ["peers teach the unsampled task", "own task non-inferior"]),
        (offset(-0.06), offset(0.0), ["sharing hurts the unsampled task", "own task non-inferior"]),
        (offset(0.0), offset(-0.02), ["no transfer", "own task non-inferior"]),
        (NOISE, offset(-0.05), ["transfer inconclusive", "own task not shown non-inferior"]),
        (offset(0.0), NOISE, ["no transfer", "own task not shown non-inferior"]),
    ],
)
def test_every_e1_verdict_is_reachable(transfer, own, verdicts):
    assert experiments.e1_verdicts(*experiments.e1_comparisons(e1(transfer, own))) == verdicts


def test_e1_compares_the_task_each_node_never_samples_paired_by_seed_as_scipy_does():
    transfer, _ = experiments.e1_comparisons(e1(NOISE, offset(0.0)))
    silo = [0.20 + 0.02 * s for s in SEEDS]  # every node's never-sampled task, per seed
    swarm = [v + n for v, n in zip(silo, NOISE, strict=True)]
    expected = scipy_stats.ttest_rel(swarm, silo).confidence_interval(0.95)
    assert (transfer.diff.lo, transfer.diff.hi) == pytest.approx((expected.low, expected.high), rel=1e-9)


@pytest.mark.parametrize("loss", [0.02, 0.03])
def test_own_task_non_inferiority_is_scipys_one_sided_test_at_2_5_percent(loss):
    _, own = experiments.e1_comparisons(e1(offset(0.0), offset(-loss)))
    expected = scipy_stats.ttest_rel([0.40 - loss + j for j in JITTER], [0.40] * 6).confidence_interval(0.95)
    assert (own.diff.lo, own.diff.hi) == pytest.approx((expected.low, expected.high), rel=1e-9)
    one_sided = scipy_stats.ttest_1samp(offset(-loss), -experiments.E1_OWN_TASK_MARGIN, alternative="greater")
    assert own.non_inferior == (one_sided.pvalue < 0.025) == (loss == 0.02)


def test_the_tost_of_a_comparison_is_two_one_sided_scipy_tests_against_the_margin():
    share, _, _ = experiments.e2_comparisons(e2(offset(0.01), NOISE))
    differences = offset(0.01)
    above = scipy_stats.ttest_1samp(differences, -experiments.E2_AREA_MARGIN, alternative="greater")
    below = scipy_stats.ttest_1samp(differences, experiments.E2_AREA_MARGIN, alternative="less")
    assert share.diff.mean == pytest.approx(0.01 + sum(JITTER) / 6)
    assert share.equivalent == (above.pvalue < 0.05 and below.pvalue < 0.05)


def test_a_seed_one_arm_lacks_is_left_out_and_named():
    arms = e2(offset(0.0), NOISE)
    del arms["silo-2"][5]
    _, batch, _ = experiments.e2_comparisons(arms)
    assert batch.diff.n == 5 and batch.unpaired == (5,)


def test_the_area_under_a_probe_curve_is_the_trapezoids_over_the_span():
    # (0, .1) -> (5, .2): 5 x .15 = .75; (5, .2) -> (10, .4): 5 x .3 = 1.5; (10, .4) -> (12, .4): .8
    assert experiments.probe_area([(0, 0.1), (5, 0.2), (10, 0.4)]) == pytest.approx(2.25 / 10)
    assert experiments.probe_area([(0, 0.1), (5, 0.2), (10, 0.4), (12, 0.4)]) == pytest.approx(3.05 / 12)
    assert experiments.probe_area([(0, 0.3)]) != experiments.probe_area([(0, 0.3)])  # one point: nan


def test_a_probe_curve_is_read_per_task_by_round_with_a_repeated_round_counted_once():
    record = node(0, {A: 1.0, B: 0.0}, {A: 0.5, B: 0.1}, [(0, 0.1), (5, 0.3), (10, 0.5), (10, 0.5)])
    record["probe"][1]["by_task"][B]["pass@1"] = 0.1  # B lags at round 5
    assert experiments.probe_curve(record, [A]) == [(0, 0.1), (5, 0.3), (10, 0.5)]
    assert experiments.probe_curve(record, experiments.tasks_of(record, "unsampled")) == [
        (0, 0.1),
        (5, 0.1),
        (10, 0.5),
    ]
    assert experiments.area("own")(record) == pytest.approx((5 * 0.2 + 5 * 0.4) / 10)
    assert experiments.final_pass1("unsampled")(record) == 0.1
    assert experiments.final_pass1("all")(record) == 0.3


def test_an_old_silo_summary_reads_as_silo_with_its_group_count():
    old = summary("silo", 0, [], local=4, peer=0)
    assert list(experiments.by_arm([old, summary("silo-2", 0, [], local=2, peer=0)])) == ["silo-4", "silo-2"]


def test_the_probe_band_is_the_interval_over_seeds_of_the_node_means():
    rounds, mean, half = seed_curves(flat_arm("silo-4", [0.1, 0.2, 0.3, 0.1, 0.2, 0.3]), "all")
    assert rounds == [0, 5, 10] and mean == pytest.approx([0.2] * 3)
    expected = scipy_stats.t.ppf(0.975, 5) * scipy_stats.sem([0.1, 0.2, 0.3] * 2)
    assert half == pytest.approx([expected] * 3)


def undefended(transfer: list[float]) -> dict[int, dict]:
    """spec-2/2 as E1's undefended variant runs it: the same arm name, with its own --set."""
    parts = e1(transfer, offset(0.0))["spec-2/2"]
    for part in parts.values():
        part["setup"] = {**part["setup"], "sets": ["offpolicy.peer_defence=none"]}
    return parts


def spending(seeds: dict[int, dict], kept: float, rounds: int = 10) -> dict[int, dict]:
    """``seeds`` with every node keeping ``kept`` groups a round, and spending in its 10 rounds just what
    the compute spans read (1,000 tokens sampled, 500 trained, 60 s a round)."""
    for part in seeds.values():
        for record in part["nodes"]:
            record["rounds"] = {
                "groups_local": [part["local"]] * rounds, "groups_peer": [part["peer"]] * rounds,
                "groups_kept": [kept] * rounds, "train_tokens": [500] * rounds,
                "sampled_tokens": [1000] * rounds, "seconds_total": [60.0] * rounds,
            }  # fmt: skip
    return seeds


def control(text: list[float], signal: list[float], kept: float = 2.9) -> dict[str, dict[int, dict]]:
    """silo-4 at 0.20 +- seed luck, silo-matched ``signal`` above it and 2/2 ``text`` above silo-matched,
    seed by seed; 2/2 keeps 2.93 groups a round, silo-matched ``kept``."""
    base = [0.20 + 0.03 * (s % 3) for s in SEEDS]
    matched = [b + d for b, d in zip(base, signal, strict=True)]
    swarm = [m + d for m, d in zip(matched, text, strict=True)]
    return {
        "silo-4": spending(flat_arm("silo-4", base), 1.86),
        "silo-matched": spending(flat_arm("silo-matched", matched, local=7), kept),
        "2/2": spending(flat_arm("2/2", swarm, local=2, peer=2), 2.93),
    }


@pytest.mark.parametrize(
    ("text", "signal", "kept", "verdicts"),
    [
        (offset(0.05), offset(0.05), 2.9,
         ["better learning per trained token", "more informative groups help a silo node"]),
        (offset(0.0), NOISE, 2.9,
         ["same learning per trained token", "more informative groups for a silo node inconclusive"]),
        (offset(-0.05), offset(0.0), 2.9,
         ["worse learning per trained token", "more informative groups do not help a silo node here"]),
        (NOISE, offset(-0.05), 2.9,
         ["learning per trained token inconclusive", "more informative groups hurt a silo node"]),
        # 2.5 against 2.93 is 15% short: the control did not match, so nothing is said of peers' text
        (offset(0.05), offset(0.0), 2.5,
         ["not matched (groups kept outside ±10% of 2/2's): no verdict",
          "more informative groups do not help a silo node here"]),
    ],
)  # fmt: skip
def test_every_control_verdict_is_reachable(text, signal, kept, verdicts):
    arms = control(text, signal, kept)
    match = experiments.e2_match(arms)
    assert (match.swarm, match.matched) == pytest.approx((2.93, kept))
    assert experiments.e2_control_verdicts(match, *experiments.e2_control_comparisons(arms)) == verdicts


def test_the_probe_against_compute_reads_the_probe_after_round_r_at_what_rounds_1_to_r_spent():
    record = node(0, {A: 1.0}, {A: 0.3}, [(0, 0.1), (2, 0.3), (4, 0.5)])
    record["rounds"] = {"train_tokens": [100, 300, 200, 200]}
    curve = compute.compute_curve(record, [A], "train_tokens")
    assert curve == [(0, 0.1), (400, 0.3), (800, 0.5)]
    # the first 600: 400 x (.1 + .3) / 2 = 80, then 200 x (.3 + .4) / 2 = 70, the last piece interpolated
    assert compute.area_within(curve, 600) == pytest.approx(150 / 600)
    assert compute.area_within(curve, 800) == pytest.approx(experiments.probe_area([(0, 0.1), (8, 0.5)]))
    assert compute.area_within(curve, 900) != compute.area_within(curve, 900)  # stops short: nan
    record["rounds"]["train_tokens"][1] = None  # an older summary without the field
    assert compute.compute_curve(record, [A], "train_tokens") == []


def test_a_parts_cpu_seconds_are_shared_over_its_nodes_and_rounds_where_recorded():
    part = summary("silo-4", 0, [node(i, {A: 1.0}, {A: 0.3}, []) for i in range(2)], local=4, peer=0)
    assert compute.cpu_per_node_round(part) != compute.cpu_per_node_round(part)  # not recorded: nan
    part["nodes_cpu_s"] = 800.0
    assert compute.cpu_per_node_round(part) == 40.0  # 2 nodes x 10 rounds


@pytest.mark.parametrize("experiment", ["e1", "e2"])
def test_the_report_and_its_plot_are_built_from_summaries_on_disk(tmp_path, experiment):
    folders = {"e1": e1(offset(0.06), offset(0.0)), "e1-undefended": {"spec-2/2": undefended(offset(0.09))}}
    if experiment == "e2":
        folders = {"e2": e2(offset(0.05), NOISE)}
    for folder, arms in folders.items():
        for seeds in arms.values():
            for part in seeds.values():
                (tmp_path / folder).mkdir(exist_ok=True)
                summary_path(tmp_path / folder, part["arm"], part["seed"]).write_text(dump(part))
    parts = load_experiment(experiment, tmp_path)
    make_report, make_plot = EXPERIMENTS[experiment]
    text = make_report(parts, "plot.png")
    make_plot(parts, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if experiment == "e1":
        assert "**peers teach the unsampled task**; **own task non-inferior**" in text
        assert text.count("**Verdict** (rules") == 1  # 6 seeds: E1's design
        # never sampled, per seed 0.20 + 0.02 s + 0.06 + jitter: 0.310 over the 6 seeds
        assert "| spec-2/2 | propositional_logic | that never sample it | 0.310 ± " in text
        # the undefended variant counts as an arm of its own, compared with spec-2/2 seed by seed
        assert (
            "- **spec-2/2 undefended - spec-2/2**, held-out pass@1 on the task a node never samples: +0.030"
            in text
        )
        assert "| spec-2/2 undefended | spec-2/2, with `offpolicy.peer_defence=none` | 6 |" in text
    else:
        assert "**helps**" in text and "- **2/2 - silo-4**, probe area: +0.050 over 6 seeds" in text
        assert (
            "**Interim verdict, 6 of the 8 seeds the design fixes** (rules" in text
            and "**Verdict**" not in text
        )
        assert "| silo-2 | basic_arithmetic | that sample it |" in text
        assert "**E2's control, silo-matched** (rules and margin ±0.02 fixed before its runs" in text
        assert "| silo-4 | 6 | not recorded | not recorded |" in text  # no rounds in these summaries
        assert "| silo-4 | 6 | 0.230 ± 0.028 | n/a | n/a | n/a |" in text
    assert f"python -m benchmarks.sapo_table --arms {next(iter(folders[experiment]))} --seeds 5" in text


def test_the_report_sets_the_control_against_2_2_and_shows_what_each_arm_spent(tmp_path):
    for seeds in control(offset(0.05), offset(0.05)).values():
        for part in seeds.values():
            summary_path(tmp_path, part["arm"], part["seed"]).write_text(dump(part))
    text = EXPERIMENTS["e2"][0](load_summaries(tmp_path), "plot.png")
    assert (
        "**Interim verdict, 6 of the 8 seeds the design fixes** on E2's control, silo-matched (rules" in text
        and "**better learning per trained token**; **more informative groups help a silo node**." in text
    )
    assert (
        "- Match: silo-matched kept 2.90 groups a round, 2/2 2.93 (-1.0%; the match holds within ±10%)."
        in text
    )
    assert "- **2/2 - silo-matched**, probe area at 2/2's groups kept and tokens trained: +0.050" in text
    # groups kept per 1,000 sampled: 2.93 / 1,000 a round; the rest as recorded, the same every seed
    assert (
        "| 2/2 | 6 | 2 + 2.00 | 2.93 ± 0.00 | 500 ± 0 | 1000 ± 0 | 60.0 ± 0.0 | 2.93 ± 0.00 | not recorded |"
        in text
    )
    assert "| silo-matched | 6 | 7 | 2.90 ± 0.00 |" in text
    # the probes are flat, so against compute they read as against rounds
    assert (
        "- **2/2 - silo-matched**, probe area over the first 5,000 tokens trained: +0.050 over 6 seeds"
        in text
    )
    make_plot = EXPERIMENTS["e2"][1]
    make_plot(load_summaries(tmp_path), tmp_path / "plot.png")
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_time_line_adds_evaluation_cpu_time_of_the_parts_that_record_it():
    parts = [summary("silo-4", s, [], local=4, peer=0) for s in range(3)]
    assert "CPU" not in time_spent(parts)
    parts[0]["eval_cpu_s"], parts[1]["eval_cpu_s"] = 3600.0, 1800.0
    assert time_spent(parts).endswith("evaluation CPU time 1.5 h over the 2 parts that record it.")


@pytest.mark.parametrize("experiment", ["e1", "e2"])
def test_the_committed_report_is_what_the_committed_summaries_make(tmp_path, experiment):
    """#28's figures must come from the summaries in docs/sharing/ alone: a summary added, changed or lost
    without rerunning ``benchmarks.sharing_report`` makes docs/sharing.md disagree with it."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    report = tmp_path / "sharing.md"
    report.write_text((docs / "sharing.md").read_text())
    make_report, _ = EXPERIMENTS[experiment]
    parts = load_experiment(experiment, docs / "sharing")
    assert parts, f"no committed summaries for {experiment}"
    write_report(report, make_report(parts, f"sharing-{experiment}.png"), *BLOCKS[experiment])
    assert report.read_text() == (docs / "sharing.md").read_text()
