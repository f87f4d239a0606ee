"""The SAPO table over seeds (``benchmarks.sapo_table``), from the committed summaries alone
(``docs/sapo/<arm>-seed<s>.json``).

One summary holds one (arm, seed) of ``benchmarks.sapo_table``: per node its per-round records and the
held-out evaluation of its final checkpoint. Seed s gives node i the same question-stream seed and
training seed in every arm, so an arm is compared with silo *paired by seed*: d_s = arm_s - silo_s (each
the mean over the arm's nodes, silo over the same node indices), and the 95% confidence interval of the
mean of d is Student's t with n_seeds - 1 degrees of freedom. Between-seed variance (initial luck of a
node's questions and samples) cancels in d; what is left is what the arm changes. Whether two arms of a
seed answer the same questions depends on the draw: now they do (question j of round r does not
depend on how many a node takes a round); the summaries in docs/sapo/ predate that, and there a silo
node (items 4r..4r+3 of round r) and a 2/2 node (items 2r, 2r+1) answered different questions.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from benchmarks.harness.stats import MAX_SEEDS_SUGGESTED, Interval, interval

BEGIN = "<!-- sapo-seeds:begin (generated: python -m benchmarks.sapo_table --report-only) -->"
END = "<!-- sapo-seeds:end -->"
# what a summary keeps of each round record: the table's inputs and the diagnostics that explain it
ROUND_FIELDS = (
    "reward_mean", "task_score_mean", "sampled_tokens", "format_rate", "groups_local", "groups_kept",
    "groups_peer", "groups_replayed", "reward_peer_mean", "seconds_total", "train_tokens",
    "train_is_weight_max", "train_ess", "train_clip_low_frac", "train_clip_high_frac",
)  # fmt: skip
METRICS = {  # per node, one number: name -> what it is
    "reward": "cumulative reward",
    "task": "cumulative task score",
    "tokens": "tokens sampled",
    "pass1": "held-out pass@1",
}


def slug(arm: str) -> str:
    """A file-safe arm name: "2/2" -> "2-2"."""
    return arm.replace("/", "-")


def summary_path(folder: Path, arm: str, seed: int) -> Path:
    return folder / f"{slug(arm)}-seed{seed}.json"


def dump(summary: dict) -> str:
    """JSON with NaN as null (strict JSON) and every list of numbers on one line (a diffable file)."""
    text = json.dumps(_nan_to_none(summary), indent=1)
    return re.sub(r"\[(?:[-+.\deE,\s]|null)*\]", lambda m: re.sub(r"\s+", "", m.group()), text) + "\n"


def _nan_to_none(value):
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_nan_to_none(v) for v in value]
    return value


def pending(arms: list[str], seeds: list[int], folder: Path, fresh: bool) -> list[tuple[str, int]]:
    """The (arm, seed) parts still to run: those without a summary in ``folder``, or all with ``fresh``."""
    return [(a, s) for a in arms for s in seeds if fresh or not summary_path(folder, a, s).exists()]


def load_summaries(folder: Path) -> list[dict]:
    """Every summary in ``folder``; all must share one setup (config, --set, groups, rounds), since
    the table compares arms, not setups: another setup belongs in another folder."""
    parts = [json.loads(p.read_text()) for p in sorted(folder.glob("*-seed*.json"))]
    setups = {json.dumps(p["setup"], sort_keys=True) for p in parts}
    if len(setups) > 1:
        raise SystemExit(f"{folder}: summaries of {len(setups)} setups ({sorted(setups)}); one per folder")
    return parts


def node_values(part: dict, metric: str, rounds: int) -> list[float]:
    """Per node of one (arm, seed): ``metric`` over its first ``rounds`` rounds (pass@1: its final
    checkpoint; nan for a node without one)."""
    if metric == "pass1":
        return [node["eval"]["pass@1"] if node["eval"] else float("nan") for node in part["nodes"]]
    field = {"reward": "reward_mean", "task": "task_score_mean", "tokens": "sampled_tokens"}[metric]
    return [sum(node["rounds"][field][:rounds]) for node in part["nodes"]]


def part_value(part: dict, metric: str, rounds: int, nodes: int | None = None) -> float:
    """Mean over the first ``nodes`` nodes (all by default) of ``node_values``."""
    values = [v for v in node_values(part, metric, rounds)[:nodes] if v == v]
    return statistics.fmean(values) if values else float("nan")


def over_seeds(seeds: dict[int, dict], metric: str, rounds: int) -> Interval:
    """An arm's ``metric`` per seed (mean over its nodes), as an interval over seeds."""
    return interval([part_value(p, metric, rounds) for p in seeds.values()])


def paired(
    arm: dict[int, dict], silo: dict[int, dict], metric: str, rounds: int
) -> tuple[Interval, list[int]]:
    """The interval of arm - silo over the seeds both have (silo over the arm's node indices: the same
    question streams), and the arm's seeds that have no silo to pair with."""
    diffs, missing = [], []
    for seed, part in sorted(arm.items()):
        if seed not in silo:
            missing.append(seed)
            continue
        nodes = len(part["nodes"])
        diffs.append(part_value(part, metric, rounds) - part_value(silo[seed], metric, rounds, nodes))
    return interval(diffs), missing


def by_arm(parts: list[dict]) -> dict[str, dict[int, dict]]:
    """{arm: {seed: summary}}, silo first, then sharing arms by peer groups, then the off-policy arms."""
    order = sorted(parts, key=lambda p: (p["table"] != "sharing", p["peer"], p["arm"], p["seed"]))
    arms: dict[str, dict[int, dict]] = {}
    for part in order:
        arms.setdefault(part["arm"], {})[part["seed"]] = part
    return arms


def fmt(x: float, spec: str = ".2f") -> str:
    return "n/a" if x != x else format(x, spec)


def show(iv: Interval, spec: str = ".2f") -> str:
    return f"{fmt(iv.mean, spec)} ± {fmt(iv.half, spec)}" if iv.n >= 2 else fmt(iv.mean, spec)


def show_diff(iv: Interval, base: float, spec: str = "+.2f") -> str:
    if iv.n == 0:
        return "n/a"
    rel = f" ({iv.mean / base * 100:+.0f}%)" if base == base and base else ""
    ci = f" [{fmt(iv.lo, spec)}, {fmt(iv.hi, spec)}]" if iv.n >= 2 else " (1 seed: no interval)"
    return fmt(iv.mean, spec) + rel + ci


def verdict(arm: str, metric: str, iv: Interval, missing: list[int]) -> str:
    """One plain sentence: is the arm's gain over silo in ``metric`` significant at 95%?"""
    what, spec = METRICS[metric], "+.3f" if metric == "pass1" else "+.2f"
    unpaired = f" Seed(s) {missing} have no silo summary to pair with (run silo for them)." if missing else ""
    if iv.n < 2:
        return f"- **{arm}**, {what}: {iv.n} paired seed(s), too few for an interval.{unpaired}"
    head = (
        f"- **{arm}**, {what}: {iv.mean:{spec}} vs silo, 95% CI [{iv.lo:{spec}}, {iv.hi:{spec}}] over "
        f"{iv.n} seeds: "
    )
    if iv.significant:
        word = "better" if iv.mean > 0 else "worse"
        return head + f"significantly {word} than silo at 95% (the interval excludes 0).{unpaired}"
    if iv.mean == 0 and iv.sd == 0:
        return head + f"no difference from silo on any seed.{unpaired}"
    need = iv.seeds_needed()
    more = f"about {need} seeds" if need else f"more than {MAX_SEEDS_SUGGESTED} seeds"
    return head + (
        f"not significant at 95% (the interval includes 0); at this mean difference and spread between "
        f"seeds (sd {iv.sd:{spec[1:]}}), {more} would settle it.{unpaired}"
    )


def diagnostics(parts: dict[int, dict], rounds: int) -> dict[str, float]:
    """Pooled over the arm's seeds, nodes and rounds: what explains a table entry."""
    series = [node["rounds"] for part in parts.values() for node in part["nodes"]]

    def pool(field: str, where: str | None = None) -> list[float]:
        return [
            v for s in series for k, v in enumerate(s[field][:rounds])
            if v is not None and (where is None or s[where][k])
        ]  # fmt: skip

    def mean(values: list[float]) -> float:
        return statistics.fmean(values) if values else float("nan")

    local = sum(pool("groups_local"))
    kept = sum(pool("groups_kept")) - sum(pool("groups_peer")) - sum(pool("groups_replayed"))
    clip = [a + b for a, b in zip(pool("train_clip_low_frac", "train_tokens"),
                                  pool("train_clip_high_frac", "train_tokens"), strict=True)]  # fmt: skip
    return {
        "informative_local": kept / local if local else float("nan"),
        "peer_groups": mean(pool("groups_peer")),
        "peer_reward": mean(pool("reward_peer_mean", "groups_peer")),
        "own_reward": mean(pool("reward_mean")),
        "format_last5": mean([v for s in series for v in s["format_rate"][:rounds][-5:]]),
        "replayed": mean(pool("groups_replayed")),
        "is_weight_max": max(pool("train_is_weight_max"), default=float("nan")),
        "ess": mean(pool("train_ess", "train_tokens")),
        "clip_frac": mean(clip),
        "seconds_per_round": mean(pool("seconds_total")),
    }


def report(parts: list[dict], plot_name: str) -> str:
    """The markdown: tables of the arms against silo, the verdicts, the compute view, diagnostics."""
    arms = by_arm(parts)
    silo = arms.get("silo", {})
    rounds = min(len(node["rounds"]["reward_mean"]) for p in parts for node in p["nodes"])
    setup = parts[0]["setup"]
    machines = sorted({p["machine_line"] for p in parts})
    lines = [
        f"Config `{setup['config']}`"
        + (f" with `{' '.join(setup['sets'])}`" if setup["sets"] else "")
        + f", {setup['groups']} question groups per node and round, compared over {rounds} rounds; "
        f"{len(parts)} (arm, seed) summaries.  ",
        "Machine(s): " + "; ".join(machines) + "  ",
        f"Wall time: {sum(p['wall_s'] + p['eval_s'] for p in parts) / 3600:.1f} h, held-out evaluations "
        "included.",
        "",
        'Mean over nodes, then over seeds, ± the half-width of its 95% interval; "vs silo" is the mean '
        "paired difference (same seed = same node identities, question-stream seeds and training seed), "
        "relative to silo, and its 95% interval (Student's t, seeds - 1 degrees of freedom).",
        "",
        "| arm | what | seeds | nodes x rounds | cumulative reward | vs silo | cumulative task score | "
        "vs silo | held-out pass@1 | vs silo |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    verdicts, compute, diag = [], [], []
    for name, seeds in arms.items():
        first = next(iter(seeds.values()))
        cells = [name, first["what"], ", ".join(map(str, seeds)), f"{len(first['nodes'])} x {rounds}"]
        for metric in ("reward", "task", "pass1"):
            own, base = over_seeds(seeds, metric, rounds), over_seeds(silo, metric, rounds).mean
            cells.append(show(own, ".3f" if metric == "pass1" else ".2f"))
            if name == "silo":
                cells.append("")
                continue
            iv, missing = paired(seeds, silo, metric, rounds)
            cells.append(show_diff(iv, base, "+.3f" if metric == "pass1" else "+.2f"))
            if metric != "task":
                verdicts.append(verdict(name, metric, iv, missing))
        lines.append("| " + " | ".join(cells) + " |")
        tokens = over_seeds(seeds, "tokens", rounds)
        per_token = interval(
            [
                part_value(p, "reward", rounds) / max(part_value(p, "tokens", rounds), 1) * 1e5
                for p in seeds.values()
            ]
        )
        silo_tokens = over_seeds(silo, "tokens", rounds).mean
        compute.append(
            f"| {name} | {fmt(tokens.mean, ',.0f')} | {fmt(tokens.mean / silo_tokens, '.2f')} | "
            f"{show(per_token, '.2f')} |"
        )
        d = diagnostics(seeds, rounds)
        diag.append(
            f"| {name} | {fmt(d['informative_local'], '.0%')} | {fmt(d['own_reward'], '.3f')} | "
            f"{fmt(d['peer_groups'])} | {fmt(d['peer_reward'], '.3f')} | {fmt(d['format_last5'], '.0%')} | "
            f"{fmt(d['replayed'])} | {fmt(d['is_weight_max'])} | {fmt(d['ess'], '.3f')} | "
            f"{fmt(d['clip_frac'], '.3f')} | {fmt(d['seconds_per_round'], '.0f')} |"
        )
    lines += [
        "",
        "**Verdict** (cumulative reward of the nodes' own fresh completions, and held-out pass@1 of their "
        "final checkpoints):",
        "",
        *(verdicts or ["- no arm besides silo has a summary yet"]),
        "",
        "Compute: tokens each node sampled over the rounds (a node of an L/E swarm samples L of the "
        f"{setup['groups']} groups it trains on; its peers sampled the rest), and what it earned per "
        "100k tokens it sampled.",
        "",
        "| arm | tokens sampled per node | vs silo | cumulative reward per 100k sampled tokens |",
        "|---|---|---|---|",
        *compute,
        "",
        "Diagnostics, pooled over seeds, nodes and rounds: informative local groups = share of own groups "
        "whose rewards were not all equal (the others have zero advantage and are dropped); peer group "
        "reward = mean reward of the peer groups trained on, re-scored by the receiver, beside the node's "
        "own; max IS weight, ESS and clip frac are the trainer's off-policy diagnostics.",
        "",
        "| arm | informative local groups | own reward | peer groups/round | peer group reward | "
        "format, last 5 | replayed groups/round | max IS weight | ESS | clip frac | s/round |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *diag,
        "",
        f"![reward per round and per sampled token, mean over seeds]({plot_name})",
    ]
    return "\n".join(lines)


def mean_curves(seeds: dict[int, dict], rounds: int) -> tuple[list[float], list[float]]:
    """Per round, mean over nodes and seeds: the reward, and the tokens sampled so far per node."""
    nodes = [node["rounds"] for part in seeds.values() for node in part["nodes"]]
    reward = [statistics.fmean(n["reward_mean"][k] for n in nodes) for k in range(rounds)]
    per_round = [statistics.fmean(n["sampled_tokens"][k] for n in nodes) for k in range(rounds)]
    return reward, [sum(per_round[: k + 1]) for k in range(rounds)]


def moving_average(values: list[float], window: int) -> list[float]:
    return [statistics.fmean(values[max(0, k - window + 1) : k + 1]) for k in range(len(values))]


def plot(parts: list[dict], path: Path, window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = min(len(node["rounds"]["reward_mean"]) for p in parts for node in p["nodes"])
    fig, (by_round, by_tokens) = plt.subplots(1, 2, figsize=(13, 4.2))
    for name, seeds in by_arm(parts).items():
        reward, tokens = mean_curves(seeds, rounds)
        smooth = moving_average(reward, window)
        by_round.plot(range(1, rounds + 1), smooth, label=f"{name} ({len(seeds)} seeds)")
        by_tokens.plot(tokens, smooth, label=name)
    by_round.set_xlabel("round")
    by_tokens.set_xlabel("tokens sampled per node, cumulative")
    for ax in (by_round, by_tokens):
        ax.set_ylabel(f"reward, moving average of {window}")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("own-completion reward, mean over nodes and seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(path: Path, text: str, begin: str = BEGIN, end: str = END) -> None:
    """Replace what lies between the ``begin`` and ``end`` markers of ``path``, or write a new file: a
    generated table lives inside a doc (docs/sapo-table.md) whose prose around it is written by hand."""
    if not path.exists():
        path.write_text(f"{begin}\n{text}\n{end}\n")
        return
    old = path.read_text()
    if begin not in old or end not in old:
        raise SystemExit(f"{path} has no {begin} ... {end} markers: add them where the table goes")
    head, rest = old.split(begin, 1)
    path.write_text(f"{head}{begin}\n{text}\n{end}{rest.split(end, 1)[1]}")
