"""Seed-paired intervals and the equivalence test (TOST), checked against scipy on known data."""

from __future__ import annotations

import math

import pytest
from scipy import stats as scipy_stats

from benchmarks.harness.stats import equivalence, paired

SILO = {0: 0.30, 1: 0.25, 2: 0.35, 3: 0.28, 4: 0.31, 5: 0.27}
SHARED = {0: 0.33, 1: 0.26, 2: 0.36, 3: 0.30, 4: 0.33, 5: 0.28, 9: 0.90}  # seed 9 has no silo twin


def test_the_paired_interval_is_scipys_one_sample_interval_of_the_differences():
    diff = paired(SILO, SHARED)
    differences = [SHARED[s] - SILO[s] for s in sorted(SILO)]
    lo, hi = scipy_stats.t.interval(
        0.95, len(differences) - 1, loc=sum(differences) / 6, scale=scipy_stats.sem(differences)
    )
    assert diff.n == 6  # the unpaired seed 9 is left out
    assert (diff.lo, diff.hi) == pytest.approx((lo, hi), rel=1e-12)
    assert diff.significant  # every seed gained: 0.01-0.03


def test_tost_agrees_with_two_one_sided_scipy_t_tests():
    diff = paired(SILO, SHARED)
    differences = [SHARED[s] - SILO[s] for s in sorted(SILO)]
    for margin in (0.005, 0.02, 0.05):
        result = equivalence(diff, margin)
        above = scipy_stats.ttest_1samp(differences, -margin, alternative="greater")
        below = scipy_stats.ttest_1samp(differences, margin, alternative="less")
        assert result.t_lower == pytest.approx(above.statistic) and result.t_upper == pytest.approx(
            below.statistic
        )
        assert result.equivalent == (above.pvalue < 0.05 and below.pvalue < 0.05), margin
    assert not equivalence(diff, 0.005).equivalent  # a real difference of ~0.017 is not "the same"
    assert equivalence(diff, 0.05).equivalent  # but it is within 0.05


def test_tost_is_the_90_percent_interval_inside_the_margin():
    diff = paired(SILO, SHARED)
    half90 = scipy_stats.t.ppf(0.95, diff.n - 1) * diff.sd / math.sqrt(diff.n)
    for margin in (diff.mean + half90 - 1e-6, diff.mean + half90 + 1e-6):
        inside = -margin < diff.mean - half90 and diff.mean + half90 < margin
        assert equivalence(diff, margin).equivalent == inside


def test_too_few_seeds_or_no_spread_is_never_called_equivalent():
    assert not equivalence(paired({0: 0.3}, {0: 0.3}), 0.1).equivalent
    assert not equivalence(paired({0: 0.3, 1: 0.4}, {0: 0.3, 1: 0.4}), 0.1).equivalent  # sd 0: no test
    with pytest.raises(ValueError, match="margin"):
        equivalence(paired(SILO, SHARED), 0.0)
