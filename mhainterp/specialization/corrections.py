"""Multiple-comparison corrections: Holm (family-wise error) and Benjamini-Hochberg (false
discovery rate), written out so their steps can be read and checked against hand computations.

Both take raw p-values and return *adjusted* p-values: reject hypothesis ``i`` at level ``alpha``
exactly when ``adjusted[i] < alpha`` (equivalently ``<=``; ties at ``alpha`` are measure-zero).
NaN entries are not part of the family: they stay NaN and do not count towards ``m``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["CORRECTIONS", "adjust_pvalues", "benjamini_hochberg", "holm"]

CORRECTIONS = ("holm", "bh", "none")
"""Allowed ``correction`` names: Holm step-down, Benjamini-Hochberg step-up, or none."""


def _as_pvalues(p_values: Sequence[float] | np.ndarray) -> np.ndarray:
    p = np.asarray(p_values, dtype=float)
    if p.ndim != 1:
        raise ValueError(f"p_values must be one-dimensional, got shape {p.shape}")
    finite = p[~np.isnan(p)]
    if ((finite < 0) | (finite > 1)).any():
        raise ValueError(
            f"p_values must lie in [0, 1] (or be NaN), got {finite.min()}..{finite.max()}"
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
    p = _as_pvalues(p_values)
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


def adjust_pvalues(p_values: Sequence[float] | np.ndarray, method: str = "holm") -> np.ndarray:
    """Adjust p-values for multiple comparisons with ``method`` (one of :data:`CORRECTIONS`).

    Example:
        >>> adjust_pvalues([0.2, 0.01], "none").tolist()
        [0.2, 0.01]
    """
    if method == "holm":
        return holm(p_values)
    if method == "bh":
        return benjamini_hochberg(p_values)
    if method == "none":
        return _as_pvalues(p_values).copy()
    raise ValueError(f"correction={method!r} is invalid; allowed: {', '.join(CORRECTIONS)}")


def correction_name(method: str) -> str:
    """How a correction is named in generated text ("Holm", "Benjamini-Hochberg", "no")."""
    return {"holm": "Holm", "bh": "Benjamini-Hochberg", "none": "no"}.get(method, method)
