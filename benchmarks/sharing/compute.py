"""What each arm of a sharing experiment spent, and what its probe reached for it: per round the groups it
sampled and kept, the tokens it trained on and sampled, its seconds; and the probe area against cumulative
compute instead of rounds (``experiments.COMPUTE_SPANS``), so that arms compare at equal compute. Built from
the per-round records the summaries keep (``sapo_report.ROUND_FIELDS``) alone.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable

from benchmarks.harness.stats import interval
from benchmarks.sharing import experiments
from benchmarks.sharing.sapo_report import show

NAN = float("nan")
COMPUTE_WORDS = {  # a round field of the summaries -> what it counts, as the report names it
    "sampled_tokens": "tokens sampled",
    "train_tokens": "tokens trained",
    "seconds_total": "node seconds",
}


def round_values(node: dict, field: str) -> list[float] | None:
    """The node's ``field`` round by round (None: not recorded, in all its rounds)."""
    values = node["rounds"].get(field)
    return None if not values or any(v is None for v in values) else values


def per_round(field: str) -> experiments.NodeValue:
    """A node's ``field`` a round, mean over its rounds (nan: not recorded)."""

    def value(node: dict) -> float:
        values = round_values(node, field)
        return statistics.fmean(values) if values else NAN

    return value


def signal_per_sampled(node: dict) -> float:
    """Informative groups the node trained on per 1,000 tokens it sampled (nan: not recorded)."""
    kept, sampled = round_values(node, "groups_kept"), round_values(node, "sampled_tokens")
    return 1000 * sum(kept) / sum(sampled) if kept and sampled and sum(sampled) else NAN


def compute_curve(node: dict, tasks: list[str], field: str) -> list[tuple[float, float]]:
    """(``field`` spent before the probe, probe pass@1 over ``tasks``): the probe after round r follows
    rounds 1..r, the first r records. Empty when ``field`` is not recorded."""
    values = round_values(node, field)
    if values is None:
        return []
    spent = [0.0, *itertools.accumulate(values)]
    return [(spent[r], v) for r, v in experiments.probe_curve(node, tasks) if r < len(spent)]


def area_within(curve: list[tuple[float, float]], span: float) -> float:
    """The area under ``curve`` from 0 to ``span`` (the last piece interpolated), divided by ``span``: the
    curve's mean over its first ``span`` of x, in pass@1 units; nan if it does not start at 0 or stops
    short of ``span``."""
    if not curve or curve[0][0] != 0 or curve[-1][0] < span:
        return NAN
    total = 0.0
    for (x0, y0), (x1, y1) in itertools.pairwise(curve):
        if x0 >= span:
            break
        if x1 > span:
            y1, x1 = y0 + (y1 - y0) * (span - x0) / (x1 - x0), span
        total += (x1 - x0) * (y0 + y1) / 2
    return total / span


def compute_area(field: str, role: str = "all") -> experiments.NodeValue:
    """A node's probe area over the first ``COMPUTE_SPANS[field]`` of ``field``, on its tasks in ``role``."""
    span = experiments.COMPUTE_SPANS[field]
    return lambda node: area_within(compute_curve(node, experiments.tasks_of(node, role), field), span)


def cpu_per_node_round(part: dict) -> float:
    """CPU seconds a node and round over the whole part (start-up and probes included), from the CPU time
    of the part's node processes where the summary records it (``nodes_cpu_s``), else nan."""
    if part.get("nodes_cpu_s") is None:
        return NAN
    return part["nodes_cpu_s"] / len(part["nodes"]) / part["setup"]["rounds"]


def _cell(seeds: dict[int, dict], value: Callable[[dict], float], spec: str, none: str) -> str:
    iv = interval(list(experiments.per_seed(seeds, value).values()))
    return show(iv, spec) if iv.n else none


def spend_table(arms: dict[str, dict[int, dict]], names: tuple[str, ...]) -> list[str]:
    """Per arm, a round: groups sampled (own + peer), kept (informative, trained on), tokens trained and
    sampled, node seconds, informative groups per 1,000 tokens sampled, and CPU seconds where recorded."""
    lines = [
        "| arm | seeds | groups sampled (own + peer) | groups kept | tokens trained | tokens sampled | node "
        "seconds | groups kept per 1,000 tokens sampled | node CPU seconds (whole part, per round) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in (n for n in names if n in arms):
        seeds = arms[name]
        own, peer = (
            interval(list(experiments.per_seed(seeds, per_round(f)).values())).mean
            for f in ("groups_local", "groups_peer")
        )
        sampled = f"{own:.0f} + {peer:.2f}" if peer > 0 else f"{own:.0f}" if own == own else "not recorded"
        cells = [
            _cell(seeds, per_round("groups_kept"), ".2f", "not recorded"),
            _cell(seeds, per_round("train_tokens"), ".0f", "not recorded"),
            _cell(seeds, per_round("sampled_tokens"), ".0f", "not recorded"),
            _cell(seeds, per_round("seconds_total"), ".1f", "not recorded"),
            _cell(seeds, signal_per_sampled, ".2f", "not recorded"),
        ]
        cpu = interval([cpu_per_node_round(part) for part in seeds.values()])
        cells.append(show(cpu, ".1f") + f" ({cpu.n} seeds)" if cpu.n else "not recorded")
        lines.append(f"| {name} | {len(seeds)} | {sampled} | " + " | ".join(cells) + " |")
    return lines


def area_table(arms: dict[str, dict[int, dict]], names: tuple[str, ...]) -> list[str]:
    """Per arm, the probe area against rounds and over the first span of each compute measure (n/a: no node
    recorded the measure to the end of the span)."""
    spans = experiments.COMPUTE_SPANS
    lines = [
        "| arm | seeds | probe area, by round | "
        + " | ".join(f"first {spans[f]:,.0f} {COMPUTE_WORDS[f]}" for f in spans)
        + " |",
        "|---|---|---|" + "---|" * len(spans),
    ]
    for name in (n for n in names if n in arms):
        seeds = arms[name]
        cells = [_cell(seeds, experiments.area("all"), ".3f", "n/a")]
        cells += [_cell(seeds, compute_area(f), ".3f", "n/a") for f in spans]
        lines.append(f"| {name} | {len(seeds)} | " + " | ".join(cells) + " |")
    return lines


def compute_comparisons(
    arms: dict[str, dict[int, dict]], baselines: tuple[str, ...]
) -> list[tuple[str, experiments.Comparison]]:
    """2/2 - each baseline present, in probe area over the first span of each compute measure."""
    return [
        (
            f"probe area over the first {span:,.0f} {COMPUTE_WORDS[field]}",
            experiments.compare(arms, "2/2", base, compute_area(field), experiments.E2_AREA_MARGIN),
        )
        for base in baselines
        if base in arms
        for field, span in experiments.COMPUTE_SPANS.items()
    ]


def seed_compute_curves(seeds: dict[int, dict], role: str, field: str) -> tuple[list[float], list[float]]:
    """Per round probed in every node: the mean over seeds (each the mean over its nodes) of ``field``
    spent before the probe, and of probe pass@1 (for a plot against compute)."""
    curves = [
        [compute_curve(node, experiments.tasks_of(node, role), field) for node in part["nodes"]]
        for part in seeds.values()
    ]
    points = min((len(c) for part in curves for c in part), default=0)
    x = [statistics.fmean(c[i][0] for part in curves for c in part) for i in range(points)]
    y = [statistics.fmean(statistics.fmean(c[i][1] for c in part) for part in curves) for i in range(points)]
    return x, y
