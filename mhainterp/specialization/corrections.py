"""Multiple-comparison corrections by name: ``adjust_pvalues(p, "holm" | "bh" | "none")``.

The adjustments themselves (Holm for the family-wise error, Benjamini-Hochberg for the false
discovery rate) live in :mod:`mhainterp.stats`, the home of the toolkit's statistics, written
out so their steps can be read and checked against hand computations. Reject hypothesis ``i`` at
level ``alpha`` exactly when ``adjusted[i] < alpha``; NaN entries are not part of the family.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mhainterp.stats import as_pvalues, benjamini_hochberg, holm
from mhainterp.validation import check_option

__all__ = ["CORRECTIONS", "adjust_pvalues", "correction_name"]

CORRECTIONS = ("holm", "bh", "none")
"""Allowed ``correction`` names: Holm step-down, Benjamini-Hochberg step-up, or none."""


def adjust_pvalues(p_values: Sequence[float] | np.ndarray, method: str = "holm") -> np.ndarray:
    """Adjust p-values for multiple comparisons with ``method`` (one of :data:`CORRECTIONS`).

    Example:
        >>> adjust_pvalues([0.2, 0.01], "none").tolist()
        [0.2, 0.01]
    """
    check_option("correction", method, CORRECTIONS)
    if method == "holm":
        return holm(p_values)
    if method == "bh":
        return benjamini_hochberg(p_values)
    return as_pvalues(p_values).copy()


def correction_name(method: str) -> str:
    """How a correction is named in generated text ("Holm", "Benjamini-Hochberg", "no")."""
    return {"holm": "Holm", "bh": "Benjamini-Hochberg", "none": "no"}.get(method, method)
