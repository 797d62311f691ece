"""The statistics: tests, intervals, corrections and power, in numbers only.

Small and honest: with 3 seeds nothing is certain; these functions report what the data allow
and never hide n.

**Which test and interval, by n** (seeds per group; :data:`ASYMPTOTIC_MIN_SEEDS` = 10):

- fewer than 10 seeds in either group: the **exact permutation test** of the difference of
  means (every split of the pooled seeds; its floor :func:`smallest_p` is 0.1 for 3 vs 3, so
  nothing can be shown with 3 seeds whatever its size, and it is stated) with **Welch's t
  interval** of the difference (it assumes a normal seed spread; with no spread in either
  group there is no interval). Welch's *test* at 3 seeds rests wholly on 3 values being
  normal: one stray h = 1 seed at 0.74 made "3 seeds cannot settle h = 1 -> 4" (Holm p 0.058),
  which seeds 3-5 turned into Holm p 7e-5. A bootstrap over 3 values has 10 distinct
  resamples, and its interval excludes 0 in about a fifth of null cases;
- 10 or more in both: **Welch's t test** (the exact floor is then below 1e-5, and the mean of
  10 seeds is near normal) and a **percentile bootstrap interval** (each group resampled on
  its own, :func:`bootstrap_interval`).

Yes/no outcomes use Fisher's exact test. Undefined values (NaN: an index one head cannot have,
a "cannot tell" call) are left out of every test, never counted as "no".

- corrections: :func:`adjust_pvalues` (:func:`holm`, :func:`benjamini_hochberg`), and over one
  block of comparisons :func:`holm_block` and :func:`beyond_seed_spread`;
- two groups: :func:`compare_seeds` is the one comparison of two groups of seeds: the
  difference of means, its interval (:func:`difference_interval`), the test suited to n, its
  floor and whether the groups are completely separated. It never returns p = 0;
- power: :func:`seeds_for_floor`, :func:`seeds_for_power` and :func:`seeds_to_settle` say
  what n seeds can show and what n would settle a comparison that is still open;
- a mean: :func:`describe` (mean, std, n) and :func:`mean_interval`.

What lives elsewhere: the head-count comparison built on these, and every sentence that says a
result in words, are :mod:`mhainterp.sweep.compare`'s (``compare_head_counts``,
``comparison_sentence``, ``seed_power_note``). This module writes no sentences (test names,
interval methods and short error values only; ``tests/test_architecture.py`` checks it) and
imports nothing of ours but :mod:`mhainterp.validation`, so every layer may use it.

Example:
    >>> compare_seeds([1.0, 1.0, 1.0], [0.0, 0.0, 0.0])["p"]  # exact: 2 of the 20 splits
    0.1
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Sequence
from typing import Any, Literal, get_args

import numpy as np
from scipy import stats as scipy_stats

from mhainterp.validation import check_float, check_option, invalid

__all__ = [
    "ASYMPTOTIC_MIN_SEEDS",
    "CONFIDENCE",
    "CORRECTIONS",
    "EXACT_TESTS",
    "OUTCOME_KINDS",
    "Correction",
    "OutcomeKind",
    "adjust_pvalues",
    "as_pvalues",
    "benjamini_hochberg",
    "beyond_seed_spread",
    "bootstrap_interval",
    "compare_seeds",
    "correction_name",
    "defined_values",
    "describe",
    "difference_interval",
    "exact_permutation_p",
    "fisher_p",
    "holm",
    "holm_block",
    "mean_interval",
    "permutation_floor",
    "seeds_for_floor",
    "seeds_for_power",
    "seeds_to_settle",
    "separation",
    "smallest_p",
    "welch_interval",
    "welch_test",
]

OutcomeKind = Literal["graded", "yes/no"]
OUTCOME_KINDS: tuple[OutcomeKind, ...] = get_args(OutcomeKind)
"""What a per-seed outcome is: a number (exact permutation or Welch) or a yes/no (Fisher)."""

EXACT_TESTS = ("exact permutation", "Fisher exact")
"""Tests whose floor is reached exactly (a p there prints "= floor"; a sampled permutation
test's floor is a bound and prints "< floor")."""

ASYMPTOTIC_MIN_SEEDS = 10
"""From this many seeds in *both* groups, Welch's test and the bootstrap interval; below it,
the exact permutation test and Welch's t interval (module docstring)."""

CONFIDENCE = 0.95
"""Level of every interval of seeds the toolkit reports: a head-count comparison's
(:mod:`mhainterp.sweep.compare`) and a mean's (:func:`mean_interval`)."""

_EXACT_LIMIT = 50_000
"""Above this many splits the permutation test draws this many at random instead (9 vs 9
seeds, 48,620 splits, are still all enumerated)."""

_BOOTSTRAP_RESAMPLES = 10_000
"""Resamples of each group in :func:`bootstrap_interval`."""

_MAX_SEEDS = 100_000
"""Beyond this many seeds per group a comparison counts as out of reach."""


# ----------------------------------------------------------------------------- corrections
# Reject hypothesis ``i`` at level ``alpha`` exactly when ``adjusted[i] < alpha``; NaN entries
# are not part of the family. Written out so their steps can be checked by hand.

Correction = Literal["holm", "bh", "none"]
CORRECTIONS: tuple[Correction, ...] = get_args(Correction)
"""Allowed ``correction`` names: Holm step-down, Benjamini-Hochberg step-up, or none."""


def adjust_pvalues(
    p_values: Sequence[float] | np.ndarray, method: Correction = "holm"
) -> np.ndarray:
    """Adjust p-values for multiple comparisons with ``method`` (one of :data:`CORRECTIONS`):
    :func:`holm` (family-wise error), :func:`benjamini_hochberg` (false discovery rate) or none.

    Example:
        >>> adjust_pvalues([0.2, 0.01], "none").tolist()
        [0.2, 0.01]
        >>> adjust_pvalues([0.2, 0.01]).tolist()
        [0.2, 0.02]
    """
    check_option("correction", method, CORRECTIONS)
    if method == "holm":
        return holm(p_values)
    if method == "bh":
        return benjamini_hochberg(p_values)
    return as_pvalues(p_values).copy()


def correction_name(method: Correction) -> str:
    """How a correction is named in generated text ("Holm", "Benjamini-Hochberg", "no").

    Example:
        >>> correction_name("bh")
        'Benjamini-Hochberg'
    """
    return {"holm": "Holm", "bh": "Benjamini-Hochberg", "none": "no"}.get(method, method)


def as_pvalues(p_values: Sequence[float] | np.ndarray) -> np.ndarray:
    """``p_values`` as a 1-D float array, checked to lie in [0, 1] (NaN allowed)."""
    p = np.asarray(p_values, dtype=float)
    if p.ndim != 1:
        raise invalid("p_values", f"an array of shape {tuple(p.shape)}", "one-dimensional")
    finite = p[~np.isnan(p)]
    if ((finite < 0) | (finite > 1)).any():
        raise invalid(
            "p_values", f"values {finite.min()}..{finite.max()}", "values in [0, 1] (or NaN)"
        )
    return p


def holm(p_values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm's step-down adjustment (controls the family-wise error rate).

    Sort the ``m`` p-values ascending, ``p_(1) <= ... <= p_(m)``; the adjusted value of the
    ``i``-th smallest is ``max_{j <= i} min(1, (m - j + 1) * p_(j))``.

    Example:
        >>> holm([0.01, 0.04, 0.03, 0.005]).round(4).tolist()
        [0.03, 0.06, 0.06, 0.02]
    """
    p, out, order = _ranked(p_values)
    m = order.size
    scaled = (m - np.arange(m)) * p[order]  # (m - j + 1) * p_(j) for j = 1..m
    out[order] = np.minimum(1.0, np.maximum.accumulate(scaled))
    return out


def _ranked(p_values: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The p-values, an all-NaN output of their shape, and the indices of the non-NaN ones
    sorted by p (NaNs are left out of the count m and stay NaN)."""
    p = as_pvalues(p_values)
    keep = np.flatnonzero(~np.isnan(p))
    return p, np.full(p.shape, np.nan), keep[np.argsort(p[keep], kind="stable")]


def benjamini_hochberg(p_values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg step-up adjustment (controls the false discovery rate).

    Sort ascending; the adjusted value of the ``i``-th smallest is
    ``min_{j >= i} min(1, m * p_(j) / j)``.

    Example:
        >>> benjamini_hochberg([0.01, 0.04, 0.03, 0.005]).round(4).tolist()
        [0.02, 0.04, 0.04, 0.02]
    """
    p, out, order = _ranked(p_values)
    m = order.size
    if m == 0:
        return out
    scaled = m * p[order] / np.arange(1, m + 1)
    out[order] = np.minimum(1.0, np.minimum.accumulate(scaled[::-1])[::-1])
    return out


# ----------------------------------------------------------------------------- two groups


def describe(values: Sequence[float]) -> dict[str, float]:
    """``{"mean", "std", "n"}`` with the sample std (ddof=1; NaN when n < 2).

    Example:
        >>> describe([1.0, 2.0, 3.0])
        {'mean': 2.0, 'std': 1.0, 'n': 3}
    """
    x = np.asarray(values, dtype=float)
    return {
        "mean": float(x.mean()) if x.size else math.nan,
        "std": float(x.std(ddof=1)) if x.size >= 2 else math.nan,
        "n": int(x.size),
    }


def _no_spread(x: np.ndarray) -> bool:
    """Whether every value is the same, up to floating-point noise (0.001 written three
    times has a std of 2e-19)."""
    return bool(x.size) and float(np.ptp(x)) <= 1e-12 * max(1.0, float(np.abs(x).max()))


def defined_values(values: Sequence[float]) -> np.ndarray:
    """The values as a flat float array, undefined ones (NaN) left out: what every test here
    compares (an outcome that cannot be measured is never counted as "no").

    Example:
        >>> defined_values([0.5, float("nan"), 1.0]).tolist()
        [0.5, 1.0]
    """
    x = np.asarray(values, dtype=float).ravel()
    return x[~np.isnan(x)]


def _finite_values(name: str, values: Sequence[float]) -> np.ndarray:
    """The defined values (:func:`defined_values`); an infinite one is refused, naming the
    group (a mean and a permutation p of it mean nothing: p would come out 0)."""
    x = defined_values(values)
    for value in x[np.isinf(x)][:1]:
        check_float(name, float(value))  # refuses it, in validation's one format
    return x


def exact_permutation_p(a: Sequence[float], b: Sequence[float], seed: int = 0) -> float:
    """Two-sided permutation p of ``|mean(a) - mean(b)|`` over every split of the pooled values
    into groups of ``len(a)`` and ``len(b)`` (random splits when there are too many).

    The smallest value it can take is :func:`permutation_floor` (for distinct groups), never 0.
    Undefined values (NaN) are left out first, as in :func:`compare_seeds` (compared with NaN,
    no split would count as extreme, and p would be 0); an infinite value is refused.

    Example:
        >>> exact_permutation_p([1, 1, 1], [0, 0, 0])
        0.1
        >>> exact_permutation_p([1, 1, float("nan")], [0, 0, 0])  # 2 vs 3 seeds
        0.1
    """
    a, b = _finite_values("a", a), _finite_values("b", b)
    pooled = np.concatenate([a, b])
    n_a, n = a.size, pooled.size
    observed = abs(a.mean() - b.mean())
    total = pooled.sum()
    if math.comb(n, n_a) <= _EXACT_LIMIT:
        splits = np.array(list(itertools.combinations(range(n), n_a)))
        sums = pooled[splits].sum(axis=1)
    else:  # the observed split counts as one of the draws, so p >= 1 / (1 + draws)
        rng = np.random.default_rng(seed)
        draws = np.argsort(rng.random((_EXACT_LIMIT, n)), axis=1)[:, :n_a]
        sums = np.concatenate([[a.sum()], pooled[draws].sum(axis=1)])
    diffs = np.abs(sums / n_a - (total - sums) / (n - n_a))
    return float(np.mean(diffs >= observed - 1e-12 * max(1.0, observed)))


def smallest_p(n_a: int, n_b: int) -> float:
    """The smallest two-sided p an exact test of ``n_a`` vs ``n_b`` seeds can reach:
    ``2 / C(n_a + n_b, n_a)`` for equal sizes (the observed split and its mirror, which swaps
    the groups, are equally extreme), ``1 / C(n_a + n_b, n_a)`` for unequal ones (no split
    mirrors another: the observed one alone can be the most extreme). The exact permutation
    test and Fisher's exact test on yes/no counts share this floor.

    Example:
        >>> smallest_p(3, 3), smallest_p(5, 5), smallest_p(3, 4)
        (0.1, 0.007936507936507936, 0.02857142857142857)
    """
    mirrors = 2.0 if n_a == n_b else 1.0
    return min(1.0, mirrors / math.comb(n_a + n_b, n_a))


def permutation_floor(n_a: int, n_b: int) -> float:
    """The smallest p :func:`exact_permutation_p` returns for ``n_a`` vs ``n_b`` seeds: the
    exact floor :func:`smallest_p`, or ``1 / (1 + draws)`` where it draws random splits.

    Example:
        >>> permutation_floor(3, 3), permutation_floor(30, 30)
        (0.1, 1.999960000799984e-05)
    """
    if math.comb(n_a + n_b, n_a) <= _EXACT_LIMIT:
        return smallest_p(n_a, n_b)
    return 1.0 / (1 + _EXACT_LIMIT)


def welch_test(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Welch's unequal-variance t-test: ``(t, two-sided p)``; NaN when either n < 2.

    When both groups have zero variance Welch's t is undefined (scipy would say p = 0 for any
    difference): the p is then the exact permutation p (:func:`exact_permutation_p`), 1.0 for
    equal means, its floor :func:`smallest_p` for different ones, and t is ±inf (0 if equal).

    Example:
        >>> welch_test([1.0, 1.0, 1.0], [1.0, 1.0, 1.0])
        (0.0, 1.0)
        >>> welch_test([2.0, 2.0, 2.0], [1.0, 1.0, 1.0])
        (inf, 0.1)
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size < 2 or b.size < 2:
        return math.nan, math.nan
    if _no_spread(a) and _no_spread(b):
        if _no_spread(np.concatenate([a, b])):
            return 0.0, 1.0
        # Two constant groups: only the observed split (and its mirror, for equal sizes) is
        # as extreme, whatever n: the exact p, with no splits to draw.
        p = (2 if a.size == b.size else 1) / math.comb(a.size + b.size, a.size)
        return math.copysign(math.inf, a.mean() - b.mean()), p
    with warnings.catch_warnings():  # near-identical seeds trigger a harmless precision warning
        warnings.simplefilter("ignore", RuntimeWarning)
        result = scipy_stats.ttest_ind(a, b, equal_var=False)
    return float(result.statistic), float(result.pvalue)


def fisher_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided Fisher exact p of yes/no outcomes (``a``, ``b``: 0/1 or bools per seed).

    Example:
        >>> round(fisher_p([1, 1, 1], [0, 0, 0]), 12)
        0.1
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    table = [[int(a.sum()), int(a.size - a.sum())], [int(b.sum()), int(b.size - b.sum())]]
    return float(scipy_stats.fisher_exact(table).pvalue)


def welch_interval(
    a: Sequence[float], b: Sequence[float], confidence: float = 0.95
) -> tuple[float, float]:
    """Welch's t interval of ``mean(b) - mean(a)`` (Welch-Satterthwaite degrees of freedom);
    ``(nan, nan)`` when a group has fewer than 2 values or neither group varies (no spread,
    no interval).

    Example:
        >>> [round(v, 3) for v in welch_interval([1, 2, 3], [4, 5, 6])]  # 3 +- 2.776 * 0.816
        [0.733, 5.267]
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size < 2 or y.size < 2:
        return math.nan, math.nan
    va, vb = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    se = math.sqrt(va + vb)
    if se == 0:
        return math.nan, math.nan
    df = (va + vb) ** 2 / (va**2 / (x.size - 1) + vb**2 / (y.size - 1))
    half = float(scipy_stats.t.ppf(0.5 + confidence / 2, df)) * se
    diff = float(y.mean() - x.mean())
    return diff - half, diff + half


def bootstrap_interval(
    a: Sequence[float], b: Sequence[float], confidence: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``mean(b) - mean(a)``: each group resampled on its own
    (with replacement, its own size), 10,000 times, from ``seed``.

    Example:
        >>> low, high = bootstrap_interval(np.arange(30.0), np.arange(30.0) + 20)
        >>> bool(10 < low < 20 < high < 30)
        True
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    rng = np.random.default_rng(seed)
    mean_x = x[rng.integers(0, x.size, (_BOOTSTRAP_RESAMPLES, x.size))].mean(axis=1)
    mean_y = y[rng.integers(0, y.size, (_BOOTSTRAP_RESAMPLES, y.size))].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(mean_y - mean_x, [tail, 1 - tail])
    return float(low), float(high)


def _large(n_a: int, n_b: int) -> bool:
    """Whether both groups have enough seeds for Welch's test and the bootstrap."""
    return min(n_a, n_b) >= ASYMPTOTIC_MIN_SEEDS


def difference_interval(
    a: Sequence[float], b: Sequence[float], confidence: float = 0.95
) -> dict[str, float | str]:
    """The interval of ``mean(b) - mean(a)`` suited to n: ``{"low", "high", "method"}``.

    Welch's t interval below :data:`ASYMPTOTIC_MIN_SEEDS` seeds in a group, the percentile
    bootstrap from there (NaN values are left out first).

    Example:
        >>> difference_interval([1, 2, 3], [4, 5, 6])["method"]
        'Welch t'
        >>> difference_interval([1, 1, 1], [0, 0, 0])["method"]  # no spread: no interval
        'none (no seed spread)'
    """
    check_float("confidence", confidence, minimum=0.0, maximum=1.0, inclusive=False)
    x, y = defined_values(a), defined_values(b)
    if x.size < 2 or y.size < 2:
        return {"low": math.nan, "high": math.nan, "method": "none (n < 2)"}
    if _no_spread(x) and _no_spread(y):
        return {"low": math.nan, "high": math.nan, "method": "none (no seed spread)"}
    if _large(x.size, y.size):
        low, high = bootstrap_interval(x, y, confidence)
        return {"low": low, "high": high, "method": "bootstrap"}
    low, high = welch_interval(x, y, confidence)
    return {"low": low, "high": high, "method": "Welch t"}


def separation(a: Sequence[float], b: Sequence[float]) -> int:
    """+1 when every value of ``b`` exceeds every value of ``a``, -1 when every one is below,
    else 0 (NaN values left out; 0 when a group is empty).

    Example:
        >>> separation([0.1, 0.2], [0.3, 0.5]), separation([1, 1], [1, 1])
        (1, 0)
    """
    x, y = defined_values(a), defined_values(b)
    if not x.size or not y.size:
        return 0
    if y.min() > x.max():
        return 1
    if y.max() < x.min():
        return -1
    return 0


def compare_seeds(
    a: Sequence[float],
    b: Sequence[float],
    kind: OutcomeKind = "graded",
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Compare two groups of seeds, ``b`` against ``a``, with the test suited to n.

    Undefined values (NaN) are left out of both groups first: an outcome that cannot be
    measured is never counted as "no". An infinite value is refused (ParameterError).

    Args:
        a: One value per seed of the first group.
        b: One value per seed of the second group.
        kind: ``"graded"`` (exact permutation below :data:`ASYMPTOTIC_MIN_SEEDS` seeds in a
            group, Welch from there) or ``"yes/no"`` (Fisher's exact test on the counts of yes).
        confidence: Level of the interval of the difference.

    Returns:
        ``diff`` (``mean(b) - mean(a)``), ``ci_low, ci_high, ci_method``
        (:func:`difference_interval`), ``p`` (NaN with fewer than 2 seeds in a group),
        ``test`` (``"exact permutation"``, ``"Welch"``, ``"Fisher exact"``), ``p_floor`` (the
        smallest p that test can give at these n; NaN for Welch), ``separated``
        (:func:`separation`), ``n_a, n_b`` (the defined seeds).

    Example:
        >>> result = compare_seeds([0, 0, 0], [1, 1, 1], kind="yes/no")
        >>> result["diff"], round(result["p"], 12), result["test"], result["p_floor"]
        (1.0, 0.1, 'Fisher exact', 0.1)
        >>> compare_seeds([0.5, 0.6, float("nan")], [0.9, 0.8, 0.7])["n_a"]
        2
    """
    check_option("kind", kind, OUTCOME_KINDS)
    x, y = _finite_values("a", a), _finite_values("b", b)
    out: dict[str, Any] = {
        "diff": float(y.mean() - x.mean()) if x.size and y.size else math.nan,
        "n_a": int(x.size),
        "n_b": int(y.size),
        "separated": separation(x, y),
    }
    interval = difference_interval(x, y, confidence)
    out.update(ci_low=interval["low"], ci_high=interval["high"], ci_method=interval["method"])
    if x.size < 2 or y.size < 2:
        return {**out, "p": math.nan, "test": "none (n < 2)", "p_floor": math.nan}
    if kind == "yes/no":
        return {
            **out,
            "p": fisher_p(x, y),
            "test": "Fisher exact",
            "p_floor": smallest_p(x.size, y.size),
        }
    if _no_spread(x) and _no_spread(y):  # exact at any n (welch_test's constant groups)
        floor = smallest_p(x.size, y.size)
        return {**out, "p": welch_test(y, x)[1], "test": "exact permutation", "p_floor": floor}
    if _large(x.size, y.size):
        return {**out, "p": welch_test(y, x)[1], "test": "Welch", "p_floor": math.nan}
    drawn = math.comb(x.size + y.size, x.size) > _EXACT_LIMIT
    test = f"permutation ({_EXACT_LIMIT:,} random splits)" if drawn else "exact permutation"
    floor = permutation_floor(x.size, y.size)
    return {**out, "p": exact_permutation_p(x, y), "test": test, "p_floor": floor}


# ----------------------------------------------------------------------------- families


def beyond_seed_spread(p_values: Sequence[float], alpha: float = 0.05) -> list[bool | None]:
    """The "beyond the seed spread" rule for the comparisons of one Findings block.

    The p-values are Holm-corrected together (NaN ones, comparisons that could not be made,
    are left out of the family); a comparison is beyond the spread when its corrected p is
    below ``alpha`` (None where it has no p).

    Args:
        p_values: One p per comparison of the block (:func:`compare_seeds`).
        alpha: Family-wise error rate of the block.

    Returns:
        One True / False / None per comparison, in order.

    Example:
        >>> beyond_seed_spread([0.001, 0.03, 0.2, float("nan")])  # Holm: 0.003, 0.06, 0.2
        [True, False, False, None]
    """
    check_float("alpha", alpha, minimum=0.0, maximum=1.0)
    return [None if a is None else bool(a < alpha) for a in holm_block(p_values)]


def holm_block(p_values: Sequence[float]) -> list[float | None]:
    """Holm-adjusted p-values of a block, None where the raw p is NaN (left out of the family).

    Example:
        >>> holm_block([0.01, 0.04, float("nan")])
        [0.02, 0.04, None]
    """
    p = np.asarray(p_values, dtype=float)
    finite = ~np.isnan(p)
    out: list[float | None] = [None] * p.size
    if finite.any():
        for i, value in zip(np.flatnonzero(finite), holm(p[finite]), strict=True):
            out[int(i)] = float(value)
    return out


# ----------------------------------------------------------------------------- what n can show


def seeds_for_floor(alpha: float = 0.05, n_comparisons: int = 1) -> int:
    """The fewest seeds per group whose exact-test floor (:func:`smallest_p`, n vs n) is below
    ``alpha / n_comparisons``: the strictest step of Holm over the block, so a complete
    separation at that n survives Holm whatever the other comparisons give.

    Example:
        >>> seeds_for_floor(0.05), seeds_for_floor(0.05, 13)
        (4, 6)
    """
    check_float("alpha", alpha, minimum=0.0, maximum=1.0, inclusive=False)
    level = alpha / max(1, n_comparisons)
    n = 2
    while smallest_p(n, n) >= level:
        n += 1
    return n


def seeds_for_power(diff: float, std: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """Seeds per group a two-sided two-sample t test at level ``alpha`` needs to detect a
    difference ``diff`` with probability ``power``, for a common seed std ``std`` (noncentral
    t). 2 when ``std`` is 0 and ``diff`` is not; inf when ``diff`` is 0 or NaN, or more than
    100,000 seeds would be needed.

    Example:
        >>> seeds_for_power(1.0, 1.0)  # Cohen's d = 1: 17 per group, the textbook value
        17
    """
    if not math.isfinite(diff) or diff == 0 or math.isnan(std):
        return math.inf
    if std == 0:
        return 2
    effect = abs(diff) / std

    def achieved(n: int) -> float:
        df = 2 * n - 2
        critical = scipy_stats.t.ppf(1 - alpha / 2, df)
        shift = effect * math.sqrt(n / 2)
        return float(
            scipy_stats.nct.sf(critical, df, shift) + scipy_stats.nct.cdf(-critical, df, shift)
        )

    low, high = 2, 2
    while achieved(high) < power:  # double, then bisect: the power grows with n
        low, high = high, high * 2
        if high > _MAX_SEEDS:
            return math.inf
    while low < high:
        middle = (low + high) // 2
        low, high = (middle + 1, high) if achieved(middle) < power else (low, middle)
    return high


def seeds_to_settle(
    diff: float,
    std_a: float,
    std_b: float,
    alpha: float = 0.05,
    n_comparisons: int = 1,
    power: float = 0.8,
) -> float:
    """Seeds per head count that would settle an open comparison: the n at which a two-sample
    t test reaches ``power`` for the observed difference and pooled seed std at level
    ``alpha / n_comparisons`` (Holm's strictest step), and, where that n is below
    :data:`ASYMPTOTIC_MIN_SEEDS` (the exact test would be used), at least the n whose exact
    floor is below that level. inf when nothing differs (``diff`` 0).

    Example:
        >>> seeds_to_settle(1.0, 0.0, 0.0, 0.05, 13)  # a complete separation: the floor decides
        6
        >>> seeds_to_settle(0.1, 0.1, 0.1, 0.05, 1)
        17
    """
    spread = [s for s in (std_a, std_b) if not math.isnan(s)]
    if not spread:
        return math.inf
    pooled = math.sqrt(sum(s * s for s in spread) / len(spread))
    n = seeds_for_power(diff, pooled, alpha / max(1, n_comparisons), power)
    if n < ASYMPTOTIC_MIN_SEEDS:
        n = max(n, seeds_for_floor(alpha, n_comparisons))
    return n


# ----------------------------------------------------------------------------- one group


def mean_interval(
    values: Sequence[float], bounds: tuple[float, float] = (0.0, 1.0)
) -> tuple[float, float]:
    """Student's t interval of a mean at :data:`CONFIDENCE`, clipped to ``bounds`` (accuracy
    and the division index lie in [0, 1]; the t interval does not know it); NaN below 2
    values (NaN values are left out).

    Example:
        >>> [round(v, 3) for v in mean_interval([0.5, 0.6, 0.7])]
        [0.352, 0.848]
    """
    x = defined_values(values)
    if x.size < 2:
        return math.nan, math.nan
    half = scipy_stats.t.ppf(0.5 + CONFIDENCE / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return float(max(bounds[0], x.mean() - half)), float(min(bounds[1], x.mean() + half))
