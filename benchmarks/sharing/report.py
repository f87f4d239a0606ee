"""The report of the sharing experiments E1 and E2 (``benchmarks.sharing_report``), built from the committed
per-(arm, seed) summaries of ``benchmarks.sapo_table`` alone: the pre-stated comparisons and verdicts of
``experiments``, what each arm spent (``compute``), per-task tables, the probe curves as plots (by round,
and for E2 by compute), and the commands that made the summaries.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from benchmarks.harness.stats import interval, t_quantile
from benchmarks.sharing import compute, experiments
from benchmarks.sharing.sapo_report import load_summaries, show

BLOCKS = {  # experiment -> the markers its generated block sits between in the report
    name: (f"<!-- sharing-{name}:begin (generated: python -m benchmarks.sharing_report) -->",
           f"<!-- sharing-{name}:end -->")
    for name in ("e1", "e2")
}  # fmt: skip
# an experiment's summary folders (under docs/sharing/) and the arm their parts count as (None: the arm
# they ran as); an arm run with other --set values has a folder of its own, as load_summaries requires
FOLDERS = {"e1": {"e1": None, "e1-undefended": experiments.E1_UNDEFENDED}, "e2": {"e2": None}}
ROLE_WORDS = {"own": "its own task", "unsampled": "the task it never samples", "all": "all tasks"}


def load_experiment(name: str, root: Path) -> list[dict]:
    """The parts of experiment ``name`` from its folders under ``root`` (``FOLDERS``), its own first."""
    parts = []
    for folder, arm in FOLDERS[name].items():
        found = load_summaries(root / folder) if (root / folder).is_dir() else []
        parts += [part if arm is None else as_arm(part, arm) for part in found]
    return parts


def as_arm(part: dict, arm: str) -> dict:
    """``part`` counted as ``arm``, its description naming the settings that make it a variant."""
    return {**part, "arm": arm, "what": f"{part['what']}, with `{' '.join(part['setup']['sets'])}`"}


def header(parts: list[dict], names: tuple[str, ...]) -> list[str]:
    """What ran: config, setup, machines, time, seeds per arm (``names`` first, in their order)."""
    setup = parts[0]["setup"]
    found = experiments.by_arm(parts)
    order = [n for n in names if n in found] + [n for n in found if n not in names]
    arms = {name: found[name] for name in order}
    sets = f" with `{' '.join(setup['sets'])}`" if setup["sets"] else ""
    split = setup.get("specialise")
    tasks = f"; tasks A, B = {', '.join(f'`{t}` {c}' for t, c in split.items())}" if split else ""
    return [
        f"Config `{setup['config']}`{sets}, {setup['groups']} groups per node and round, {setup['rounds']} "
        f"rounds{tasks}.  ",
        f"Probe every {setup.get('probe_every')} rounds ({probe_questions(parts)} questions per task, "
        f"greedy); final held-out evaluation: {setup.get('eval_per_task')} questions per task.  ",
        "Seeds: " + "; ".join(f"{name} {', '.join(map(str, seeds))}" for name, seeds in arms.items()) + "  ",
        "Machine(s): " + "; ".join(sorted({p["machine_line"] for p in parts})) + "  ",
        time_spent(parts),
    ]


def time_spent(parts: list[dict]) -> str:
    """Training and evaluation time summed over the parts. An evaluation that yielded the CPU to a part
    training beside it (docs/sharing.md) took far longer than its work: its CPU time says how much."""
    cpu = [p["eval_cpu_s"] for p in parts if "eval_cpu_s" in p]
    cpu_text = (
        f"; evaluation CPU time {sum(cpu) / 3600:.1f} h over the {len(cpu)} parts that record it"
        if cpu
        else ""
    )
    return (
        f"Time, summed over the parts: {sum(p['wall_s'] for p in parts) / 3600:.1f} h of training, "
        f"{sum(p['eval_s'] for p in parts) / 3600:.1f} h of evaluation (parts that overlapped count twice)"
        f"{cpu_text}."
    )


def probe_questions(parts: list[dict]) -> str:
    """The probe's questions per task, as the nodes wrote them (one number, or each that occurs)."""
    counts = {line["questions_per_task"] for p in parts for node in p["nodes"] for line in node["probe"]}
    return "/".join(map(str, sorted(counts))) or "no"


def show_comparison(c: experiments.Comparison, what: str, spec: str = "+.3f") -> str:
    """One line: the paired difference, its 95% interval, the 90% interval the TOST uses, the margin."""
    d = c.diff
    unpaired = f" Unpaired seed(s) {list(c.unpaired)} left out." if c.unpaired else ""
    if d.n < 2:
        return (
            f"- **{c.arm} - {c.baseline}**, {what}: {d.n} paired seed(s), too few for an interval.{unpaired}"
        )
    half90 = t_quantile(0.95, d.n - 1) * d.sd / math.sqrt(d.n)
    return (
        f"- **{c.arm} - {c.baseline}**, {what}: {d.mean:{spec}} over {d.n} seeds, 95% CI "
        f"[{d.lo:{spec}}, {d.hi:{spec}}]; 90% CI [{d.mean - half90:{spec}}, {d.mean + half90:{spec}}] "
        f"against the margin ±{c.margin:.3f}.{unpaired}"
    )


def arm_table(
    arms: dict[str, dict[int, dict]], names: tuple[str, ...], metrics: list[tuple[str, Callable]]
) -> list[str]:
    """Per arm: each metric's mean over seeds (each seed the mean over its nodes) ± its 95% half-width."""
    lines = [
        "| arm | what | seeds | " + " | ".join(label for label, _ in metrics) + " |",
        "|---|---|---|" + "---|" * len(metrics),
    ]
    for name in (n for n in names if n in arms):
        seeds = arms[name]
        cells = [
            show(interval(list(experiments.per_seed(seeds, value).values())), ".3f") for _, value in metrics
        ]
        what = next(iter(seeds.values()))["what"]
        lines.append(f"| {name} | {what} | {len(seeds)} | " + " | ".join(cells) + " |")
    return lines


def task_table(arms: dict[str, dict[int, dict]], names: tuple[str, ...]) -> list[str]:
    """Per arm and task, split by whether the nodes sample it: held-out pass@1, probe area, and the
    untrained model's probe (round 0; the same questions in every arm, so it should match across rows)."""
    lines = [
        "| arm | task | nodes | held-out pass@1 | probe area | untrained (probe, round 0) |",
        "|---|---|---|---|---|---|",
    ]
    for name in (n for n in names if n in arms):
        seeds = arms[name]
        first = next(iter(seeds.values()))["nodes"]
        for task in sorted(first[0]["weights"]):
            for sampled, who in ((True, "that sample it"), (False, "that never sample it")):
                if not any((node["weights"][task] > 0) == sampled for node in first):
                    continue
                cells = []
                for metric in (_task_held_out, _task_area, _task_untrained):
                    value = _only(task, sampled, metric)
                    cells.append(show(interval(list(experiments.per_seed(seeds, value).values())), ".3f"))
                lines.append(f"| {name} | {task} | {who} | " + " | ".join(cells) + " |")
    return lines


def _only(task: str, sampled: bool, metric: Callable[[dict, str], float]) -> Callable[[dict], float]:
    """``metric`` of ``task`` for nodes whose sampling of it is ``sampled``, nan for the others."""
    return lambda node: metric(node, task) if (node["weights"][task] > 0) == sampled else float("nan")


def _task_held_out(node: dict, task: str) -> float:
    return experiments.held_out(node, [task])


def _task_area(node: dict, task: str) -> float:
    return experiments.probe_area(experiments.probe_curve(node, [task]))


def _task_untrained(node: dict, task: str) -> float:
    curve = experiments.probe_curve(node, [task])
    return curve[0][1] if curve and curve[0][0] == 0 else float("nan")


def footer(parts: list[dict], plot_name: str) -> list[str]:
    """The plot, and the commands that made the summaries, once each."""
    return [
        f"![probe pass@1 per round, mean over seeds with its 95% band]({plot_name})",
        "",
        "The bands show the spread between seeds; the verdicts use the differences paired by seed, from "
        "which the seed-to-seed spread cancels.",
        "",
        "Commands:",
        "",
        "```",
        *sorted({p["command"] for p in parts}),
        "```",
    ]


RULES = "benchmarks/sharing/experiments.py"  # where the margins and verdict rules are written down


SPEND = (
    "What each arm spent, a round (mean over seeds of the mean over a seed's nodes and rounds, ± the "
    "half-width of its 95% interval). Groups kept are the informative groups trained on (zero-advantage "
    "groups never train). Node seconds are the wall seconds of a node's rounds, probes excluded: the closest "
    "recorded measure to CPU seconds (rounds record no CPU time, a swarm node's include its wait for peers' "
    "groups, and the 4 nodes of a part share 2 cores). Node CPU seconds are the part's node processes' CPU "
    "time over its nodes and rounds, start-up and probes included, in the summaries that record it "
    "(`nodes_cpu_s`, from 2026-11-29):"
)


def report_body(
    parts: list[dict],
    arm_names,
    verdict: str,
    comparisons: list[str],
    per_arm: str,
    metrics,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """One experiment's report: what ran, the verdict, its comparisons, per-arm tables (what each arm
    reached, what it spent, then ``extra``) and per-task tables."""
    arms = experiments.by_arm(parts)
    return [
        *header(parts, arm_names),
        "",
        verdict,
        "",
        *comparisons,
        "",
        "Per arm, mean over seeds of the mean over a seed's nodes, ± the half-width of its 95% interval"
        + per_arm
        + ":",
        "",
        *arm_table(arms, arm_names, metrics),
        "",
        SPEND,
        "",
        *compute.spend_table(arms, arm_names),
        "",
        *extra,
        "Per task:",
        "",
        *task_table(arms, arm_names),
        "",
    ]


def verdict_label(primary: experiments.Comparison, design_seeds: int) -> str:
    """ "Verdict" once the primary comparison pairs the seeds the design fixes; before, an interim one:
    stopping the runs when an interval first clears 0 would inflate the false-positive rate."""
    if primary.diff.n >= design_seeds:
        return "**Verdict**"
    return f"**Interim verdict, {primary.diff.n} of the {design_seeds} seeds the design fixes**"


def e1_report(parts: list[dict], plot_name: str) -> str:
    arms = experiments.by_arm(parts)
    transfer, own = experiments.e1_comparisons(arms)
    verdicts = experiments.e1_verdicts(transfer, own)
    metrics = [
        (f"held-out pass@1, {ROLE_WORDS[role]}", experiments.final_pass1(role))
        for role in ("unsampled", "own")
    ] + [(f"probe area, {ROLE_WORDS[role]}", experiments.area(role)) for role in ("unsampled", "own")]
    comparisons = [
        show_comparison(transfer, "held-out pass@1 on the task a node never samples (primary; no transfer "
                        f"if the 90% CI lies inside ±{experiments.E1_TRANSFER_MARGIN})"),
        show_comparison(own, "held-out pass@1 on the node's own task (secondary; non-inferior if the 95% "
                        f"CI's lower end is above -{experiments.E1_OWN_TASK_MARGIN})"),
    ]  # fmt: skip
    if experiments.E1_UNDEFENDED in arms:
        unsampled, own_task = experiments.e1_comparisons(arms, experiments.E1_UNDEFENDED, "spec-2/2")
        comparisons += [
            "",
            f"What the peer defence costs ({experiments.E1_UNDEFENDED} runs without it; no rule was fixed "
            "for this comparison before the runs, so it is an estimate, not a verdict):",
            "",
            show_comparison(unsampled, "held-out pass@1 on the task a node never samples"),
            show_comparison(own_task, "held-out pass@1 on the node's own task"),
        ]
    verdict = (
        f"{verdict_label(transfer, experiments.E1_SEEDS)} "
        f"(rules and margins fixed before the runs: `{RULES}`): **{verdicts[0]}**; **{verdicts[1]}**."
    )
    per_arm = " (a generalist samples both tasks, so it has no never-sampled task)"
    body = report_body(parts, experiments.E1_ARMS, verdict, comparisons, per_arm, metrics)
    return "\n".join([*body, *footer(parts, plot_name)])


def e2_report(parts: list[dict], plot_name: str) -> str:
    arms = experiments.by_arm(parts)
    share, batch, same_sampling = experiments.e2_comparisons(arms)
    verdicts = experiments.e2_verdicts(share, batch)
    metrics = [("probe area", experiments.area("all")), ("held-out pass@1", experiments.final_pass1("all"))]
    what = "probe area"
    held_out = [
        experiments.compare(
            arms, c.arm, c.baseline, experiments.final_pass1("all"), experiments.E2_AREA_MARGIN
        )
        for c in (share, batch)
    ]
    comparisons = [
        show_comparison(share, what),
        show_comparison(batch, what),
        show_comparison(same_sampling, what + " (same sampling; not a verdict of its own)"),
        "",
        "Held-out pass@1 at the end (500 questions per task; no rule was fixed for it before the runs, so "
        "these are estimates, not verdicts):",
        "",
        *(show_comparison(c, "held-out pass@1") for c in held_out),
    ]
    verdict = (
        f"{verdict_label(share, experiments.E2_SEEDS)} "
        f"(rules and margin ±{experiments.E2_AREA_MARGIN} fixed before the runs: `{RULES}`): "
        + ", ".join(f"**{v}**" for v in verdicts)
        + "."
    )
    comparisons += ["", *e2_control(arms)]
    per_arm = "; probe area = mean probe pass@1 over the rounds (trapezoids from round 0 to the last)"
    extra = e2_compute(arms)
    body = report_body(parts, experiments.E2_ARMS, verdict, comparisons, per_arm, metrics, extra)
    return "\n".join([*body, *footer(parts, plot_name)])


def e2_control(arms: dict[str, dict[int, dict]]) -> list[str]:
    """E2's control: 2/2 - silo-matched and silo-matched - silo-4, by the rules fixed before its runs."""
    rules = f"rules and margin ±{experiments.E2_AREA_MARGIN} fixed before its runs: `{RULES}`"
    if experiments.E2_MATCHED not in arms:
        return [f"**E2's control, {experiments.E2_MATCHED}** ({rules}): no summaries yet."]
    match = experiments.e2_match(arms)
    text, signal = experiments.e2_control_comparisons(arms)
    verdicts = experiments.e2_control_verdicts(match, text, signal)
    holds = "holds" if match.holds else "does not hold"
    return [
        f"{verdict_label(text, experiments.E2_SEEDS)} on E2's control, {experiments.E2_MATCHED} ({rules}): "
        + "; ".join(f"**{v}**" for v in verdicts)
        + ".",
        "",
        f"- Match: {experiments.E2_MATCHED} kept {match.matched:.2f} groups a round, 2/2 {match.swarm:.2f} "
        f"({match.ratio - 1:+.1%}; the match {holds} within ±{experiments.E2_MATCH_TOLERANCE:.0%}).",
        show_comparison(text, "probe area at 2/2's groups kept and tokens trained"),
        show_comparison(signal, "probe area, more informative own groups"),
    ]


def e2_compute(arms: dict[str, dict[int, dict]]) -> tuple[str, ...]:
    """Probe area against compute, per arm and 2/2 against the silo arms: estimates, not verdicts."""
    return (
        "Probe area against compute: the mean probe pass@1 over the first span of each measure instead of "
        "over the rounds, so the arms compare at equal compute (spans in `experiments.COMPUTE_SPANS`, each "
        "below the least any E2 node spent in 40 rounds; n/a: the nodes' records stop short of it). No rule "
        "was fixed for these before silo-4, silo-2 and 2/2 ran, so they are estimates, not verdicts:",
        "",
        *compute.area_table(arms, experiments.E2_ARMS),
        "",
        *(
            show_comparison(c, what)
            for what, c in compute.compute_comparisons(arms, ("silo-4", experiments.E2_MATCHED))
        ),
        "",
    )


def seed_curves(seeds: dict[int, dict], role: str) -> tuple[list[int], list[float], list[float]]:
    """Rounds probed in every seed; per round the mean over seeds (each seed the mean over its nodes)
    and the half-width of its 95% interval (nan with one seed)."""
    per_seed: list[dict[int, float]] = []
    for part in seeds.values():
        curves = [
            dict(experiments.probe_curve(node, experiments.tasks_of(node, role))) for node in part["nodes"]
        ]
        rounds = set.intersection(*(set(c) for c in curves))
        per_seed.append({r: sum(c[r] for c in curves) / len(curves) for r in rounds})
    rounds = sorted(set.intersection(*(set(c) for c in per_seed)))
    intervals = [interval([c[r] for c in per_seed]) for r in rounds]
    return rounds, [iv.mean for iv in intervals], [iv.half for iv in intervals]


Panel = tuple[str, list[tuple[str, str]], str | None]  # title, [(arm, role)], a compute field or None


def plot_probe(arms: dict[str, dict[int, dict]], panels: list[Panel], path: Path) -> None:
    """One panel per (title, [(arm, role)], field), two to a row: probe pass@1 per round, mean over seeds,
    95% band (cut to pass@1's range [0, 1]: with few seeds the t interval spans more than the metric can);
    with a compute ``field``, against its mean cumulative spend instead, the span read marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(2, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.2 * rows), squeeze=False)
    for ax, (title, lines, field) in zip(axes.flat, panels, strict=False):
        for name, role in lines:
            if name not in arms:
                continue
            label = f"{name} ({len(arms[name])} seeds)" + (f", {ROLE_WORDS[role]}" if role != "all" else "")
            if field is not None:
                ax.plot(*compute.seed_compute_curves(arms[name], role, field), marker="o", markersize=3,
                        label=label)  # fmt: skip
                continue
            rounds, mean, half = seed_curves(arms[name], role)
            (line,) = ax.plot(rounds, mean, marker="o", markersize=3, label=label)
            if len(arms[name]) > 1:
                lo = [max(0.0, m - h) for m, h in zip(mean, half, strict=True)]
                hi = [min(1.0, m + h) for m, h in zip(mean, half, strict=True)]
                ax.fill_between(rounds, lo, hi, color=line.get_color(), alpha=0.15)
        if field is not None:
            ax.axvline(experiments.COMPUTE_SPANS[field], color="grey", linestyle=":", label="span read")
        ax.set_title(title)
        ax.set_xlabel("round" if field is None else f"{compute.COMPUTE_WORDS[field]}, cumulative")
        ax.set_ylabel("probe pass@1 (greedy)")
        ax.grid(alpha=0.3)
        ax.legend()
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_e1(parts: list[dict], path: Path) -> None:
    def lines(role: str) -> list[tuple[str, str]]:
        specialists = ("spec-silo", "spec-2/2", experiments.E1_UNDEFENDED)
        return [(name, role) for name in specialists] + [("generalist-silo", "all")]

    panels: list[Panel] = [
        ("the task a node never samples", lines("unsampled"), None),
        ("the node's own task", lines("own"), None),
    ]
    plot_probe(experiments.by_arm(parts), panels, path)


def plot_e2(parts: list[dict], path: Path) -> None:
    """Probe pass@1 against rounds, and against each compute measure (mean over tasks)."""
    lines = [(name, "all") for name in experiments.E2_ARMS]
    panels: list[Panel] = [("mean over tasks, by round", lines, None)]
    panels += [(f"by {compute.COMPUTE_WORDS[f]}", lines, f) for f in experiments.COMPUTE_SPANS]
    plot_probe(experiments.by_arm(parts), panels, path)


EXPERIMENTS = {"e1": (e1_report, plot_e1), "e2": (e2_report, plot_e2)}
