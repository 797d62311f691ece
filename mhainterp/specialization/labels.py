"""One label per head, from the evidence: dead > redundant > a role > unspecialized.

- ``"dead"``: the head writes (almost) nothing into the residual stream
  (``output_ratio < dead_tol``);
- ``"redundant"``: it is redundant with another live head (:mod:`.redundancy`);
- a role name (e.g. ``"previous"``): its best significant role (largest effect among the roles
  with corrected ``p < alpha`` against both nulls and ``effect >= min_effect``), unless the head
  **mixes** roles: a second significant role, neither nested in nor containing the first (on
  the data, restricted to visible keys), has at least ``mix_ratio`` of the first one's effect.
  A head that splits its attention between two relations holds neither as a distinct role;
- ``"unspecialized"``: none of the above (mixing heads included; ``mixed_roles`` says which).

Nesting matters because some templates contain others (``same_token_before`` is inside the
generic ``same_token`` of a bidirectional model): a head on the inner one scores high on both,
which is not mixing.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import pandas as pd

from mhainterp.specialization.corrections import adjust_pvalues
from mhainterp.specialization.roles import DESCRIPTIVE_ROLES
from mhainterp.specialization.settings import SpecializationSettings
from mhainterp.tasks import Task

__all__ = ["LABELS_OTHER", "label_heads", "mixed_roles", "role_targets"]

LABELS_OTHER = ("unspecialized", "redundant", "dead")
"""Labels that are not roles."""


def role_targets(task: Task) -> dict[str, str]:
    """Which target each of the task's relations solves: relation ``i`` -> target ``i`` when
    there are as many relations as targets (``multi_relation``), every relation -> the target
    of a single-target task, else nothing.

    Example:
        >>> from mhainterp.tasks import get_task
        >>> role_targets(get_task("multi_relation"))["same_token_before"]
        'count_previous'
    """
    relations = task.relation_names
    targets = task.target_names
    if len(targets) == 1:
        return {rel: targets[0] for rel in relations}
    if len(relations) == len(targets):
        return dict(zip(relations, targets, strict=True))
    return {}


def mixed_roles(
    significant: pd.DataFrame, nested: Collection[tuple[str, str]], mix_ratio: float
) -> list[str]:
    """The roles a head mixes (its best one first), or ``[]`` when it has one distinct role.

    Args:
        significant: The head's significant roles (``role, effect``), any order.
        nested: ``(inner, outer)`` pairs of roles whose templates nest on the data.
        mix_ratio: A second role counts when its effect is at least this x the best one's.

    Example:
        >>> rows = pd.DataFrame({"role": ["previous", "mirror"], "effect": [0.55, 0.5]})
        >>> mixed_roles(rows, nested=set(), mix_ratio=0.5)
        ['previous', 'mirror']
    """
    if len(significant) < 2:
        return []
    ordered = significant.sort_values("effect", ascending=False, kind="stable")
    best, best_effect = ordered["role"].iloc[0], float(ordered["effect"].iloc[0])
    others = [
        role
        for role, effect in zip(ordered["role"].iloc[1:], ordered["effect"].iloc[1:], strict=True)
        if (role, best) not in nested
        and (best, role) not in nested
        and float(effect) >= mix_ratio * best_effect
    ]
    return [best, *others] if others else []


def _best_rows(roles: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per head: the row of its largest-effect testable role, and of its best significant one."""
    testable = roles[~roles["role"].isin(DESCRIPTIVE_ROLES)].copy()
    testable["_effect"] = testable["effect"].fillna(-math.inf)
    ordered = testable.sort_values("_effect", ascending=False, kind="stable")
    top = ordered.drop_duplicates("head_label").set_index("head_label")
    significant = ordered[ordered["significant"].astype(bool)]
    best = significant.drop_duplicates("head_label").set_index("head_label")
    return top, best


def _support(
    name: str,
    role: str,
    causal: pd.Series,
    damage: pd.Series,
    targets: dict[str, str],
    min_damage: float,
) -> bool | None:
    """Does ablation back a role head? None for heads without a role label."""
    if name in LABELS_OTHER:
        return None
    target = targets.get(role)
    if target is None:
        return False
    hurts = float(damage.get(target, 0.0)) >= min_damage
    if len(damage) > 1:  # several targets: the role's target must be the one hurt most
        return bool(hurts and causal["causal_target"] == target)
    return bool(hurts)


def label_heads(
    roles: pd.DataFrame,
    output_ratio: dict[str, float],
    partners: dict[str, list[str]],
    damage: pd.DataFrame,
    causal_heads: pd.DataFrame,
    settings: SpecializationSettings,
    targets: dict[str, str],
    nested: Collection[tuple[str, str]] = (),
) -> pd.DataFrame:
    """Label each head of one run and collect its evidence.

    Args:
        roles: The run's role table with ``p_adj`` and ``significant``.
        output_ratio: Head label -> RMS of its write / RMS of the residual stream.
        partners: Head label -> heads it is redundant with.
        damage: Tidy head x target damage (``head_label, target, damage``).
        causal_heads: Per head: ``head_label, total_damage, loss_increase, causal_target,
            selectivity, p_selectivity`` (selectivity NaN on a single-target task).
        settings: Thresholds.
        targets: Relation name -> the target it solves (:func:`role_targets`).
        nested: ``(inner, outer)`` role pairs whose templates nest (see the module docstring).

    Returns:
        One row per head with ``layer, head, head_label, label, role, role_effect,
        role_p_adj, roles, mixed_roles, top_role, top_score, top_effect, top_p_adj,
        output_ratio, dead, redundant_with, total_damage, loss_increase, causal_target,
        causal_selectivity, causal_p_adj, causal_specialized, causal_support``; ``role`` is the
        distinct role ("" when none), ``roles`` every significant one, ``top_*`` the largest
        effect whether significant or not, ``causal_support`` whether removing a role head
        hurts its relation's target most (None for heads without a role).
    """
    top, best = _best_rows(roles)
    causal = causal_heads.set_index("head_label")
    causal["causal_p_adj"] = adjust_pvalues(
        causal["p_selectivity"].to_numpy(float), settings.correction
    )
    by_target = damage.pivot(index="head_label", columns="target", values="damage")
    records = []
    for label in dict.fromkeys(roles["head_label"]):
        layer, head = (int(x) for x in label[1:].split("H"))
        dead = output_ratio[label] < settings.dead_tol
        partner = [p for p in partners.get(label, []) if output_ratio[p] >= settings.dead_tol]
        significant = roles[(roles["head_label"] == label) & roles["significant"].astype(bool)]
        mixed = mixed_roles(significant, nested, settings.mix_ratio)
        role = best.loc[label, "role"] if label in best.index and not mixed else ""
        if dead:
            name = "dead"
        elif partner:
            name = "redundant"
        else:
            name = role or "unspecialized"
        c = causal.loc[label]
        selectivity, p_adj = float(c["selectivity"]), float(c["causal_p_adj"])
        has_top = label in top.index
        records.append(
            {
                "layer": layer,
                "head": head,
                "head_label": label,
                "label": name,
                "role": role,
                "role_effect": float(best.loc[label, "effect"]) if role else math.nan,
                "role_p_adj": float(best.loc[label, "p_adj"]) if role else math.nan,
                "roles": ";".join(significant["role"]),
                "mixed_roles": "+".join(mixed),
                "top_role": top.loc[label, "role"] if has_top else "",
                "top_score": float(top.loc[label, "score"]) if has_top else math.nan,
                "top_effect": float(top.loc[label, "effect"]) if has_top else math.nan,
                "top_p_adj": float(top.loc[label, "p_adj"]) if has_top else math.nan,
                "output_ratio": float(output_ratio[label]),
                "dead": bool(dead),
                "redundant_with": ";".join(partner),
                "total_damage": float(c["total_damage"]),
                "loss_increase": float(c["loss_increase"]),
                "causal_target": c["causal_target"],
                "causal_selectivity": selectivity,
                "causal_p_adj": p_adj,
                "causal_specialized": bool(
                    not math.isnan(selectivity)
                    and p_adj < settings.alpha
                    and selectivity >= settings.min_selectivity
                ),
                "causal_support": _support(
                    name, role, c, by_target.loc[label], targets, settings.min_damage
                ),
            }
        )
    return pd.DataFrame(records)
