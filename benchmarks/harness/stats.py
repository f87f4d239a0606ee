"""A mean with its 95% Student-t interval, seed-paired differences and the equivalence test (TOST) that
the multi-seed tables (benchmarks.sapo_table) report.

Seeds are few (3-10), so the interval is Student's t with n - 1 degrees of freedom, not a normal one;
the quantile is scipy's, imported where it is computed: scipy comes with the ``test`` extra (hivemind
needs it too), and importing this module must not need it.

Arms are compared seed by seed (``paired``: arm B's value minus arm A's of the same seed, since a seed
fixes the question draws and the initial weights of both), and "no difference" is a claim of its own:
``equivalent`` is Schuirmann's two one-sided tests at 5% each against a margin stated before the runs,
i.e. the 90% interval of the paired differences inside (-margin, +margin).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

MAX_SEEDS_SUGGESTED = 30  # "seeds needed" beyond this is reported as "more than 30"


def t_quantile(q: float, df: int) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError(f"t quantile needs df >= 1, got {df}")
    from scipy.stats import t as student_t

    return float(student_t.ppf(q, df))


def t975(df: int) -> float:
    """The two-sided 95% quantile of Student's t with ``df`` degrees of freedom."""
    return t_quantile(0.975, df)


@dataclass(frozen=True)
class Interval:
    """The mean of n values with the half-width of its 95% Student-t interval (nan below 2 values)."""

    n: int
    mean: float
    sd: float

    @property
    def half(self) -> float:
        return t975(self.n - 1) * self.sd / math.sqrt(self.n) if self.n >= 2 else float("nan")

    @property
    def lo(self) -> float:
        return self.mean - self.half

    @property
    def hi(self) -> float:
        return self.mean + self.half

    @property
    def significant(self) -> bool:
        """The interval excludes 0 (false when it cannot be computed)."""
        return self.n >= 2 and (self.lo > 0 or self.hi < 0)

    def seeds_needed(self) -> int | None:
        """Fewest values whose interval would exclude 0 if mean and sd stayed as they are (None: more than
        MAX_SEEDS_SUGGESTED, or no spread to judge from)."""
        if self.n < 2 or self.mean == 0:
            return None
        for n in range(2, MAX_SEEDS_SUGGESTED + 1):
            if t975(n - 1) * self.sd / math.sqrt(n) < abs(self.mean):
                return n
        return None


def interval(values: list[float]) -> Interval:
    """The interval of ``values``, NaNs (a node without a result) left out."""
    values = [v for v in values if v == v]
    if not values:
        return Interval(0, float("nan"), float("nan"))
    sd = statistics.stdev(values) if len(values) > 1 else float("nan")
    return Interval(len(values), statistics.fmean(values), sd)


def paired(a: dict[int, float], b: dict[int, float]) -> Interval:
    """The interval of b - a over the seeds both arms have a value for (NaNs left out)."""
    return interval([b[seed] - a[seed] for seed in sorted(a.keys() & b.keys())])


@dataclass(frozen=True)
class Equivalence:
    """Schuirmann's TOST of paired differences against ``margin``: each one-sided t statistic, and the
    verdict at ``alpha`` per side (module docstring)."""

    diff: Interval
    margin: float
    t_lower: float  # (mean + margin) / se: large when the mean is clearly above -margin
    t_upper: float  # (mean - margin) / se: very negative when it is clearly below +margin
    alpha: float

    @property
    def equivalent(self) -> bool:
        if self.t_lower != self.t_lower:  # nan: one seed, or no spread
            return False
        critical = t_quantile(1 - self.alpha, self.diff.n - 1)
        return self.t_lower > critical and self.t_upper < -critical


def equivalence(diff: Interval, margin: float, alpha: float = 0.05) -> Equivalence:
    """TOST of a paired-differences interval (``paired``) against a margin fixed beforehand."""
    if margin <= 0:
        raise ValueError(f"an equivalence margin is > 0, got {margin}")
    se = diff.sd / math.sqrt(diff.n) if diff.n >= 2 else float("nan")
    if not se > 0:  # one seed, or no spread: nothing to test with
        return Equivalence(diff, margin, float("nan"), float("nan"), alpha)
    return Equivalence(diff, margin, (diff.mean + margin) / se, (diff.mean - margin) / se, alpha)
