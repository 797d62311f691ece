"""Every null of the specialization test in words: the one description that tables, figures,
notes and reports reuse, so that no text drifts from what the code tests against.

Example:
    >>> SAME_FUNCTION_NULL.split(":")[0]
    'same-function heads'
"""

from __future__ import annotations

__all__ = ["HEADS_SHUFFLED_NULL", "ROLE_NULLS", "SAME_FUNCTION_NULL"]

SAME_FUNCTION_NULL = (
    "same-function heads: noisy copies of the model (its accuracy kept), compared on split "
    "halves of the sequences"
)
"""The division of labour's null (:mod:`~mhainterp.specialization.whom.division`): an axis is
"divided" when the index's interval lies above this null's upper ``1 - alpha`` quantile
(``null_high``), the number the tables print beside the index."""

HEADS_SHUFFLED_NULL = "heads shuffled across seeds (each role's marginals kept)"
"""Cross-seed consistency's null (:mod:`~mhainterp.specialization.seeds.consistency`)."""

ROLE_NULLS = (
    "keys permuted within the attention mask, and the same architecture untrained (matched seeds)"
)
"""The role scores' nulls (:mod:`~mhainterp.specialization.where.nulls`): where a head looks."""
