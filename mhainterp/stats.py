"""Small, honest statistics for comparing groups of seeds.

With 3 seeds nothing is certain; these functions report what the data allow and never hide n.

- :func:`compare_seeds` is the one comparison of two groups of seeds: Welch's unequal-variance
  t-test for graded outcomes (an exact permutation test where Welch is undefined: both groups
  without spread), Fisher's exact test for yes/no outcomes. It never returns p = 0.
- :func:`beyond_seed_spread` is the rule every "beyond the seed spread" sentence uses: the
  comparisons of one Findings block are Holm-corrected together, and a difference is beyond the
  spread when its corrected p is below ``alpha``. Under no true difference the rate of false
  "beyond" calls is at most ``alpha`` (tests/test_seed_stats.py measures it by simulation).
- :func:`smallest_p` says what ``n`` seeds can show at all: the smallest p an exact test of
  ``n_a`` vs ``n_b`` seeds can reach (0.1 for 3 vs 3, so a yes/no outcome over 3 seeds per
  head count can never be significant at 0.05).

No bootstrap interval over seeds: 3 values have 10 distinct resamples, and such an interval
excludes 0 in about a fifth of null cases.

Example:
    >>> compare_seeds([1.0, 1.0, 1.0], [0.0, 0.0, 0.0])["p"]  # exact: 2 of the 20 splits
    0.1
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Sequence
from typing import Literal

import numpy as np
from scipy import stats as scipy_stats

from mhainterp.validation import check_float, check_option, invalid

__all__ = [
    "OUTCOME_KINDS",
    "POWER_NOTE_MARK",
    "as_pvalues",
    "benjamini_hochberg",
    "holm",
    "holm_block",
    "beyond_seed_spread",
    "compare_seeds",
    "describe",
    "exact_permutation_p",
    "fisher_p",
    "seed_power_note",
    "smallest_p",
    "welch_test",
]

OUTCOME_KINDS = ("graded", "yes/no")
"""What a per-seed outcome is: a number (Welch) or a yes/no (Fisher's exact test)."""

_EXACT_LIMIT = 20_000
"""Above this many splits the permutation test draws this many at random instead."""


# ----------------------------------------------------------------------------- corrections


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


# ----------------------------------------------------------------------------- seeds


def describe(values: Sequence[float]) -> dict[str, float]:
    """``{"mean", "std", "n"}`` with the sample std (ddof=1; NaN when n < 2)."""
    x = np.asarray(values, dtype=float)
    return {
        "mean": float(x.mean()) if x.size else math.nan,
        "std": float(x.std(ddof=1)) if x.size >= 2 else math.nan,
        "n": int(x.size),
    }


def exact_permutation_p(a: Sequence[float], b: Sequence[float], seed: int = 0) -> float:
    """Two-sided permutation p of ``|mean(a) - mean(b)|`` over every split of the pooled values
    into groups of ``len(a)`` and ``len(b)`` (random splits when there are too many).

    The smallest value it can take is ``2 / C(n_a + n_b, n_a)`` (for distinct groups), never 0.

    Example:
        >>> exact_permutation_p([1, 1, 1], [0, 0, 0])
        0.1
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    pooled = np.concatenate([a, b])
    n_a, n = a.size, pooled.size
    observed = abs(a.mean() - b.mean())
    total = pooled.sum()
    if math.comb(n, n_a) <= _EXACT_LIMIT:
        splits = np.array(list(itertools.combinations(range(n), n_a)))
        sums = pooled[splits].sum(axis=1)
    else:
        rng = np.random.default_rng(seed)
        draws = np.argsort(rng.random((_EXACT_LIMIT, n)), axis=1)[:, :n_a]
        sums = np.concatenate([[a.sum()], pooled[draws].sum(axis=1)])
    diffs = np.abs(sums / n_a - (total - sums) / (n - n_a))
    return float(np.mean(diffs >= observed - 1e-12 * max(1.0, observed)))


def welch_test(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Welch's unequal-variance t-test: ``(t, two-sided p)``; NaN when either n < 2.

    When both groups have zero variance Welch's t is undefined (scipy would say p = 0 for any
    difference): the p is then the exact permutation p (:func:`exact_permutation_p`), 1.0 for
    equal means, ``2 / C(n_a + n_b, n_a)`` for different ones, and t is ±inf (0 if equal).

    Example:
        >>> welch_test([1.0, 1.0, 1.0], [1.0, 1.0, 1.0])
        (0.0, 1.0)
        >>> welch_test([2.0, 2.0, 2.0], [1.0, 1.0, 1.0])
        (inf, 0.1)
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size < 2 or b.size < 2:
        return math.nan, math.nan
    if a.std() == 0 and b.std() == 0:
        if a.mean() == b.mean():
            return 0.0, 1.0
        return math.copysign(math.inf, a.mean() - b.mean()), exact_permutation_p(a, b)
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


def compare_seeds(
    a: Sequence[float],
    b: Sequence[float],
    kind: Literal["graded", "yes/no"] = "graded",
) -> dict[str, float | str]:
    """Compare two groups of seeds: ``{"diff", "p", "test"}`` with ``diff = mean(b) - mean(a)``.

    Args:
        a: One value per seed of the first group.
        b: One value per seed of the second group.
        kind: ``"graded"`` (Welch; exact permutation when neither group varies) or
            ``"yes/no"`` (Fisher's exact test on the counts of yes).

    Returns:
        ``diff``, ``p`` (NaN with fewer than 2 seeds in a group) and ``test`` (the name of the
        test used: ``"Welch"``, ``"exact permutation"`` or ``"Fisher exact"``).

    Example:
        >>> result = compare_seeds([0, 0, 0], [1, 1, 1], kind="yes/no")
        >>> result["diff"], round(result["p"], 12), result["test"]
        (1.0, 0.1, 'Fisher exact')
    """
    check_option("kind", kind, OUTCOME_KINDS)
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    diff = float(y.mean() - x.mean()) if x.size and y.size else math.nan
    if x.size < 2 or y.size < 2:
        return {"diff": diff, "p": math.nan, "test": "none (n < 2)"}
    if kind == "yes/no":
        return {"diff": diff, "p": fisher_p(x, y), "test": "Fisher exact"}
    exact = x.std() == 0 and y.std() == 0
    return {
        "diff": diff,
        "p": welch_test(y, x)[1],
        "test": "exact permutation" if exact else "Welch",
    }


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


def smallest_p(n_a: int, n_b: int) -> float:
    """The smallest two-sided p an exact test of ``n_a`` vs ``n_b`` seeds can reach:
    ``2 / C(n_a + n_b, n_a)`` (the two most extreme splits of the pooled seeds).

    Example:
        >>> smallest_p(3, 3), smallest_p(5, 5)
        (0.1, 0.007936507936507936)
    """
    return min(1.0, 2.0 / math.comb(n_a + n_b, n_a))


POWER_NOTE_MARK = " per head count: "
"""In every :func:`seed_power_note` sentence, right after ``n seed(s)``: how a reader that
states it once (the report) knows it among other notes."""


def seed_power_note(n_seeds: int, alpha: float = 0.05, n_comparisons: int = 1) -> str:
    """One sentence on what ``n_seeds`` seeds per group can and cannot show.

    Example:
        >>> seed_power_note(3)[:60]
        '3 seeds per head count: an exact test of 3 vs 3 seeds cannot'
    """
    if n_seeds < 2:
        return (
            f"{n_seeds} seed{POWER_NOTE_MARK}no seed spread is known, so no difference between "
            "head counts can be tested; rerun with 3 or more seeds."
        )
    floor = smallest_p(n_seeds, n_seeds)
    reach = "cannot" if floor >= alpha else "can"
    text = (
        f"{n_seeds} seeds{POWER_NOTE_MARK}an exact test of {n_seeds} vs {n_seeds} seeds "
        f"{reach} reach p < {alpha:g} (its smallest p is {floor:.2g}), so a yes/no outcome "
        f"(a seed divides the work or not) {reach} differ significantly between head counts"
    )
    if n_comparisons > 1:
        text += (
            f"; with Holm over {n_comparisons} comparisons the smallest p needs to be below "
            f"{alpha / n_comparisons:.2g}"
        )
    return text + (
        ". Graded outcomes use Welch's test, which assumes the seed spread is normal; a "
        "difference it does not find is not shown to be absent."
    )
