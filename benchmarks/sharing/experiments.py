"""When does sharing help: the metrics and verdict rules of experiments E1 and E2, fixed here before
any run, so that the data cannot choose them.

E1, division of labour. Every node holds tasks A and B in its mix; in spec-silo and spec-2/2 nodes 0..n/2-1
sample only A and the others only B (``arms.TaskSplit``). Primary: held-out pass@1 on the task a node never
samples (only peers' groups can teach it), spec-2/2 minus spec-silo. Secondary: pass@1 on the node's own
task, which a 2/2 node samples half as often: spec-2/2 must not be worse than spec-silo by more than
``E1_OWN_TASK_MARGIN`` (non-inferiority).

E2, homogeneous and harder. Arms silo-4, silo-2 and 2/2 on one task mix. Metric: the area under the
node's probe curve (``probe_area``: pass@1 of the fixed probe, every k rounds from round 0, per round).
Verdicts: "helps" (2/2 - silo-4 interval above 0), "does not help here" (2/2 - silo-4 equivalent within
``E2_AREA_MARGIN``), "only saves sampling" (2/2 = silo-4 and silo-4 > silo-2: the peer groups stand in
for a node's own sampling), "batch size irrelevant" (silo-2 = silo-4); more than one may hold, and none
is "inconclusive".

Every comparison is paired by seed (a seed fixes the question draws and the initial weights of every arm,
and the nodes of one swarm are coupled, so the seed is the unit): a seed's value is the mean over the
arm's nodes, and d_s = arm_s - baseline_s over the seeds both arms have. "Above 0" is the 95% Student-t
interval of d above 0; "equivalent" is Schuirmann's TOST at 5% per side (its 90% interval inside
(-margin, +margin)); "non-inferior" is the 95% interval's lower end above -margin.

E2's control, silo-matched (fixed 2026-11-29, after E2's other arms and before any silo-matched part). 2/2
trained on ~1.55x the informative groups of silo-4 a round (2.93 against 1.86, 433 tokens against 282), so
E2 did not compare the arms at one training batch. silo-matched is a silo node that samples more questions
and trains on at most a few informative ones (``arms.matched_arm``, ``train.max_groups``), so that its groups
kept and tokens trained a round match 2/2's. Comparison: 2/2 - silo-matched in probe area, paired by seed,
8 seeds (``E2_SEEDS``), margin ``E2_AREA_MARGIN``. Verdicts: "better learning per trained token" (95%
interval above 0: peer groups teach more than as many informative own groups), "same learning per trained
token" (TOST-equivalent: E2's gain is the extra signal, which a silo node also buys by sampling more),
"worse learning per trained token" (below 0), else "learning per trained token inconclusive". Second,
silo-matched - silo-4 (what more informative own groups give a silo node): "more informative groups help
a silo node" (above 0), "... do not help a silo node here" (equivalent), "... hurt a silo node" (below 0),
else "... inconclusive". Match check, on groups kept alone (never the probe): silo-matched's groups kept a
round, mean over its seeds, within ``E2_MATCH_TOLERANCE`` of 2/2's; outside it there is no verdict on
learning per trained token. It is checked after silo-matched's first seed: outside the tolerance, the
question count moves by one (``arms.MATCHED_QUESTIONS``), that seed runs again, and docs/sharing.md says so.

Compute, read for every arm (estimates with paired intervals, no verdict): the probe area against
cumulative compute instead of rounds, over the first ``COMPUTE_SPANS`` of it (tokens sampled, tokens
trained, node seconds), each span just below the least any E2 node spent in 40 rounds, so every node's
curve covers it. "Node seconds" are the wall seconds of a node's rounds (``seconds_total``), the closest
recorded measure to its CPU seconds: rounds record no CPU time, a swarm node's include its wait for peers'
groups, and 4 nodes share 2 cores.

The margins, in pass@1 (chosen from the noise of the measurement and the size of an effect that would
change a default): a seed's mean over 4 nodes of 500 held-out questions per task has a binomial sd of
~0.01 at pass@1 0.25, and 40 solo rounds raised easy arithmetic's held-out pass@1 by 0.08
(docs/learning.md). A difference under 0.03 on a task (E1), or under 0.02 in the probe's mean pass@1 over
40 rounds (E2, about a quarter of that rise), is too small to choose a swarm for.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.harness.stats import Equivalence, Interval, equivalence, paired
from benchmarks.sharing.arms import MATCHED, silo_name

E1_TRANSFER_MARGIN = (
    0.03  # E1 primary: |spec-2/2 - spec-silo| on the never-sampled task below it = no transfer
)
E1_OWN_TASK_MARGIN = 0.03  # E1 secondary: spec-2/2 may lose at most this much own-task pass@1
E2_AREA_MARGIN = 0.02  # E2: probe area differences inside +-this are "the same"
# seeds the design fixes; a verdict on fewer is interim, and the runs go on whatever it says
E1_SEEDS = 6
E2_SEEDS = 8
# spec-2/2 run with offpolicy.peer_defence=none (docs/sharing.md): what the default defence costs
E1_UNDEFENDED = "spec-2/2 undefended"
E1_ARMS = ("spec-silo", "spec-2/2", E1_UNDEFENDED, "generalist-silo")
E2_MATCHED = MATCHED  # E2's control: 2/2's groups kept and tokens trained, no peers
E2_ARMS = ("silo-4", "silo-2", "2/2", E2_MATCHED)
E2_MATCH_TOLERANCE = 0.10  # silo-matched's groups kept a round within +-10% of 2/2's, or no control verdict
# the probe area against compute covers the first this much of it (a round field of the summaries -> span)
COMPUTE_SPANS = {"sampled_tokens": 10_000, "train_tokens": 5_000, "seconds_total": 600.0}

# a node's tasks by role: those it samples (weight > 0), those it never samples (weight 0), all of its mix
ROLES = {
    "own": lambda weight: weight > 0,
    "unsampled": lambda weight: weight == 0,
    "all": lambda weight: True,
}


def by_arm(parts: list[dict]) -> dict[str, dict[int, dict]]:
    """{arm: {seed: summary}}; an old summary's ``silo`` reads as ``silo-<its local groups>``."""
    arms: dict[str, dict[int, dict]] = {}
    for part in sorted(parts, key=lambda p: p["seed"]):
        arms.setdefault(silo_name(part["arm"], part["local"]), {})[part["seed"]] = part
    return arms


def tasks_of(node: dict, role: str) -> list[str]:
    """The node's tasks in ``role`` (``ROLES``), from the weights its summary keeps."""
    return sorted(task for task, weight in node["weights"].items() if ROLES[role](weight))


def _mean(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.fmean(values) if values else float("nan")


def held_out(node: dict, tasks: list[str]) -> float:
    """Held-out pass@1 of the node's final checkpoint, mean over ``tasks`` (nan: no checkpoint or tasks)."""
    scored = node["eval"]
    return _mean([scored["by_task"][t]["pass@1"] for t in tasks]) if scored else float("nan")


def probe_curve(node: dict, tasks: list[str]) -> list[tuple[int, float]]:
    """(round, probe pass@1 mean over ``tasks``) by round; a round probed twice keeps its last line."""
    points = {line["round"]: _mean([line["by_task"][t]["pass@1"] for t in tasks]) for line in node["probe"]}
    return sorted(points.items())


def probe_area(curve: list[tuple[int, float]]) -> float:
    """Area under a probe curve by the trapezoid rule, divided by its span of rounds: the curve's mean
    pass@1 over the rounds, in pass@1 units (nan below two points)."""
    if len(curve) < 2:
        return float("nan")
    area = sum((r1 - r0) * (v0 + v1) / 2 for (r0, v0), (r1, v1) in zip(curve, curve[1:], strict=False))
    return area / (curve[-1][0] - curve[0][0])


NodeValue = Callable[[dict], float]


def final_pass1(role: str) -> NodeValue:
    """A node's held-out pass@1 on its tasks in ``role``."""
    return lambda node: held_out(node, tasks_of(node, role))


def area(role: str) -> NodeValue:
    """A node's probe area on its tasks in ``role``."""
    return lambda node: probe_area(probe_curve(node, tasks_of(node, role)))


def per_seed(seeds: dict[int, dict], value: NodeValue) -> dict[int, float]:
    """Per seed, the mean of ``value`` over the arm's nodes (the unit of replication is the swarm)."""
    return {seed: _mean([value(node) for node in part["nodes"]]) for seed, part in seeds.items()}


@dataclass(frozen=True)
class Comparison:
    """``arm`` - ``baseline`` paired by seed, with its TOST against ``margin``."""

    arm: str
    baseline: str
    diff: Interval
    tost: Equivalence
    unpaired: tuple[int, ...]  # seeds of either arm that the other lacks

    @property
    def margin(self) -> float:
        return self.tost.margin

    @property
    def above_zero(self) -> bool:
        return self.diff.n >= 2 and self.diff.lo > 0

    @property
    def below_zero(self) -> bool:
        return self.diff.n >= 2 and self.diff.hi < 0

    @property
    def equivalent(self) -> bool:
        return self.tost.equivalent

    @property
    def non_inferior(self) -> bool:
        return self.diff.n >= 2 and self.diff.lo > -self.margin

    def verdict(self, above: str, below: str, equivalent: str, inconclusive: str) -> str:
        """The first of the rules' outcomes that holds: above zero, below zero, equivalent, else
        inconclusive."""
        if self.above_zero:
            return above
        if self.below_zero:
            return below
        return equivalent if self.equivalent else inconclusive


def compare(
    arms: dict[str, dict[int, dict]], arm: str, baseline: str, value: NodeValue, margin: float
) -> Comparison:
    a, b = per_seed(arms.get(baseline, {}), value), per_seed(arms.get(arm, {}), value)
    a, b = ({s: v for s, v in x.items() if not math.isnan(v)} for x in (a, b))
    diff = paired(a, b)
    return Comparison(arm, baseline, diff, equivalence(diff, margin), tuple(sorted(a.keys() ^ b.keys())))


def e1_comparisons(
    arms: dict[str, dict[int, dict]], arm: str = "spec-2/2", baseline: str = "spec-silo"
) -> tuple[Comparison, Comparison]:
    """``arm`` - ``baseline`` on the never-sampled task and on the own task: by default E1's primary and
    secondary comparisons. (E1_UNDEFENDED - spec-2/2, what the peer defence costs a specialist, has no rule
    fixed before the runs: an estimate, not a verdict.)"""
    transfer = compare(arms, arm, baseline, final_pass1("unsampled"), E1_TRANSFER_MARGIN)
    own = compare(arms, arm, baseline, final_pass1("own"), E1_OWN_TASK_MARGIN)
    return transfer, own


def e1_verdicts(transfer: Comparison, own: Comparison) -> list[str]:
    """The rules of the module docstring, in order: what sharing did to the task a node never samples,
    then to its own."""
    first = transfer.verdict(
        "peers teach the unsampled task", "sharing hurts the unsampled task", "no transfer",
        "transfer inconclusive",
    )  # fmt: skip
    second = "own task non-inferior" if own.non_inferior else "own task not shown non-inferior"
    return [first, second]


def e2_comparisons(arms: dict[str, dict[int, dict]]) -> tuple[Comparison, Comparison, Comparison]:
    """2/2 - silo-4 (what sharing adds), silo-4 - silo-2 (what two more own groups add) and 2/2 - silo-2
    (peer groups against nothing, at the same sampling), all in probe area."""
    value = area("all")
    return (
        compare(arms, "2/2", "silo-4", value, E2_AREA_MARGIN),
        compare(arms, "silo-4", "silo-2", value, E2_AREA_MARGIN),
        compare(arms, "2/2", "silo-2", value, E2_AREA_MARGIN),
    )


def e2_verdicts(share: Comparison, batch: Comparison) -> list[str]:
    """Every E2 rule that holds (module docstring), or "inconclusive"; ``share`` is 2/2 - silo-4,
    ``batch`` silo-4 - silo-2."""
    held = []
    if share.above_zero:
        held.append("helps")
    if share.below_zero:
        held.append("hurts")
    if share.equivalent:
        held.append("does not help here")
        if batch.above_zero:
            held.append("only saves sampling")
    if batch.equivalent:
        held.append("batch size irrelevant")
    return held or ["inconclusive"]


def e2_control_comparisons(arms: dict[str, dict[int, dict]]) -> tuple[Comparison, Comparison]:
    """2/2 - silo-matched (what peer groups teach beyond their number) and silo-matched - silo-4 (what
    more informative own groups give a silo node), both in probe area."""
    value = area("all")
    return (
        compare(arms, "2/2", E2_MATCHED, value, E2_AREA_MARGIN),
        compare(arms, E2_MATCHED, "silo-4", value, E2_AREA_MARGIN),
    )


def groups_kept(node: dict) -> float:
    """A node's informative groups trained a round, mean over its rounds (nan: not recorded)."""
    return _mean([v for v in node["rounds"].get("groups_kept", []) if v is not None])


@dataclass(frozen=True)
class Match:
    """silo-matched's groups kept a round against 2/2's, each the mean over its seeds."""

    swarm: float
    matched: float

    @property
    def ratio(self) -> float:
        return self.matched / self.swarm if self.swarm else float("nan")

    @property
    def holds(self) -> bool:
        return abs(self.ratio - 1) <= E2_MATCH_TOLERANCE


def e2_match(arms: dict[str, dict[int, dict]]) -> Match:
    def mean_kept(arm: str) -> float:
        return _mean(list(per_seed(arms.get(arm, {}), groups_kept).values()))

    return Match(mean_kept("2/2"), mean_kept(E2_MATCHED))


def e2_control_verdicts(match: Match, text: Comparison, signal: Comparison) -> list[str]:
    """The control's rules (module docstring): ``text`` is 2/2 - silo-matched, ``signal`` silo-matched -
    silo-4; learning per trained token first (none unless the match holds), then more own groups."""
    if not match.holds:
        first = f"not matched (groups kept outside ±{E2_MATCH_TOLERANCE:.0%} of 2/2's): no verdict"
    else:
        first = text.verdict(
            "better learning per trained token", "worse learning per trained token",
            "same learning per trained token", "learning per trained token inconclusive",
        )  # fmt: skip
    second = signal.verdict(
        "more informative groups help a silo node", "more informative groups hurt a silo node",
        "more informative groups do not help a silo node here",
        "more informative groups for a silo node inconclusive",
    )  # fmt: skip
    return [first, second]
