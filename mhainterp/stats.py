"""Small, honest statistics for comparing groups of seeds.

With 3 seeds nothing is certain; these functions report what the data allow (mean, sample std,
n, Welch's t-test, a bootstrap interval) and the seed's plain rule, and never hide n.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
from scipy import stats as scipy_stats

__all__ = ["describe", "welch_test", "bootstrap_diff_ci", "exceeds_seed_spread"]


def describe(values: Sequence[float]) -> dict[str, float]:
    """``{"mean", "std", "n"}`` with the sample std (ddof=1; NaN when n < 2)."""
    x = np.asarray(values, dtype=float)
    return {
        "mean": float(x.mean()) if x.size else math.nan,
        "std": float(x.std(ddof=1)) if x.size >= 2 else math.nan,
        "n": int(x.size),
    }


def welch_test(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Welch's unequal-variance t-test: ``(t, two-sided p)``; NaN when either n < 2.

    When both groups have zero variance the test is undefined: p is 1.0 if the means are equal
    and 0.0 if they differ (every seed agrees exactly).
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size < 2 or b.size < 2:
        return math.nan, math.nan
    if a.std() == 0 and b.std() == 0:
        if a.mean() == b.mean():
            return 0.0, 1.0
        return math.copysign(math.inf, a.mean() - b.mean()), 0.0
    with warnings.catch_warnings():  # near-identical seeds trigger a harmless precision warning
        warnings.simplefilter("ignore", RuntimeWarning)
        result = scipy_stats.ttest_ind(a, b, equal_var=False)
    return float(result.statistic), float(result.pvalue)


def bootstrap_diff_ci(
    a: Sequence[float],
    b: Sequence[float],
    *,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``mean(a) - mean(b)`` (resampling seeds in each group).

    With 3 seeds per group there are only 10 distinct resamples per group, so the interval is
    coarse; it is reported next to Welch's test, not instead of it.
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size == 0 or b.size == 0:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    mean_a = rng.choice(a, size=(n_resamples, a.size), replace=True).mean(axis=1)
    mean_b = rng.choice(b, size=(n_resamples, b.size), replace=True).mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(mean_a - mean_b, [tail, 1.0 - tail])
    return float(low), float(high)


def exceeds_seed_spread(mean_a: float, std_a: float, mean_b: float, std_b: float) -> bool | None:
    """The seed's rule: is the difference bigger than the spread between seeds?

    True when ``|mean_a - mean_b| > std_a + std_b`` (the mean ± std bars do not overlap);
    None when a std is undefined (fewer than 2 seeds).
    """
    if math.isnan(std_a) or math.isnan(std_b):
        return None
    return abs(mean_a - mean_b) > std_a + std_b
