"""Redundancy: pairs of heads that look alike *and* stand in for each other.

Two heads are **redundant** when both hold:

1. they are similar: ``head_similarity`` (:mod:`mhainterp.similarity`, default ``"js"``, the
   Jensen-Shannon similarity of their attention) is at least ``min_similarity``;
2. they back each other up: in :func:`mhainterp.ablation.pairwise_ablation` (loss), removing
   both hurts clearly (``damage_joint >= min_joint_damage``) and mostly beyond the sum of the
   two single removals: ``backup = interaction / damage_joint >= backup_ratio`` with
   ``interaction = damage_joint - (damage_a + damage_b)``. For exact copies ``backup`` is near
   1: either copy alone does the job, so each single removal costs almost nothing.

Similar heads that do not back each other up (e.g. two heads that each carry half of a signal)
are *not* redundant; heads that back each other up with different patterns are not either
(they are then two routes to the answer, not copies). Dead heads are never redundant.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from mhainterp.ablation import pairwise_ablation
from mhainterp.model import HookedMHATransformer
from mhainterp.similarity import head_similarity
from mhainterp.tasks import Batch

__all__ = ["REDUNDANCY_COLUMNS", "redundancy_pairs", "redundant_partners"]

REDUNDANCY_COLUMNS = [
    "head_a",
    "head_b",
    "similarity",
    "damage_a",
    "damage_b",
    "damage_joint",
    "interaction",
    "backup",
    "similar",
    "backs_up",
    "redundant",
]


def redundancy_pairs(
    model: HookedMHATransformer,
    batch: Batch,
    *,
    method: str = "mean",
    similarity_method: str = "js",
    min_similarity: float = 0.9,
    backup_ratio: float = 0.5,
    min_joint_damage: float = 0.005,
    dead: Iterable[str] = (),
    similarity: pd.DataFrame | None = None,
    pairwise: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Every pair of heads with its similarity, pairwise-ablation backup and verdict.

    Args:
        model: The model.
        batch: Evaluation batch (and ablation reference).
        method: Ablation method for :func:`~mhainterp.ablation.pairwise_ablation`.
        similarity_method: A :func:`~mhainterp.similarity.head_similarity` method.
        min_similarity: Similarity at or above which two heads count as similar.
        backup_ratio: ``interaction / damage_joint`` at or above which they back each other up.
        min_joint_damage: Loss increase (nats) removing both must cause at least.
        dead: Labels of dead heads (never redundant).
        similarity: A precomputed square similarity matrix (skips computing it).
        pairwise: A precomputed ``pairwise_ablation`` table (skips computing it).

    Returns:
        One row per unordered pair (layer-major), columns :data:`REDUNDANCY_COLUMNS`; damages
        are loss increases. Only pairs of live heads that each have a similar partner are
        ablated (other pairs cannot be redundant); the rest have NaN damages. Empty (with those
        columns) for a one-head model.

    Example:
        >>> from mhainterp.handbuilt import handbuilt_model
        >>> from mhainterp.tasks import get_task
        >>> batch = get_task("previous_token").eval_batch(128)
        >>> pairs = redundancy_pairs(handbuilt_model(["previous", "previous"], d_head=18), batch)
        >>> pairs[["head_a", "head_b", "redundant"]].values.tolist()
        [['L0H0', 'L0H1', True]]
    """
    if len(model.head_labels) < 2:
        return pd.DataFrame(columns=REDUNDANCY_COLUMNS)
    if similarity is None:
        similarity = head_similarity(model, batch, method=similarity_method)
    dead = set(dead)
    labels = list(similarity.index)
    pairs = [(a, b) for i, a in enumerate(labels) for b in labels[i + 1 :]]
    if pairwise is None:
        pairwise = _similar_pairwise(model, batch, method, similarity, pairs, min_similarity, dead)
    loss = pairwise[pairwise["metric"] == "loss"].set_index(["head_a", "head_b"])
    rows = []
    for a, b in pairs:
        sim = float(similarity.loc[a, b])
        r = loss.loc[(a, b)] if (a, b) in loss.index else None
        joint = float(r["damage_joint"]) if r is not None else np.nan
        interaction = float(r["interaction"]) if r is not None else np.nan
        backup = interaction / joint if joint > 0 else np.nan
        similar = sim >= min_similarity
        backs_up = bool(joint >= min_joint_damage and backup >= backup_ratio)
        rows.append(
            {
                "head_a": a,
                "head_b": b,
                "similarity": sim,
                "damage_a": float(r["damage_a"]) if r is not None else np.nan,
                "damage_b": float(r["damage_b"]) if r is not None else np.nan,
                "damage_joint": joint,
                "interaction": interaction,
                "backup": backup,
                "similar": similar,
                "backs_up": backs_up,
                "redundant": bool(similar and backs_up and a not in dead and b not in dead),
            }
        )
    return pd.DataFrame(rows, columns=REDUNDANCY_COLUMNS)


def _similar_pairwise(
    model: HookedMHATransformer,
    batch: Batch,
    method: str,
    similarity: pd.DataFrame,
    pairs: list[tuple[str, str]],
    min_similarity: float,
    dead: set[str],
) -> pd.DataFrame:
    """Pairwise ablation among the live heads that have a similar partner (only those pairs
    can be redundant, and ablating every pair of a 16-head model would take 120 passes)."""
    heads = sorted(
        {h for a, b in pairs if similarity.loc[a, b] >= min_similarity for h in (a, b)} - dead,
        key=list(similarity.index).index,
    )
    if len(heads) < 2:
        return pd.DataFrame(columns=["head_a", "head_b", "metric"])
    return pairwise_ablation(model, batch, method, heads=heads)


def redundant_partners(pairs: pd.DataFrame) -> dict[str, list[str]]:
    """Head label -> the heads it is redundant with (only heads that have some).

    Example:
        >>> pairs = pd.DataFrame({"head_a": ["L0H0", "L0H0"], "head_b": ["L0H1", "L0H2"],
        ...                       "redundant": [True, False]})
        >>> redundant_partners(pairs)
        {'L0H0': ['L0H1'], 'L0H1': ['L0H0']}
    """
    partners: dict[str, list[str]] = {}
    for a, b, redundant in zip(pairs["head_a"], pairs["head_b"], pairs["redundant"], strict=True):
        if bool(redundant):
            partners.setdefault(a, []).append(b)
            partners.setdefault(b, []).append(a)
    return partners
